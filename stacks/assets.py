"""The project's code as deployable assets, each chosen by an allow-list.

Synth only copies files into cdk.out (no Docker, no bundling); the image is built at
deploy time. An allow-list keeps each asset to the code it runs, so an edit to the
README or the tests neither rebuilds the image (and rolls the fleet, handing every
lease over) nor re-uploads the function.
"""

from __future__ import annotations

from typing import Final

from aws_cdk import IgnoreMode
from aws_cdk import aws_ecr_assets as ecr_assets
from aws_cdk import aws_ecs as ecs
from aws_cdk import aws_lambda as lambda_

from stacks.settings import REPO_ROOT

WORKER_DOCKERFILE: Final = "worker/Dockerfile"
WORKER_IMAGE_FOLDERS: Final = ("worker", "wsfleet")
"""What worker/Dockerfile copies (tests check every COPY source is in the asset)."""
ROUTER_FOLDERS: Final = ("wsfleet", "lambdas")
ROUTER_HANDLER: Final = "lambdas.router.main.handler"
_BYTECODE: Final = ("**/__pycache__", "**/*.pyc")


def _allow_only(folders: tuple[str, ...]) -> list[str]:
    """Docker-style patterns: exclude everything, re-include the folders, drop bytecode."""
    return ["*", *(f"!{folder}" for folder in folders), *_BYTECODE]


def worker_image() -> ecs.ContainerImage:
    """worker/Dockerfile with the repository root as build context (its COPY paths are
    relative to the root), built for the task's x86_64 platform whatever the machine
    running ``cdk deploy``. The root .dockerignore applies as well."""
    return ecs.ContainerImage.from_asset(
        str(REPO_ROOT),
        file=WORKER_DOCKERFILE,
        exclude=_allow_only(WORKER_IMAGE_FOLDERS),
        ignore_mode=IgnoreMode.DOCKER,
        platform=ecr_assets.Platform.LINUX_AMD64,
    )


def router_code() -> lambda_.Code:
    """Only ``wsfleet/`` and ``lambdas/``: third-party code comes from the Powertools
    layer, boto3 from the runtime."""
    return lambda_.Code.from_asset(
        str(REPO_ROOT), exclude=_allow_only(ROUTER_FOLDERS), ignore_mode=IgnoreMode.DOCKER
    )
