"""One synthesized app for all stack tests: cdk.json's context (feature flags and the
default environment), cdk-nag applied, assets staged into a temporary cdk.out."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

# jsii prints a banner on Node 20 unless told not to; set before aws_cdk starts it.
os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")

from aws_cdk.assertions import Template

from app import build_app
from stacks.settings import REPO_ROOT, FleetSettings


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "cdk: synthesizes the CDK app (offline, no Docker)")


def cdk_json_context() -> dict[str, Any]:
    """What the CDK CLI passes to the app; ``python app.py`` alone would not read it."""
    context: dict[str, Any] = json.loads((REPO_ROOT / "cdk.json").read_text())["context"]
    return context


@dataclass(frozen=True)
class Synthesized:
    template: Template
    """The stack's template, as CloudFormation receives it."""
    resources: dict[str, Any]
    outdir: Path
    settings: FleetSettings


def synthesize(context: dict[str, Any], outdir: Path) -> Synthesized:
    """Synthesize like ``cdk synth``; raises when cdk-nag reports an unacknowledged finding."""
    app, stack = build_app(context, outdir=str(outdir))
    assembly = app.synth()
    template_json = assembly.get_stack_by_name(stack.stack_name).template
    return Synthesized(
        template=Template.from_json(template_json),
        resources=template_json["Resources"],
        outdir=outdir,
        settings=stack.settings,
    )


@pytest.fixture(scope="session")
def synth(tmp_path_factory: pytest.TempPathFactory) -> Synthesized:
    return synthesize(cdk_json_context(), tmp_path_factory.mktemp("cdk.out"))
