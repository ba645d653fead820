"""Where the code the fleet deploys lives: the worker (its image), the router (its
Lambda asset) and the shared ``wsfleet`` package both carry.

In a checkout they are the repository's top-level folders. Installed with pip, only
``websocket_fleet``, ``wsfleet`` and ``fleetctl`` are importable; the worker and the
router travel inside this package as files (``websocket_fleet/_bundle/worker`` and
``.../lambdas``, see pyproject.toml), so that a user's own ``worker``, ``lambdas`` or
``stacks`` never meets ours on the import path. They are read as files (image context,
Lambda asset), and the worker's configuration rules are loaded from the very file the
image will run (:func:`worker_config`).
"""

from __future__ import annotations

import importlib.util
import re
import sys
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Final

import wsfleet

PACKAGE_DIR: Final = Path(__file__).resolve().parent
BUNDLE_DIR: Final = PACKAGE_DIR / "_bundle"
"""Present only in an installed copy."""
WORKER_CONFIG_MODULE: Final = "websocket_fleet._worker_config"


class SourcesError(RuntimeError):
    """The worker or router code is not where it should be: a broken installation."""


@dataclass(frozen=True, slots=True)
class Sources:
    worker: Path
    """``worker/``: the worker package, its Dockerfile and its requirements."""
    lambdas: Path
    """``lambdas/``: the router function's package."""
    wsfleet: Path
    """``wsfleet/``: the shared package, in the image and in the Lambda asset."""

    @property
    def dockerfile(self) -> Path:
        return self.worker / "Dockerfile"

    @property
    def worker_requirements(self) -> Path:
        return self.worker / "requirements.txt"


@cache
def project_sources() -> Sources:
    """The installed bundle when there is one, else the checkout this package is in."""
    root = BUNDLE_DIR if (BUNDLE_DIR / "worker").is_dir() else PACKAGE_DIR.parent
    sources = Sources(
        worker=root / "worker",
        lambdas=root / "lambdas",
        wsfleet=Path(wsfleet.__file__).resolve().parent,
    )
    for needed in (sources.dockerfile, sources.worker_requirements, sources.lambdas / "router"):
        if not needed.exists():
            raise SourcesError(f"websocket_fleet: {needed} is missing; reinstall the package")
    return sources


@cache
def worker_config() -> ModuleType:
    """``worker/config.py`` of :func:`project_sources`, loaded as a module of its own:
    the settings' names and ``WorkerConfig``, the rules the worker applies at start.
    It imports nothing but the standard library and ``wsfleet``
    (tests/unit/test_config.py holds it to that)."""
    path = project_sources().worker / "config.py"
    spec = importlib.util.spec_from_file_location(WORKER_CONFIG_MODULE, path)
    if spec is None or spec.loader is None:
        raise SourcesError(f"websocket_fleet: cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    # Dataclasses look their module up in sys.modules while the class is made.
    sys.modules[WORKER_CONFIG_MODULE] = module
    spec.loader.exec_module(module)
    return module


def worker_pins() -> dict[str, str]:
    """``worker/requirements.txt`` as ``{name: "name==version"}`` (names normalised)."""
    return pins_of(project_sources().worker_requirements.read_text(encoding="utf-8"))


def pins_of(text: str) -> dict[str, str]:
    pins: dict[str, str] = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        match = re.fullmatch(r"([A-Za-z0-9_.-]+)(\[[^\]]*\])?==(\S+)", line)
        if match:
            pins[canonical_name(match.group(1))] = line
    return pins


def canonical_name(name: str) -> str:
    """PEP 503: ``Foo_Bar.baz`` and ``foo-bar-baz`` are one project."""
    return re.sub(r"[-_.]+", "-", name).lower()


def pinned_version(name: str) -> str:
    """The worker's pinned version of ``name``."""
    pin = worker_pins().get(canonical_name(name))
    if pin is None:
        raise SourcesError(f"no {name}==<version> pin in worker/requirements.txt")
    return pin.rpartition("==")[2]
