"""The external tools, called one way: buildah with the cache's storage, runc with its
own state directory. A failed call raises :class:`ToolError` quoting its output."""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from scripts.fleet_image import settings

REQUIRED: tuple[str, ...] = ("buildah", "runc", "debootstrap")


class ToolError(RuntimeError):
    """A tool failed; the message holds the command and the end of its output."""


def missing_tools() -> list[str]:
    """The tools of :data:`REQUIRED` that are not installed (scripts/image-tools.sh
    installs them)."""
    return [tool for tool in REQUIRED if shutil.which(tool) is None]


def run(argv: Sequence[str], *, timeout: float = 600, quiet: bool = True) -> str:
    """Run ``argv`` with the tools' environment; its stdout. ``quiet=False`` lets its
    output through to ours (a build's progress)."""
    try:
        done = subprocess.run(
            list(argv),
            env=settings.tool_env(),
            stdin=subprocess.DEVNULL,
            capture_output=quiet,
            text=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired as error:
        raise ToolError(f"{' '.join(argv)}: no answer in {timeout:g} s") from error
    if done.returncode != 0:
        tail = ((done.stdout or "") + (done.stderr or ""))[-3000:]
        raise ToolError(f"{' '.join(argv)} exited with {done.returncode}:\n{tail}")
    return done.stdout or ""


def buildah(*args: str, timeout: float = 600, quiet: bool = True) -> str:
    return run(["buildah", *args], timeout=timeout, quiet=quiet)


def runc_argv(*args: str) -> list[str]:
    return [settings.RUNC, "--root", str(settings.runc_root()), *args]


def image_exists(name: str) -> bool:
    try:
        buildah("inspect", "--type", "image", "--format", "{{.FromImageID}}", name)
    except ToolError:
        return False
    return True


def inspect_image(name: str) -> dict[str, Any]:
    """``buildah inspect`` of an image: ``Docker.config`` holds what a run needs."""
    found: dict[str, Any] = json.loads(buildah("inspect", "--type", "image", name))
    return found


def image_id(name: str) -> str:
    return buildah("inspect", "--type", "image", "--format", "{{.FromImageID}}", name).strip()


def new_container(image: str, name: str) -> tuple[str, Path]:
    """A working container of ``image`` (its own writable layer), mounted: its id and
    the path of its root file system."""
    container = buildah("from", "--pull-never", "--name", name, image).strip()
    try:
        mount = Path(buildah("mount", container).strip())
    except ToolError:
        remove_container(container)
        raise
    return container, mount


def remove_container(container: str) -> None:
    """Unmount and remove; quietly, it may already be gone."""
    for args in (("umount", container), ("rm", container)):
        with contextlib.suppress(ToolError):
            buildah(*args)
