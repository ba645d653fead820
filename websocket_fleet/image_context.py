"""The worker image's build context, staged: the worker, ``wsfleet`` and the handler.

Synth stages it and ``cdk deploy`` builds it (worker/Dockerfile); nothing here runs
Docker. A CI that builds the image itself (for ``WorkerHandler.from_image``) stages the
same context with ``python -m websocket_fleet.image_context OUT [--handler-dir DIR]``
and runs ``docker build -f OUT/worker/Dockerfile OUT``.

    OUT/worker/            the worker package, its Dockerfile, requirements.txt (the
                           pins) and requirements.lock (every dependency, hashed)
    OUT/wsfleet/           the shared package
    OUT/handler/           the handler directory (empty without one), on PYTHONPATH
    OUT/handler/requirements.txt   installed next to the worker's pins (empty if none)

Only these: an edit elsewhere (docs, tests, the stacks) leaves the context, and so the
image and the running fleet, as they were.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Final

from websocket_fleet.handler_requirements import REQUIREMENTS_FILE
from websocket_fleet.sources import project_sources

DOCKERFILE: Final = "worker/Dockerfile"
"""Relative to the context."""
HANDLER_FOLDER: Final = "handler"
LOCK_FILE: Final = "worker/requirements.lock"
"""Relative to the context: what the image installs, with ``--require-hashes``."""
VERSION_BUILD_ARG: Final = "WEBSOCKET_FLEET_VERSION"
"""The image's ``org.opencontainers.image.version`` label."""
LEFT_OUT: Final = (
    "__pycache__",
    "*.pyc",
    ".git",
    ".venv",
    "venv",
    "node_modules",
    "cdk.out",
    ".mypy_cache",
    ".pytest_cache",
    ".ruff_cache",
    ".DS_Store",
)
"""Never part of a context: bytecode, environments, caches, other tools' output."""


def stage(into: Path, handler_dir: Path | None = None) -> Path:
    """Fill the empty or missing directory ``into`` and return it."""
    sources = project_sources()
    into.mkdir(parents=True, exist_ok=True)
    if any(into.iterdir()):
        raise FileExistsError(f"{into} is not empty")
    ignore = shutil.ignore_patterns(*LEFT_OUT)
    shutil.copytree(sources.worker, into / "worker", ignore=ignore)
    if not (into / LOCK_FILE).is_file():
        # The Dockerfile installs from it: without it the image could not be built.
        raise FileNotFoundError(
            f"{sources.worker / 'requirements.lock'} is missing: the image installs from it "
            "(reinstall the package, or regenerate it with scripts/image.sh lock)"
        )
    shutil.copytree(sources.wsfleet, into / "wsfleet", ignore=ignore)
    handler = into / HANDLER_FOLDER
    if handler_dir is None:
        handler.mkdir()
    else:
        shutil.copytree(handler_dir, handler, ignore=ignore)
    requirements = handler / REQUIREMENTS_FILE
    if not requirements.exists():
        requirements.write_text("", encoding="utf-8")
    return into


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m websocket_fleet.image_context",
        description="Stage the worker image's build context, as the CDK app does, for "
        "`docker build -f OUT/worker/Dockerfile OUT`.",
    )
    parser.add_argument("out", type=Path, help="an empty or missing directory")
    parser.add_argument("--handler-dir", type=Path, help="a handler directory to build in")
    args = parser.parse_args(argv)
    try:
        stage(args.out, args.handler_dir)
    except (FileExistsError, FileNotFoundError) as error:
        print(f"image_context: {error}", file=sys.stderr)
        return 2
    print(f"staged {args.out}; build with: docker build -f {args.out / DOCKERFILE} {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
