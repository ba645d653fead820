"""Docker cannot run here, so the worker image is checked statically, against the
build context the CDK construct stages."""

import json
import re
from pathlib import Path

import pytest

from websocket_fleet import image_context
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


@pytest.mark.parametrize("with_handler", [False, True])
def test_every_copy_source_exists_in_the_staged_context(tmp_path: Path, with_handler: bool):
    handler = tmp_path / "handler-src"
    (handler / "sink").mkdir(parents=True)
    (handler / "sink" / "__init__.py").write_text("")
    context = image_context.stage(tmp_path / "ctx", handler if with_handler else None)
    assert (context / image_context.DOCKERFILE).read_text() == DOCKERFILE.read_text()
    copies = [rest for keyword, rest in instructions() if keyword == "COPY"]
    assert copies
    for rest in copies:
        *sources, _destination = rest.split()
        for source in sources:
            assert not source.startswith("--"), "no COPY --from/--chown surprises"
            assert (context / source).exists(), source


def test_the_handlers_requirements_are_installed_with_the_workers_pins_in_one_run():
    runs = [rest for keyword, rest in instructions() if keyword == "RUN" and "pip install" in rest]
    assert runs[-1].split("pip install", 1)[1].split() == [
        "--no-cache-dir",
        "-r",
        "worker/requirements.txt",
        "-r",
        "handler/requirements.txt",
    ]
    found = dict(instructions())
    assert "PYTHONPATH=/app/handler" in found["ENV"]


def test_the_image_is_labelled_with_the_version_passed_at_build():
    found = instructions()
    (label,) = [rest for keyword, rest in found if keyword == "LABEL"]
    arg = [rest for keyword, rest in found if keyword == "ARG"]
    assert f"{image_context.VERSION_BUILD_ARG}=unknown" in arg
    assert f'org.opencontainers.image.version="${{{image_context.VERSION_BUILD_ARG}}}"' in label
    # After every RUN: a new version reuses every layer.
    keywords = [keyword for keyword, _ in found]
    last_run = max(i for i, keyword in enumerate(keywords) if keyword == "RUN")
    assert keywords.index("ARG") > last_run


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


def test_image_requirements_are_pinned():
    lines = (ROOT / "worker" / "requirements.txt").read_text().splitlines()
    # A pin may carry an environment marker (the platforms with wheels).
    pins = [line.split(";")[0].strip() for line in lines if line and not line.startswith("#")]
    assert pins
    assert all(re.fullmatch(r"[A-Za-z0-9_.\[\],-]+==[0-9][0-9A-Za-z.]*", pin) for pin in pins), pins


def test_the_image_and_the_worker_agree_on_the_health_file():
    """The worker stamps and the health command checks the same file only if the
    image does not set another one than the worker's default."""
    settings = " ".join(rest for keyword, rest in instructions() if keyword in ("ENV", "ARG"))
    set_here = re.findall(rf"{HEALTH_FILE}[= ](\S+)", settings)
    assert set_here in ([], [DEFAULT_HEALTH_FILE]), set_here
