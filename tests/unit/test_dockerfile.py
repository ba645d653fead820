"""Docker cannot run here, so the worker image is checked statically."""

import json
import re
from pathlib import Path

import pytest

from worker.config import DEFAULT_HEALTH_FILE, HEALTH_FILE

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "worker" / "Dockerfile"


def instructions() -> list[tuple[str, str]]:
    text = DOCKERFILE.read_text().replace("\\\n", " ")
    found = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            keyword, _, rest = line.partition(" ")
            found.append((keyword.upper(), rest.strip()))
    return found


def test_every_copy_source_exists_in_the_build_context():
    copies = [rest for keyword, rest in instructions() if keyword == "COPY"]
    assert copies
    for rest in copies:
        *sources, _destination = rest.split()
        for source in sources:
            assert not source.startswith("--"), "no COPY --from/--chown surprises"
            assert (ROOT / source).exists(), source


@pytest.mark.parametrize("keyword", ["ENTRYPOINT", "CMD"])
def test_entrypoint_and_cmd_use_exec_form(keyword):
    for found, rest in instructions():
        if found == keyword:
            assert isinstance(json.loads(rest), list), f"{keyword} must be exec form: {rest}"


def test_the_image_runs_the_worker_and_checks_its_health():
    found = dict(instructions())
    assert json.loads(found["ENTRYPOINT"]) == ["python", "-m", "worker"]
    assert "worker.health" in found["HEALTHCHECK"]
    assert found["USER"] != "root"


def test_dockerignore_keeps_heavy_folders_out():
    ignored = set((ROOT / ".dockerignore").read_text().split())
    assert {".venv", "node_modules", "cdk.out"} <= ignored


def test_image_requirements_are_pinned():
    lines = (ROOT / "worker" / "requirements.txt").read_text().splitlines()
    pins = [line for line in lines if line and not line.startswith("#")]
    assert pins
    assert all(re.fullmatch(r"[A-Za-z0-9_.\[\],-]+==[0-9][0-9A-Za-z.]*", pin) for pin in pins), pins


def test_the_image_and_the_worker_agree_on_the_health_file():
    """The worker stamps and the health command checks the same file only if the
    image does not set another one than the worker's default."""
    settings = " ".join(rest for keyword, rest in instructions() if keyword in ("ENV", "ARG"))
    set_here = re.findall(rf"{HEALTH_FILE}[= ](\S+)", settings)
    assert set_here in ([], [DEFAULT_HEALTH_FILE]), set_here
