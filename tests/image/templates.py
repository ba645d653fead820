"""Templates synthesized as ``cdk synth`` makes them (cdk.json's context, cdk-nag), for
the tests that run what a deploy ships: the template as a dict and its cdk.out."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")


@dataclass(frozen=True)
class SynthesizedTemplate:
    template: dict[str, Any]
    outdir: Path


def synthesize_template(
    outdir: Path, extra_context: Mapping[str, Any] | None = None
) -> SynthesizedTemplate:
    from app import build_app
    from tests.stacks.conftest import cdk_json_context

    app, stack = build_app({**cdk_json_context(), **(extra_context or {})}, outdir=str(outdir))
    assembly = app.synth()
    template: dict[str, Any] = assembly.get_stack_by_name(stack.stack_name).template
    return SynthesizedTemplate(template, outdir)
