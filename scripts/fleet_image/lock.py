"""worker/requirements.lock: every transitive dependency of the worker's pins
(worker/requirements.txt), each with the hashes of its files, as the image installs it
(``pip install --require-hashes``).

:func:`generate` runs pip-compile (pip-tools, pinned in requirements-dev.txt) against
PyPI alone, with this machine's own pip settings left out, so the same pins give the
same lock anywhere. Starting from the current lock, pip-compile keeps every version it
holds unless a pin moved: :func:`check` compiles into a copy and compares, and
:func:`pin_mismatches` tells without the network whether each pin is in the lock.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Final

from scripts.fleet_image import settings

PINS: Final = settings.REPO_ROOT / "worker" / "requirements.txt"
LOCK: Final = settings.REPO_ROOT / "worker" / "requirements.lock"
INDEX: Final = "https://pypi.org/simple"
COMPILE_OPTIONS: Final = (
    "--quiet",
    "--generate-hashes",
    "--allow-unsafe",
    "--strip-extras",
    "--no-emit-index-url",
    f"--index-url={INDEX}",
)


class LockError(RuntimeError):
    pass


def _pip_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_") or k == "PIP_CERT"}
    env["PIP_CONFIG_FILE"] = os.devnull
    return env


def _compile(pins: Path, output: Path) -> None:
    pip_compile = Path(sys.executable).with_name("pip-compile")
    if not pip_compile.exists():
        raise LockError(
            f"{pip_compile} is missing: run scripts/bootstrap.sh (requirements-dev.txt)"
        )
    # Relative names in the header (`-r requirements.txt`), whatever the checkout's path.
    done = subprocess.run(
        [str(pip_compile), *COMPILE_OPTIONS, f"--output-file={output.name}", pins.name],
        cwd=pins.parent,
        env=_pip_env(),
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise LockError(f"pip-compile failed:\n{(done.stdout + done.stderr)[-3000:]}")


def generate() -> Path:
    _compile(PINS, LOCK)
    return LOCK


def check() -> str | None:
    """What regenerating the lock from the pins would change (a unified diff), or None."""
    import difflib

    with tempfile.TemporaryDirectory() as work:
        pins = Path(work) / PINS.name
        shutil.copy(PINS, pins)
        copy = Path(work) / LOCK.name
        shutil.copy(LOCK, copy)
        _compile(pins, copy)
        fresh, current = copy.read_text(), LOCK.read_text()
    if fresh == current:
        return None
    return "".join(
        difflib.unified_diff(
            current.splitlines(keepends=True),
            fresh.splitlines(keepends=True),
            str(LOCK),
            "regenerated",
        )
    )


_ENTRY = re.compile(r"^([A-Za-z0-9_.-]+)==(\S+)(?:\s*;\s*(.*?))?\s*\\?$")


def _name(raw: str) -> str:
    return re.sub(r"[-_.]+", "-", raw).lower()


def lock_entries(text: str) -> dict[str, tuple[str, str, list[str]]]:
    """``{name: (version, marker, hashes)}`` of a lock file."""
    entries: dict[str, tuple[str, str, list[str]]] = {}
    current: str | None = None
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if stripped.startswith("--hash="):
            if current is None:
                raise LockError(f"a hash before any requirement: {stripped}")
            entries[current][2].append(stripped.split("=", 1)[1].rstrip(" \\"))
            continue
        match = _ENTRY.match(stripped)
        if match is None:
            raise LockError(f"not a pinned requirement: {stripped}")
        current = _name(match.group(1))
        entries[current] = (match.group(2), (match.group(3) or "").strip(), [])
    return entries


def pin_entries(text: str) -> dict[str, tuple[str, str]]:
    """``{name: (version, marker)}`` of worker/requirements.txt."""
    pins: dict[str, tuple[str, str]] = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        requirement, _, marker = line.partition(";")
        name, _, version = requirement.strip().partition("==")
        pins[_name(name.split("[")[0])] = (version.strip(), marker.strip())
    return pins


def pin_mismatches(pins_text: str, lock_text: str) -> list[str]:
    """Why the lock does not hold the pins (empty when it does): each pin at its
    version and marker, every entry with at least one hash."""
    problems = []
    lock = lock_entries(lock_text)
    for name, (version, marker) in pin_entries(pins_text).items():
        if name not in lock:
            problems.append(f"{name}=={version} is pinned but not in the lock")
            continue
        locked, locked_marker, _ = lock[name]
        if locked != version:
            problems.append(f"{name} is pinned at {version} but locked at {locked}")
        if _normal_marker(locked_marker) != _normal_marker(marker):
            problems.append(f"{name}: marker {marker!r} pinned, {locked_marker!r} locked")
    problems += [f"{name} has no hash" for name, (_, _, hashes) in lock.items() if not hashes]
    return problems


def _normal_marker(marker: str) -> str:
    return re.sub(r"\s+", "", marker.replace("'", '"'))
