"""Which message handler the workers run, and where its code comes from."""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from websocket_fleet.errors import FleetOptionsError
from websocket_fleet.handler_requirements import REQUIREMENTS_FILE, conflicts

FACTORY_PATTERN: Final = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*")
"""``package.module:factory``, the form of the worker's ``HANDLER``."""
IMAGE_NAMES: Final = frozenset({"worker", "wsfleet"})
"""Top-level names the image already has: a handler's own would be shadowed by them."""
ECR_URI: Final = re.compile(
    r"(?P<account>\d{12})\.dkr\.ecr\.(?P<region>[a-z0-9-]+)\.amazonaws\.com(?P<cn>\.cn)?/"
    r"(?P<repository>[a-z0-9._/-]+)(?::(?P<tag>[\w.-]{1,128})|@(?P<digest>sha256:[0-9a-f]{64}))?"
)


def check_factory(factory: str) -> str:
    """The worker's own rule for ``HANDLER`` (``worker.plugins.load_factory``), at synth."""
    if not FACTORY_PATTERN.fullmatch(factory):
        raise FleetOptionsError(
            "handler", f"factory must look like 'package.module:factory', got {factory!r}"
        )
    return factory


@dataclass(frozen=True, slots=True)
class WorkerHandler:
    """The ``HANDLER`` of every worker (``package.module:factory``, called once per
    worker process, returning an object with ``async def handle(self, delivery)`` or
    ``async def handle_batch(self, deliveries)``; README.md, "Writing a handler"), and
    the code that defines it. Make one with :meth:`from_directory`,
    :meth:`from_image` or :meth:`built_in`."""

    factory: str
    directory: Path | None = None
    """A directory of the user's packages, built into the worker image."""
    image_uri: str | None = None
    """An image of the user's, built FROM this project's worker image."""

    @classmethod
    def from_directory(cls, path: str | os.PathLike[str], factory: str) -> WorkerHandler:
        """``path`` holds the handler's package(s) and, optionally, a
        ``requirements.txt``. The worker image is built from this project's worker code
        plus that directory (on the workers' ``PYTHONPATH``), with its requirements
        installed next to the worker's pins: a requirement the pins contradict fails
        here, naming both lines. ``fleetctl check-handler PATH FACTORY`` runs it once."""
        directory = Path(path).expanduser().resolve()
        check_factory(factory)
        if not directory.is_dir():
            raise FleetOptionsError("handler", f"handler directory {directory} does not exist")
        top = factory.split(".", 1)[0].split(":", 1)[0]
        if not ((directory / top).is_dir() or (directory / f"{top}.py").is_file()):
            raise FleetOptionsError(
                "handler",
                f"{factory}: the handler directory {directory} has no package {top}/ "
                f"or module {top}.py",
            )
        shadowed = sorted(
            name
            for name in top_level_names(directory)
            if name in IMAGE_NAMES or name in sys.stdlib_module_names
        )
        if shadowed:
            raise FleetOptionsError(
                "handler",
                f"the handler directory {directory} holds {', '.join(shadowed)}, which the "
                "worker image or Python already has: rename them",
            )
        requirements = directory / REQUIREMENTS_FILE
        if requirements.is_file():
            found = conflicts(requirements)
            if found:
                raise FleetOptionsError("handler", "; ".join(str(c) for c in found))
        return cls(factory=factory, directory=directory)

    @classmethod
    def from_image(cls, uri: str, factory: str) -> WorkerHandler:
        """An image the user built FROM this project's worker image (README.md,
        "Your own handler"), with the handler in it: ``uri`` is
        ``<account>.dkr.ecr.<region>.amazonaws.com/<repository>:<tag>`` (the task's
        execution role is granted the pull) or any other registry's public image."""
        check_factory(factory)
        if not uri or any(c.isspace() for c in uri):
            raise FleetOptionsError("handler", f"not an image URI: {uri!r}")
        return cls(factory=factory, image_uri=uri)

    @classmethod
    def built_in(cls, factory: str) -> WorkerHandler:
        """A factory the worker image holds already (the worker's own modules)."""
        return cls(factory=check_factory(factory))


def top_level_names(directory: Path) -> set[str]:
    """The importable names a directory puts on the path: packages and modules."""
    names = set()
    for entry in directory.iterdir():
        if entry.is_dir() and entry.name.isidentifier():
            names.add(entry.name)
        elif entry.suffix == ".py" and entry.stem.isidentifier():
            names.add(entry.stem)
    return names
