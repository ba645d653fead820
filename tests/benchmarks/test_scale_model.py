"""The scale model behind docs/SCALING.md: today's design and the session design at
100,000 connections, against hand-computed figures."""

from __future__ import annotations

import json

import pytest

from benchmarks.cost_model import GSI_PARTITION_WRITES_PER_SECOND, Prices
from benchmarks.scale_model import Scale, compare, current, main, sessions, takeover_write_units
from tests.support.timing import scaled

pytestmark = pytest.mark.timeout(scaled(30))

SCALE = Scale()  # 100,000 connections, 500 per worker, lease 20 s, heartbeat 5 s


def test_current_design_at_100k() -> None:
    figures = current(SCALE, Prices())
    # 20,000 renews/s, each 1 table + 2 index writes.
    assert figures.load.write_units_per_second == pytest.approx(60_000)
    assert figures.hottest_index_partition_writes_per_second == pytest.approx(40_000)
    assert figures.hottest_index_partition_writes_per_second == 40 * GSI_PARTITION_WRITES_PER_SECOND
    # 60,000 x 2,628,000 s / 1e6 x $0.625
    assert figures.cost.on_demand_writes == pytest.approx(98_550)


def test_sessions_with_packed_pages_write_under_a_tenth() -> None:
    figures = sessions(SCALE, Prices(), packed=True)
    # 200 sessions / 5 s x (1 + 2) = 120; 200 pages of 25 KB / 5 s = 1,000.
    assert figures.load.table_writes_per_second == pytest.approx(40 + 1_000)
    assert figures.load.index_writes_per_second == pytest.approx(80)
    assert figures.load.write_units_per_second == pytest.approx(1_120)
    assert figures.load.write_units_per_second < 0.1 * 60_000
    assert figures.crash_duplicate_window_s == SCALE.timing.heartbeat
    # 40 dead-session queries/s x 0.5 + 40 owner queries/s x (40 KB / 4 KB x 0.5).
    assert figures.load.reads_per_second == pytest.approx(20 + 200)


def test_sessions_with_rare_checkpoints_trade_duplicates_for_simplicity() -> None:
    figures = sessions(SCALE, Prices(), packed=False)
    assert figures.load.write_units_per_second == pytest.approx(120 + 100_000 / 60)
    assert figures.crash_duplicate_window_s == 60.0


def test_every_design_keeps_the_failover_bound() -> None:
    bounds = {d.crash_failover_bound_s for d in compare(SCALE, Prices())}
    assert bounds == {SCALE.timing.crash_failover_bound()} == {28.0}


def test_taking_over_a_dead_worker_costs_three_units_per_connection() -> None:
    assert takeover_write_units(SCALE) == 3 * 500 + 3


def test_command_prints_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--connections", "100000"]) == 0
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    names = [d["name"] for d in printed["designs"]]
    assert names == ["current", "sessions+pages", "sessions+rare"]
    assert printed["designs"][1]["write_share_of_current"] < 0.1
