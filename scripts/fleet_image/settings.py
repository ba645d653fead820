"""Names and places shared by the image commands: the cache outside the repository, the
image names, the tools."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Final

REPO_ROOT: Final = Path(__file__).resolve().parents[2]
CACHE_ENV: Final = "WSFLEET_CACHE_DIR"
"""Overrides ``~/.cache/websocket-fleet`` (``$XDG_CACHE_HOME/websocket-fleet``)."""
STANDIN_IMAGE: Final = "localhost/websocket-fleet/base-standin:bookworm"
"""The local stand-in for the Dockerfile's ``FROM`` (:mod:`scripts.fleet_image.base`)."""
WORKER_IMAGE: Final = "localhost/websocket-fleet/worker:local"
RUNC: Final = "/usr/sbin/runc"
"""crun fails on this kind of host ("cgroups in hybrid mode"); runc runs everything."""
HOST_CA_BUNDLE: Final = "/etc/ssl/certs/ca-certificates.crt"
"""Mounted read-only for the build's RUN steps only: pip inside the build then trusts
the same TLS chain as the host. Nothing of it stays in the image."""
CONTAINER_PREFIX: Final = "wsfleet-"
"""Every runc and buildah container these commands make; ``cleanup`` removes them."""


def cache_dir() -> Path:
    explicit = os.environ.get(CACHE_ENV)
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "websocket-fleet"


def storage_conf() -> Path:
    """containers-storage settings with graph and run roots in the cache (overlay)."""
    root = cache_dir() / "containers"
    conf = root / "storage.conf"
    text = (
        "[storage]\n"
        'driver = "overlay"\n'
        f'graphroot = "{root / "storage"}"\n'
        f'runroot = "{root / "run"}"\n'
    )
    if not conf.exists() or conf.read_text() != text:
        root.mkdir(parents=True, exist_ok=True)
        conf.write_text(text)
    return conf


def runc_root() -> Path:
    """runc's state directory for these containers (not the host's default)."""
    path = cache_dir() / "runc"
    path.mkdir(parents=True, exist_ok=True)
    return path


def tool_env() -> dict[str, str]:
    """The environment for buildah: this process's, with the cache's storage."""
    return {**os.environ, "CONTAINERS_STORAGE_CONF": str(storage_conf())}
