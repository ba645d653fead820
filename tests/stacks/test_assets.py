"""The staged assets hold only the project's own code (allow-lists, no Docker)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from stacks.settings import REPO_ROOT
from tests.stacks.cfn import of_type
from tests.stacks.conftest import Synthesized
from wsfleet.version import VERSION

pytestmark = pytest.mark.cdk


def _files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}


def _python_sources(folder: str) -> set[str]:
    return {
        str(p.relative_to(REPO_ROOT))
        for p in (REPO_ROOT / folder).rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"
    }


def _router_asset(synth: Synthesized) -> Path:
    (code,) = [
        v["Properties"]["Code"]
        for v in of_type(synth.resources, "AWS::Lambda::Function").values()
        if v["Properties"].get("Handler") == "lambdas.router.main.handler"
    ]
    asset_hash = code["S3Key"].removesuffix(".zip")
    return synth.outdir / f"asset.{asset_hash}"


def test_lambda_asset_holds_only_wsfleet_and_lambdas(synth: Synthesized) -> None:
    asset = _router_asset(synth)
    assert {p.name for p in asset.iterdir()} <= {"wsfleet", "lambdas"}
    files = _files(asset)
    assert _python_sources("wsfleet") <= files
    assert files == _python_sources("wsfleet") | _python_sources("lambdas")
    assert not [f for f in files if "__pycache__" in f or f.endswith(".pyc")]
    if (REPO_ROOT / "lambdas" / "router" / "main.py").exists():
        assert "lambdas/router/main.py" in files


def test_worker_image_context_holds_what_the_dockerfile_copies(synth: Synthesized) -> None:
    manifest = json.loads(next(synth.outdir.glob("*.assets.json")).read_text())
    (image,) = manifest["dockerImages"].values()
    assert image["source"]["dockerFile"] == "worker/Dockerfile"
    assert image["source"]["platform"] == "linux/amd64"
    assert image["source"]["dockerBuildArgs"] == {"WEBSOCKET_FLEET_VERSION": VERSION}
    context = synth.outdir / image["source"]["directory"]
    assert {p.name for p in context.iterdir()} == {"worker", "wsfleet", "handler"}
    files = _files(context)
    assert files == _python_sources("worker") | _python_sources("wsfleet") | {
        "handler/requirements.txt"
    }
    # No handler directory: an empty requirements file, so the Dockerfile's steps hold.
    assert (context / "handler" / "requirements.txt").read_text() == ""
    dockerfile = (context / "worker" / "Dockerfile").read_text()
    sources = [
        source
        for line in dockerfile.splitlines()
        if (match := re.match(r"^COPY\s+(?:--\S+\s+)*(.+)\s+\S+$", line.strip()))
        for source in match.group(1).split()
    ]
    assert sources
    for source in sources:
        assert (context / source).exists(), f"COPY {source} is not in the image context"
