"""The worker image from the real Dockerfile over the staged context, built by buildah.

The context is staged exactly as synth stages it (:mod:`websocket_fleet.image_context`),
with or without a handler directory. ``--format docker`` keeps the ``HEALTHCHECK``
(the OCI format has no field for it); ``--layers`` keeps every step's layer in the
cache's storage, so a build without changes takes a few seconds. The ``FROM`` image
is the local stand-in (:mod:`scripts.fleet_image.base`) unless ``base`` names another.
"""

from __future__ import annotations

import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from scripts.fleet_image import settings, tools
from websocket_fleet import image_context
from wsfleet.version import VERSION


@dataclass(frozen=True, slots=True)
class BuiltImage:
    name: str
    image_id: str
    seconds: float
    base: str


def build(
    *,
    handler_dir: Path | None = None,
    tag: str = settings.WORKER_IMAGE,
    base: str = settings.STANDIN_IMAGE,
    quiet: bool = True,
) -> BuiltImage:
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="websocket-fleet-context-") as staging:
        context = image_context.stage(Path(staging) / "context", handler_dir)
        tools.buildah(
            "bud",
            *(["--quiet"] if quiet else []),
            "--layers",
            "--format",
            "docker",
            "--pull-never",
            "--from",
            base,
            "--runtime",
            settings.RUNC,
            "--isolation",
            "oci",
            # The host's network for pip (no CNI set up needed); the host's CA bundle for
            # its TLS, read-only, for the RUN steps only.
            "--network",
            "host",
            "--volume",
            f"{settings.HOST_CA_BUNDLE}:{settings.HOST_CA_BUNDLE}:ro",
            "--build-arg",
            f"{image_context.VERSION_BUILD_ARG}={VERSION}",
            "--file",
            str(context / image_context.DOCKERFILE),
            "--tag",
            tag,
            str(context),
            timeout=1200,
            quiet=quiet,
        )
    built = BuiltImage(tag, tools.image_id(tag), time.monotonic() - started, base)
    print(
        f"image: {tag} ({built.image_id[:12]}) built in {built.seconds:.1f} s from "
        f"worker/Dockerfile on {base}"
        + (
            " (the local stand-in base, not the official python image)"
            if base == settings.STANDIN_IMAGE
            else ""
        ),
        file=sys.stderr,
    )
    return built
