"""The chaos run's short version: real workers, DynamoDB Local, moto and the feed, a
seeded schedule of every fault kind for 25 s; the run must report zero violations."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
SHORT_RUN = ["--duration", "25", "--workers", "3", "--connections", "12"]
RUN_TIMEOUT_S = 200

pytestmark = pytest.mark.fleet


def run_chaos(args: list[str]) -> subprocess.CompletedProcess[str]:
    """Run the chaos run to completion; on a hang, stop it before failing."""
    process = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.chaos", *args],
        cwd=REPO_ROOT,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        out, err = process.communicate(timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        out, err = interrupt(process)
        pytest.fail(f"chaos run did not finish in {RUN_TIMEOUT_S} s\n{out}\n{err}")
    except BaseException:  # the test's own timeout, Ctrl-C: stop the run first
        interrupt(process)
        raise
    return subprocess.CompletedProcess(process.args, process.returncode, out, err)


def interrupt(process: subprocess.Popen[str]) -> tuple[str, str]:
    """SIGINT (the run stops its children in order), then SIGKILL after 30 s."""
    process.send_signal(signal.SIGINT)
    try:
        return process.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        return process.communicate()


def summary_of(stdout: str) -> dict[str, Any]:
    """The JSON summary: the last stdout line that is a JSON object."""
    for line in reversed(stdout.splitlines()):
        if line.startswith("{"):
            value = json.loads(line)
            assert isinstance(value, dict)
            return value
    raise AssertionError(f"no JSON summary in the output:\n{stdout}")


@pytest.mark.timeout(240)
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
