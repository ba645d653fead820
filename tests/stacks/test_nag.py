"""AWS Solutions checks (cdk-nag) run on every synth and fail it on a finding."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from aws_cdk import aws_sqs as sqs

from app import build_app
from tests.stacks.conftest import Synthesized, cdk_json_context

pytestmark = pytest.mark.cdk


def test_synth_under_cdk_nag_has_no_unacknowledged_finding(synth: Synthesized) -> None:
    # The fixture's synth would have raised on a finding; the report says why not.
    report = json.loads((synth.outdir / "validation-report.json").read_text())
    failures = [r for r in report["pluginReports"] if r.get("conclusion") == "failure"]
    assert failures == []


def test_a_finding_fails_the_synth(tmp_path: Path) -> None:
    app, stack = build_app(cdk_json_context(), outdir=str(tmp_path))
    sqs.Queue(stack, "Unencrypted", encryption=sqs.QueueEncryption.UNENCRYPTED)
    with pytest.raises(RuntimeError, match="ValidationFailed"):
        app.synth()
    report = json.loads((tmp_path / "validation-report.json").read_text())
    rules = {v["ruleName"] for r in report["pluginReports"] for v in r["violations"]}
    assert "AwsSolutions-SQS2" in rules
