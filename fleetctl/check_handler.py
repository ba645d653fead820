"""``fleetctl check-handler DIR pkg.mod:factory``: try a handler directory before it is
deployed, the way the worker image will run it.

1. the same checks as the CDK construct (``WorkerHandler.from_directory``): the
   factory's form, its package in the directory, no name the image already has, no
   requirement that a worker pin contradicts;
2. a virtualenv with the worker's pinned requirements and the directory's own,
   installed in one pip run as the image's Dockerfile does (throwaway, or kept in
   ``--venv DIR`` and rebuilt when the requirements change);
3. the image's layout staged (:mod:`websocket_fleet.image_context`) and, in it, the
   probe (:mod:`fleetctl.handler_probe`): import, factory, handler shape, one sample
   ``Delivery`` (a batch of two for a batch handler). What failed is said in words.

The probe runs with this environment (AWS settings included), so a handler that
writes to a real service does so: point it at a test resource.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Final, TextIO

from websocket_fleet import image_context
from websocket_fleet.errors import FleetOptionsError
from websocket_fleet.handler import WorkerHandler
from websocket_fleet.sources import project_sources

EXIT_OK: Final = 0
EXIT_FAILED: Final = 1
DEFAULT_PAYLOAD: Final = {"seq": 1, "check": "fleetctl check-handler"}
DEFAULT_TIMEOUT: Final = 10.0
PROBE: Final = Path(__file__).with_name("handler_probe.py")
STAMP: Final = ".websocket-fleet-requirements.sha256"
PIP_TIMEOUT_SECONDS: Final = 600


class CheckFailedError(Exception):
    """A step before the probe failed; the message says why."""


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "check-handler",
        help="try a handler directory before deploying it",
        description=__doc__.splitlines()[0].strip("`"),
        epilog="exit status: 0 the handler works, 1 it does not (the output says why).",
    )
    parser.add_argument("directory", type=Path, metavar="DIR", help="the handler directory")
    parser.add_argument("factory", metavar="FACTORY", help="its HANDLER, package.module:factory")
    parser.add_argument(
        "--payload",
        type=json.loads,
        default=DEFAULT_PAYLOAD,
        help=f"the sample delivery's payload, JSON (default {json.dumps(DEFAULT_PAYLOAD)})",
    )
    parser.add_argument(
        "--venv",
        type=Path,
        metavar="DIR",
        help="keep the virtualenv in DIR and reuse it while the requirements are the same "
        "(default: a throwaway one)",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT,
        help=f"seconds the sample call may take (default {DEFAULT_TIMEOUT:g})",
    )


def run(args: argparse.Namespace, out: TextIO) -> int:
    def say(step: str, text: str) -> None:
        out.write(f"{step}: {text}\n")
        out.flush()

    say("handler", f"{args.factory} in {args.directory}")
    try:
        handler = checked_handler(args.directory, args.factory)
        assert handler.directory is not None
        say("checks", "ok: the factory's package is there, no requirement contradicts a pin")
        with virtualenv(args.venv) as venv:
            started = time.monotonic()
            built = ensure_requirements(venv, handler.directory)
            took = time.monotonic() - started
            say(
                "virtualenv",
                f"ok: {'built' if built else 'reused'} {venv} in {took:.1f} s "
                "(the worker's pins and the handler's requirements)",
            )
            with tempfile.TemporaryDirectory(prefix="websocket-fleet-check-") as scratch:
                context = image_context.stage(Path(scratch) / "context", handler.directory)
                code = probe(venv, context, args.factory, args.payload, args.timeout, out)
    except CheckFailedError as error:
        out.write(f"failed: {error}\n")
        return EXIT_FAILED
    if code == EXIT_OK:
        out.write(f"{args.factory} handled the sample as a worker would: ready to deploy\n")
    return EXIT_OK if code == EXIT_OK else EXIT_FAILED


def checked_handler(directory: Path, factory: str) -> WorkerHandler:
    try:
        return WorkerHandler.from_directory(directory, factory)
    except FleetOptionsError as error:
        raise CheckFailedError(error.reason) from None


@contextmanager
def virtualenv(keep: Path | None) -> Iterator[Path]:
    if keep is not None:
        yield keep.resolve()
        return
    with tempfile.TemporaryDirectory(prefix="websocket-fleet-venv-") as scratch:
        yield Path(scratch) / "venv"


def venv_python(venv: Path) -> Path:
    return venv / "bin" / "python"


def requirement_files(directory: Path) -> list[Path]:
    """The worker's pins and the handler's requirements, as the Dockerfile installs them."""
    files = [project_sources().worker_requirements]
    own = directory / "requirements.txt"
    return [*files, own] if own.is_file() else files


def ensure_requirements(venv: Path, directory: Path) -> bool:
    """Create or refresh the virtualenv; False when it already had these requirements."""
    files = requirement_files(directory)
    digest = hashlib.sha256(b"".join(f.read_bytes() + b"\0" for f in files)).hexdigest()
    stamp = venv / STAMP
    if venv_python(venv).exists() and stamp.exists() and stamp.read_text() == digest:
        return False
    if venv.exists():
        shutil.rmtree(venv)
    _run([sys.executable, "-m", "venv", str(venv)], "creating the virtualenv")
    pip = [str(venv_python(venv)), "-m", "pip", "install", "--disable-pip-version-check", "-q"]
    for file in files:
        pip += ["-r", str(file)]
    _run(pip, "installing the worker's pins and the handler's requirements")
    stamp.write_text(digest)
    return True


def _run(command: list[str], what: str) -> None:
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=PIP_TIMEOUT_SECONDS, check=False
        )
    except subprocess.TimeoutExpired:
        raise CheckFailedError(f"{what} took over {PIP_TIMEOUT_SECONDS} s") from None
    if done.returncode != 0:
        said = [
            line
            for line in (done.stderr + done.stdout).splitlines()
            if line.strip() and "is ignored: it is neither a file nor a directory" not in line
        ]
        raise CheckFailedError(f"{what} failed:\n" + "\n".join(f"  {s}" for s in said[-15:]))


def probe(
    venv: Path, context: Path, factory: str, payload: Any, timeout: float, out: TextIO
) -> int:
    """Run the probe in the staged context; its lines go to ``out``."""
    env = {
        **os.environ,
        "PYTHONPATH": str(context / image_context.HANDLER_FOLDER),
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    env.pop("PYTHONHOME", None)
    command = [
        str(venv_python(venv)),
        "-c",
        PROBE.read_text(encoding="utf-8"),
        factory,
        json.dumps(payload),
        str(timeout),
    ]
    done = subprocess.run(
        command,
        cwd=context,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout + 60,
        check=False,
    )
    out.write(done.stdout)
    if done.returncode == EXIT_FAILED and done.stderr.strip():
        tail = "\n".join(f"  {line}" for line in done.stderr.splitlines()[-10:])
        out.write(f"what the handler wrote to stderr (last lines):\n{tail}\n")
    if done.returncode not in (EXIT_OK, EXIT_FAILED):
        tail = "\n".join(f"  {line}" for line in done.stderr.splitlines()[-10:])
        out.write(f"failed: the probe exited with status {done.returncode}:\n{tail}\n")
        return EXIT_FAILED
    return done.returncode
