"""The simulator as the test command runs it: a short run of seeds (and every
regression seed) must find no violation, one seed replays to the same trace in a
fresh process, and a broken fence is found."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sim.__main__ import OPEN_FINDINGS, seeds_in

ROOT = Path(__file__).resolve().parents[2]
SEEDS = int(os.environ.get("SIM_SEEDS", "8"))
"""Seeds of the short run (``SIM_SEEDS``), for pytest on its own; the test command runs
120 beside pytest (scripts/test.sh)."""


def run(*args: str, cwd: Path = ROOT, env: dict[str, str] | None = None) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-m", *args],
        cwd=cwd,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.stdout, done.stderr
    lines = done.stdout.strip().splitlines()
    summary: dict[str, object] = json.loads(lines[-1])
    summary["output"] = "\n".join(lines[:-1])
    return summary


@pytest.mark.timeout(1800)
def test_the_short_run_and_every_regression_seed_find_no_violation() -> None:
    summary = run("sim", "--seeds", str(SEEDS), "--first-seed", "1", "--regressions", "--skip-open")
    assert summary["violations"] == 0, summary["output"]
    assert summary["seeds"] >= SEEDS - len(seeds_in(OPEN_FINDINGS))


@pytest.mark.timeout(600)
def test_the_open_findings_still_fail() -> None:
    """A seed of sim/open_findings.txt that passes has been fixed (or no longer reaches
    its fault): move it to regressions.txt, with the fix's test."""
    if not seeds_in(OPEN_FINDINGS):
        pytest.skip("no open findings")
    for seed in seeds_in(OPEN_FINDINGS):
        summary = run("sim", "--seeds", "1", "--first-seed", str(seed))
        assert summary["violations"], f"open finding seed {seed} passes now"


@pytest.mark.timeout(300)
def test_a_seed_replays_to_the_same_trace_in_a_fresh_process() -> None:
    args = ("sim", "--seeds", "1", "--first-seed", "4", "--duration", "60", "--faults", "12")
    first, second = run(*args), run(*args)
    assert first["trace_hash"] == second["trace_hash"]
    assert first["seeds"] == 1
    other = run("sim", "--seeds", "1", "--first-seed", "5", "--duration", "60", "--faults", "12")
    assert other["trace_hash"] != first["trace_hash"]


@pytest.mark.timeout(900)
def test_a_dropped_fence_check_is_found() -> None:
    summary = run("sim.recall", "--only", "fence check dropped", "--seeds", "20")
    assert summary["found"] == 1, summary["output"]
