"""The CDK app: one stack over the WebSocketFleet construct, for the environment
chosen in context.

    npx cdk synth                          # the prod environment of cdk.json
    npx cdk deploy -c fleet:environment=dev
    npx cdk deploy -c fleet:minTasks=3     # one setting, any environment
    npx cdk deploy -c handlerDir=../my-handler -c workerHandler=my_sink:factory
    npx cdk deploy -c 'workerSettings={"HANDLER_ERRORS": "skip"}'

Every synth runs AWS's Solutions rule pack (cdk-nag); an unacknowledged finding fails
it. Settings and their defaults: stacks/settings.py and docs/DEPLOY.md.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import aws_cdk as cdk
from cdk_nag import AwsSolutionsChecks

from stacks.fleet_stack import WebSocketFleetStack
from stacks.settings import settings_from_context

CDK_JSON = Path(__file__).resolve().parent / "cdk.json"


def build_app(
    context: Mapping[str, Any] | None = None, *, outdir: str | None = None, nag: bool = True
) -> tuple[cdk.App, WebSocketFleetStack]:
    """The app and its stack, built from ``context`` (tests pass cdk.json's).

    Under the CDK CLI the context (cdk.json, cdk.context.json, ``-c``) arrives from the
    CLI. ``python app.py`` on its own would see none, feature flags included, and build
    a different template; it reads cdk.json instead."""
    if context is None and "CDK_OUTDIR" not in os.environ:
        context = json.loads(CDK_JSON.read_text(encoding="utf-8"))["context"]
    app = cdk.App(context=dict(context) if context is not None else None, outdir=outdir)
    settings = settings_from_context(app.node)
    stack = WebSocketFleetStack(
        app,
        settings.stack_name,
        settings=settings,
        description=f"WebSocket fleet coordinated by DynamoDB leases ({settings.environment})",
    )
    cdk.Tags.of(stack).add("project", "websocket-fleet")
    cdk.Tags.of(stack).add("environment", settings.environment)
    if nag:
        cdk.Validations.of(app).add_plugins(AwsSolutionsChecks(app))
    return app, stack


if __name__ == "__main__":
    build_app()[0].synth()
