"""The adoption path, outside the repository: a fresh virtualenv where this checkout
was installed with pip, the ten-line user app of examples/trade_store/app and its
handler directory, ``cdk synth`` offline under cdk-nag.

What keeps it under two minutes, and what that leaves out: the checkout is installed
with ``--no-deps`` (its own build in an isolated environment, setuptools from the
package index, as any ``pip install <checkout>`` does), and the third-party packages
come from the project's virtualenv through a ``.pth`` line placed after the fresh
one's own site-packages, instead of being downloaded again (aws-cdk-lib alone is a
few hundred MB). ``pip check`` then holds the checkout's declared dependency ranges to
those pinned versions. The app's directory and the installed copy are the only Python
code the synth can see: the repository is neither the working directory nor on the
path, and the test asserts ``websocket_fleet`` is imported from the fresh virtualenv.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import pytest

from tests.support.timing import scaled

pytestmark = [pytest.mark.slow, pytest.mark.timeout(scaled(300))]

REPO_ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = REPO_ROOT / "examples" / "trade_store"
CDK = REPO_ROOT / "node_modules" / ".bin" / "cdk"


def run(command: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(command, capture_output=True, text=True, check=False, **kwargs)  # type: ignore[call-overload]
    assert done.returncode == 0, f"{command[:4]}...\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done  # type: ignore[no-any-return]


def checkout_copy(into: Path) -> Path:
    """The checkout as git sees it (tracked and new files, nothing ignored): what
    ``pip install <checkout>`` or a git URL installs, without touching the work tree."""
    listed = run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO_ROOT
    ).stdout.split("\0")
    for name in filter(None, listed):
        source = REPO_ROOT / name
        if source.is_file():
            (into / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, into / name)
    return into


@pytest.fixture(scope="module")
def fresh_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("adopt")
    started = time.monotonic()
    venv = root / "venv"
    run([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    python = venv / "bin" / "python"
    site = Path(
        run([str(python), "-c", "import site; print(site.getsitepackages()[0])"]).stdout.strip()
    )
    (site / "zz-project-packages.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    checkout = checkout_copy(root / "checkout")
    pip = [sys.executable, "-m", "pip", "--python", str(python), "--disable-pip-version-check"]
    run([*pip, "install", "--no-deps", "--quiet", str(checkout)])
    run([*pip, "check"])
    print(f"fresh virtualenv with the checkout installed in {time.monotonic() - started:.1f} s")
    return venv


def test_the_installed_package_is_the_fresh_venvs_and_brings_no_generic_names(
    fresh_venv: Path, tmp_path: Path
) -> None:
    probe = (
        "import importlib.util, json, websocket_fleet, wsfleet, fleetctl;"
        "from websocket_fleet.sources import project_sources;"
        "s = project_sources();"
        "print(json.dumps({'websocket_fleet': websocket_fleet.__file__,"
        " 'wsfleet': wsfleet.__file__, 'fleetctl': fleetctl.__file__,"
        " 'worker_code': str(s.worker), 'version': websocket_fleet.__version__,"
        " 'importable': [n for n in ('worker', 'stacks', 'lambdas')"
        " if importlib.util.find_spec(n)]}))"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    shown = json.loads(
        run([str(fresh_venv / "bin" / "python"), "-c", probe], cwd=tmp_path, env=env).stdout
    )
    for package in ("websocket_fleet", "wsfleet", "fleetctl"):
        assert shown[package].startswith(str(fresh_venv)), shown
    assert shown["worker_code"].startswith(str(fresh_venv))
    assert shown["worker_code"].endswith("websocket_fleet/_bundle/worker")
    assert shown["importable"] == []
    version = run([str(fresh_venv / "bin" / "fleetctl"), "--version"], cwd=tmp_path, env=env)
    assert version.stdout.strip() == f"fleetctl (websocket-fleet) {shown['version']}"


def test_the_user_app_synthesizes_offline_under_cdk_nag(fresh_venv: Path, tmp_path: Path) -> None:
    project = tmp_path / "trade_store"
    shutil.copytree(EXAMPLE, project, ignore=shutil.ignore_patterns("__pycache__", "cdk.out"))
    app_lines = [
        line for line in (project / "app" / "app.py").read_text().splitlines() if line.strip()
    ]
    assert len(app_lines) <= 20, "the walkthrough promises a short app"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "AWS_"))}
    env.update(
        PATH=f"{fresh_venv / 'bin'}{os.pathsep}{env['PATH']}",
        CDK_DISABLE_CLI_TELEMETRY="true",
        CDK_DISABLE_VERSION_CHECK="1",
        JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION="20",
    )
    started = time.monotonic()
    run(
        [str(CDK), "synth", "-q", "--no-notices", "--output", "cdk.out"],
        cwd=project / "app",
        env=env,
        timeout=scaled(240),
    )
    print(f"cdk synth of the user app in {time.monotonic() - started:.1f} s")
    out = project / "app" / "cdk.out"
    template = json.loads((out / "TradeFleet.template.json").read_text())
    (task,) = [
        r["Properties"]
        for r in template["Resources"].values()
        if r["Type"] == "AWS::ECS::TaskDefinition"
    ]
    env_vars = {e["Name"]: e["Value"] for e in task["ContainerDefinitions"][0]["Environment"]}
    assert env_vars["HANDLER"] == "trade_store.sink:factory"
    assert env_vars["TRADE_TABLE"] == "trades"
    assert env_vars["HANDLER_ERRORS"] == "skip"
    manifest = json.loads((out / "TradeFleet.assets.json").read_text())
    (image,) = manifest["dockerImages"].values()
    context = out / image["source"]["directory"]
    assert {p.name for p in context.iterdir()} == {"worker", "wsfleet", "handler"}
    handler = context / "handler"
    assert (handler / "trade_store" / "sink.py").is_file()
    assert (handler / "trade_model" / "__init__.py").is_file()
    assert (handler / "requirements.txt").read_text() == (
        EXAMPLE / "handler" / "requirements.txt"
    ).read_text()
    assert (context / "worker" / "Dockerfile").is_file()
    # The worker code in the image is the installed copy's: the checkout's, every file.
    for folder in ("worker", "wsfleet"):
        assert source_files(context / folder) == source_files(REPO_ROOT / folder), folder
    assert (context / "worker" / "config.py").read_text() == (
        REPO_ROOT / "worker" / "config.py"
    ).read_text()


def source_files(folder: Path) -> set[str]:
    return {
        str(p.relative_to(folder))
        for p in folder.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"
    }
