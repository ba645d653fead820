"""The local stand-in for the Dockerfile's ``FROM``.

No container registry is reachable from the machines this project is tested on, so the
official ``python:3.11-slim`` cannot be pulled. The stand-in is Debian bookworm made by
debootstrap from the distribution's own packages (Python 3.11 with pip, CA
certificates, netbase, tzdata), with pip allowed to install system-wide as on the
official image. It differs from the official image in docs/DEPLOY.md ("The local
stand-in base"). Made once, kept in the cache's image storage, labelled with its
recipe: a change of recipe makes it again.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Final

from scripts.fleet_image import settings, tools

SUITE: Final = "bookworm"
"""Debian 12: its python3 is 3.11, the Dockerfile's Python (trixie's is 3.13)."""
PACKAGES: Final = (
    "python3",
    "python3-pip",
    "python-is-python3",
    "ca-certificates",
    "netbase",
    "tzdata",
)
RECIPE_LABEL: Final = "io.websocket-fleet.standin-recipe"
DEFAULT_MIRROR: Final = "http://deb.debian.org/debian"
# What the official image sets besides its own paths (/usr/local/bin comes first there
# too; here python is Debian's, in /usr/bin).
IMAGE_ENV: Final = (
    "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "LANG=C.UTF-8",
)
# Left out of the root file system: package lists and downloaded archives (as the
# official image leaves them out), and the marker that stops a system-wide pip install.
PRUNED: Final = (
    "var/cache/apt/archives",
    "var/lib/apt/lists",
    "usr/lib/python3.11/EXTERNALLY-MANAGED",
)


def recipe() -> str:
    """What the stand-in is made of; its hash labels the image."""
    return f"debootstrap --variant=minbase {SUITE} {','.join(PACKAGES)}; prune {','.join(PRUNED)}"


def recipe_key() -> str:
    return hashlib.sha256(recipe().encode()).hexdigest()[:16]


def apt_mirror(sources: Path = Path("/etc/apt/sources.list.d/debian.sources")) -> str:
    """The Debian mirror apt already uses here (deb822 or one-line format)."""
    candidates = [sources, Path("/etc/apt/sources.list")]
    for path in candidates:
        if not path.exists():
            continue
        text = path.read_text(errors="replace")
        match = re.search(r"^URIs:\s*(\S+)", text, re.MULTILINE) or re.search(
            r"^deb\s+(?:\[[^\]]*\]\s+)?(\S+)\s+\S+\s+main", text, re.MULTILINE
        )
        if match:
            return match.group(1)
    return DEFAULT_MIRROR


def current() -> bool:
    """The stand-in exists and was made by this recipe."""
    if not tools.image_exists(settings.STANDIN_IMAGE):
        return False
    labels = tools.inspect_image(settings.STANDIN_IMAGE).get("Docker", {}).get("config", {})
    found = (labels.get("Labels") or {}).get(RECIPE_LABEL)
    return bool(found == recipe_key())


def ensure(mirror: str | None = None) -> bool:
    """Make the stand-in unless it is current; True when it was made now."""
    if current():
        return False
    make(mirror or apt_mirror())
    return True


def make(mirror: str) -> None:
    started = time.monotonic()
    scratch = settings.cache_dir() / "scratch"
    scratch.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=scratch, prefix="standin-") as work:
        rootfs = Path(work) / "rootfs"
        print(f"stand-in base: debootstrap {SUITE} from {mirror} (about a minute)", file=sys.stderr)
        argv = [
            "debootstrap",
            "--variant=minbase",
            f"--include={','.join(PACKAGES)}",
            SUITE,
            str(rootfs),
            mirror,
        ]
        done = subprocess.run(argv, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            output = (done.stdout + done.stderr)[-3000:]
            raise tools.ToolError(f"{' '.join(argv)} exited with {done.returncode}:\n{output}")
        for relative in PRUNED:
            target = rootfs / relative
            if target.is_dir():
                shutil.rmtree(target)
                target.mkdir()
            else:
                target.unlink(missing_ok=True)
        container = tools.buildah("from", "scratch").strip()
        try:
            tools.buildah("copy", "--quiet", container, str(rootfs), "/")
            config = ["config", "--cmd", "python3", "--label", f"{RECIPE_LABEL}={recipe_key()}"]
            for value in IMAGE_ENV:
                config += ["--env", value]
            tools.buildah(*config, container)
            tools.buildah(
                "commit", "--quiet", "--format", "docker", container, settings.STANDIN_IMAGE
            )
        finally:
            tools.remove_container(container)
    print(
        f"stand-in base: {settings.STANDIN_IMAGE} made in {time.monotonic() - started:.0f} s",
        file=sys.stderr,
    )
