"""``./scripts/run-local.sh --handler-dir DIR --handler pkg.mod:factory``: the local
stack runs a handler directory as the worker image would, on a virtualenv with the
worker's pins and the directory's requirements."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.integration.test_local_stack import logged_events, run_local_stack
from tests.support.processes import run_module
from tests.support.timing import scaled
from wsfleet.version import VERSION

pytestmark = [pytest.mark.slow, pytest.mark.fleet, pytest.mark.timeout(scaled(400))]

RECORDER = """\
import json
import os
import sys

import cachetools


class Recorder:
    def __init__(self, path):
        self._path = path
        self._seen = cachetools.LRUCache(maxsize=1000)

    async def handle(self, delivery):
        with open(self._path, "a") as out:
            out.write(json.dumps({
                "connection_id": delivery.connection_id, "seq": delivery.seq,
                "epoch": delivery.epoch, "prefix": sys.prefix,
            }) + "\\n")


def factory():
    return Recorder(os.environ["RECORDER_FILE"])
"""


def test_the_local_stack_runs_a_handler_directory(tmp_path: Path) -> None:
    handler = tmp_path / "handler"
    (handler / "recorder").mkdir(parents=True)
    (handler / "recorder" / "__init__.py").write_text(RECORDER)
    (handler / "requirements.txt").write_text("cachetools==7.2.0\n")
    records = tmp_path / "records.jsonl"
    state_dir = tmp_path / "state"
    result = run_module(
        "local_stack",
        [
            "--base-port",
            "0",
            "--workers",
            "1",
            "--connections",
            "1",
            "--duration",
            "6",
            "--no-view",
            "--state-dir",
            str(state_dir),
            "--handler-dir",
            str(handler),
            "--handler",
            "recorder:factory",
        ],
        scaled(300),
        env={**os.environ, "RECORDER_FILE": str(records)},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "handler virtualenv built" in result.stderr
    delivered = [json.loads(line) for line in records.read_text().splitlines()]
    assert delivered
    assert {d["connection_id"] for d in delivered} == {"demo-1"}
    assert [d["seq"] for d in delivered] == list(range(1, len(delivered) + 1))
    assert {d["prefix"] for d in delivered} == {str(state_dir / "handler-venv")}
    (started,) = [
        event
        for event in logged_events(state_dir / "logs" / "worker-1.log")
        if event.get("message") == "worker started"
    ]
    assert started["version"] == VERSION


def test_a_handler_directory_without_its_factorys_package_is_refused(tmp_path: Path) -> None:
    (tmp_path / "handler").mkdir()
    result = run_local_stack(
        ["--handler-dir", str(tmp_path / "handler"), "--handler", "recorder:factory"],
        timeout=scaled(60),
    )
    assert result.returncode == 2
    assert "--handler-dir: recorder:factory: the handler directory" in result.stderr
    assert "has no package recorder/ or module recorder.py" in result.stderr
