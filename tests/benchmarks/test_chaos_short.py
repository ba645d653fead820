"""The chaos run's short version: real workers, DynamoDB Local, moto and the feed, a
seeded schedule of every fault kind for 25 s; the run must report zero violations."""

from __future__ import annotations

import json
import subprocess
from typing import Any

import pytest

from tests.support.processes import run_module
from tests.support.timing import scaled

SHORT_RUN = ["--duration", "25", "--workers", "3", "--connections", "12"]
RUN_TIMEOUT_S = scaled(200)

pytestmark = pytest.mark.fleet


def run_chaos(args: list[str]) -> subprocess.CompletedProcess[str]:
    return run_module("benchmarks.chaos", args, RUN_TIMEOUT_S)


def summary_of(stdout: str) -> dict[str, Any]:
    """The JSON summary: the last stdout line that is a JSON object."""
    for line in reversed(stdout.splitlines()):
        if line.startswith("{"):
            value = json.loads(line)
            assert isinstance(value, dict)
            return value
    raise AssertionError(f"no JSON summary in the output:\n{stdout}")


@pytest.mark.timeout(scaled(240))
def test_short_chaos_run_keeps_every_promise() -> None:
    result = run_chaos(SHORT_RUN)
    output = f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    assert result.returncode == 0, output
    summary = summary_of(result.stdout)
    assert summary["violations"] == [], output
    assert summary["stale_deliveries"] == 0
    assert summary["lost_seqs"] == 0
    assert summary["stuck_connections"] == 0
    assert summary["leases_held_after_shutdown"] == 0
    assert "violations: 0" in result.stdout
    # The run did what it says: faults applied, deliveries made, ownership moved.
    assert sum(summary["faults_applied"].values()) >= 5, summary["faults_applied"]
    assert summary["deliveries"] > 0
    assert summary["takeovers"] > 0
