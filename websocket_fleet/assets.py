"""The project's code as deployable assets, each staged from exactly what it runs.

Synth only copies files into cdk.out (no Docker, no bundling); the image is built at
deploy time. Each asset is staged into a directory of its own holding only its code,
so an edit to the README or the tests neither rebuilds the image (and rolls the fleet,
handing every lease over) nor re-uploads the function, and so that the same code is
found whether this package runs from a checkout or from a pip installation
(:mod:`websocket_fleet.sources`). The staging directories are temporary: CDK copies
each into the cloud assembly under its content hash.
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
from pathlib import Path
from typing import Final

from aws_cdk import aws_ecr as ecr
from aws_cdk import aws_ecr_assets as ecr_assets
from aws_cdk import aws_ecs as ecs
from aws_cdk import aws_lambda as lambda_
from constructs import Construct

from websocket_fleet import image_context
from websocket_fleet.handler import ECR_URI, WorkerHandler
from websocket_fleet.sources import project_sources
from wsfleet.version import VERSION

ROUTER_FOLDERS: Final = ("wsfleet", "lambdas")
ROUTER_HANDLER: Final = "lambdas.router.main.handler"


def _staging_dir(prefix: str) -> Path:
    path = Path(tempfile.mkdtemp(prefix=f"websocket-fleet-{prefix}-"))
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


def worker_image(scope: Construct, handler: WorkerHandler | None) -> ecs.ContainerImage:
    """The handler's own image, or worker/Dockerfile over the staged context
    (:mod:`websocket_fleet.image_context`), built for the task's x86_64 platform
    whatever the machine running ``cdk deploy``."""
    if handler is not None and handler.image_uri is not None:
        return _user_image(scope, handler.image_uri)
    context = image_context.stage(
        _staging_dir("image"), handler.directory if handler is not None else None
    )
    return ecs.ContainerImage.from_asset(
        str(context),
        file=image_context.DOCKERFILE,
        platform=ecr_assets.Platform.LINUX_AMD64,
        build_args={image_context.VERSION_BUILD_ARG: VERSION},
    )


def _user_image(scope: Construct, uri: str) -> ecs.ContainerImage:
    """An ECR image through its repository, so that the execution role may pull it;
    any other registry's by name."""
    match = ECR_URI.fullmatch(uri)
    if match is None:
        return ecs.ContainerImage.from_registry(uri)
    partition = "aws-cn" if match["cn"] else "aws"
    repository = ecr.Repository.from_repository_attributes(
        scope,
        "HandlerImageRepository",
        repository_arn=f"arn:{partition}:ecr:{match['region']}:{match['account']}:repository/"
        f"{match['repository']}",
        repository_name=match["repository"],
    )
    return ecs.ContainerImage.from_ecr_repository(
        repository, match["digest"] or match["tag"] or "latest"
    )


def router_code() -> lambda_.Code:
    """Only ``wsfleet/`` and ``lambdas/``: third-party code comes from the Powertools
    layer, boto3 from the runtime."""
    sources = project_sources()
    staged = _staging_dir("router")
    ignore = shutil.ignore_patterns(*image_context.LEFT_OUT)
    shutil.copytree(sources.wsfleet, staged / "wsfleet", ignore=ignore)
    shutil.copytree(sources.lambdas, staged / "lambdas", ignore=ignore)
    return lambda_.Code.from_asset(str(staged))
