"""docs/openapi.json is generated from the code; this fails when the two drift apart."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.support.timing import scaled
from wsfleet.protocol_specs import PROTOCOL_NAMES

REPO_ROOT = Path(__file__).resolve().parents[3]
SCRIPT = REPO_ROOT / "scripts" / "openapi.py"
COMMITTED = REPO_ROOT / "docs" / "openapi.json"


def load_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("openapi_script", SCRIPT)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def document() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(COMMITTED.read_text())
    return loaded


def test_the_committed_document_matches_the_code() -> None:
    assert COMMITTED.read_text() == load_script().render(), (
        "docs/openapi.json is out of date: run .venv/bin/python scripts/openapi.py"
    )


def test_the_document_lists_every_route_with_the_answers_it_gives(
    document: dict[str, Any],
) -> None:
    answers = {
        (path, method): sorted(operation["responses"])
        for path, operations in document["paths"].items()
        for method, operation in operations.items()
    }
    assert answers == {
        ("/connections", "post"): ["200", "201", "400", "409", "413"],
        ("/connections", "get"): ["200", "400"],
        ("/connections/{connection_id}", "get"): ["200", "400", "404"],
        ("/connections/{connection_id}", "delete"): ["202", "400", "404"],
    }
    assert document["info"]["title"] == "websocket-fleet router"


def test_the_start_body_schema_is_strict(document: dict[str, Any]) -> None:
    schema = document["components"]["schemas"]["StartRequest"]
    assert schema["additionalProperties"] is False
    assert schema["required"] == ["ws_url"]
    assert set(schema["properties"]) == {"connection_id", "ws_url", "metadata", "auth", "protocol"}
    components = document["components"]["schemas"]
    assert components["AuthRef"]["additionalProperties"] is False
    assert components["AuthRef"]["required"] == ["secret"]
    assert components["ProtocolChoice"]["additionalProperties"] is False
    # Not an enum: a deployment's registered plug-ins are names too (UPSTREAM_PROTOCOLS).
    name = components["ProtocolChoice"]["properties"]["name"]
    assert "enum" not in name
    assert all(builtin in name["description"] for builtin in PROTOCOL_NAMES)
    assert "UPSTREAM_PROTOCOLS" in name["description"]


def test_the_view_documents_auth_and_protocol(document: dict[str, Any]) -> None:
    view = document["components"]["schemas"]["ConnectionView"]
    assert {"auth", "protocol"} <= set(view["required"])
    refs = {
        name: [option.get("$ref") for option in view["properties"][name]["anyOf"]]
        for name in ("auth", "protocol")
    }
    assert refs == {
        "auth": ["#/components/schemas/AuthRef", None],
        "protocol": ["#/components/schemas/ProtocolChoice", None],
    }


def test_errors_are_documented_as_error_bodies(document: dict[str, Any]) -> None:
    for operations in document["paths"].values():
        for operation in operations.values():
            for status, answer in operation["responses"].items():
                ref = answer["content"]["application/json"]["schema"]["$ref"]
                assert (ref == "#/components/schemas/ErrorBody") == (int(status) >= 400)
    assert document["components"]["schemas"]["ErrorBody"]["required"] == ["error", "message"]


def test_check_mode_exits_1_on_a_stale_file(tmp_path: Path) -> None:
    stale = tmp_path / "openapi.json"
    stale.write_text(COMMITTED.read_text().replace('"201"', '"299"'))
    fresh = tmp_path / "fresh.json"
    fresh.write_text(COMMITTED.read_text())
    for path, expected in [(stale, 1), (fresh, 0)]:
        done = subprocess.run(
            [sys.executable, str(SCRIPT), "--check", "--output", str(path)],
            capture_output=True,
            text=True,
            timeout=scaled(60),
            check=False,
        )
        assert done.returncode == expected, done.stdout + done.stderr
