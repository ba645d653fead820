"""The scale model of the session design: the hottest partition keys at 100,000 and
1,000,000 connections, and connections per table, against hand-computed figures."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from benchmarks import cost_model as cm
from benchmarks.scale_model import (
    READ_LIMIT,
    WRITE_LIMIT,
    Scale,
    connections_per_table,
    fits,
    hot_keys,
    main,
    takeover_write_units,
)
from tests.support.timing import scaled
from wsfleet import schema

pytestmark = pytest.mark.timeout(scaled(30))

SCALE = Scale()  # 100,000 connections, 500 per worker, shipped timing (heartbeat 0.594 s)
HEARTBEAT = 0.594


def test_half_a_partition_is_the_limit() -> None:
    assert WRITE_LIMIT == 500.0
    assert READ_LIMIT == 1500.0


def test_session_partitions_at_100k() -> None:
    keys = {k.name: k for k in hot_keys(SCALE)}
    sessions = keys["SESSIONS#n"]
    # 200 workers over 4 partitions: 50 renews of 1 unit every 0.594 s.
    assert sessions.steady_writes == pytest.approx(50 / HEARTBEAT)
    # Plus the reap of the dead session during a takeover.
    assert sessions.takeover_writes == pytest.approx(50 / HEARTBEAT + 1)
    # 200 workers list each partition every 0.594 s; 50 sessions of ~180 B: 3 blocks (1.5).
    assert sessions.steady_reads == pytest.approx(200 / HEARTBEAT * 1.5)


def test_a_takeover_writes_each_by_owner_key_once_per_connection() -> None:
    owner = {k.name: k for k in hot_keys(SCALE)}["<worker>#<gen>#<n>"]
    assert owner.where == schema.OWNER_INDEX_NAME
    assert owner.steady_writes == 0.0
    assert owner.takeover_writes == pytest.approx(125.0)  # 500 / 4 shards, in 1 s


def test_nothing_else_is_written_in_steady_state_without_churn() -> None:
    keys = {k.name: k for k in hot_keys(SCALE)}
    assert keys["PAGE#<worker>#<gen>"].steady_writes == pytest.approx(13 / 5)
    for name in ("CONN#<id>", "FREE#n", "STARTED", "<worker>#<gen>#<n>"):
        assert keys[name].steady_writes == 0.0
    churning = {k.name: k for k in hot_keys(replace(SCALE, churn_per_hour=3.6))}
    # 100 starts a second: 100 writes on STARTED, 200 index writes over 8 FREE shards.
    assert churning["STARTED"].steady_writes == pytest.approx(100.0)
    assert churning["FREE#n"].steady_writes == pytest.approx(25.0)


def test_100k_fits_and_1m_does_not() -> None:
    assert fits(SCALE)
    assert fits(SCALE, reads=True)
    million = replace(SCALE, connections=1_000_000)
    assert not fits(million)
    assert not fits(million, reads=True)


def test_connections_per_table() -> None:
    # Writes: ceil(W / 4) / 0.594 < 500 -> at most 296 sessions a partition -> 1,184 workers.
    assert connections_per_table(SCALE) == 1_184 * 500
    with_reads = connections_per_table(SCALE, reads=True)
    assert 100_000 <= with_reads < connections_per_table(SCALE)
    assert fits(replace(SCALE, connections=with_reads), reads=True)
    assert not fits(replace(SCALE, connections=with_reads + 500), reads=True)


def test_a_bigger_worker_holds_more_per_table() -> None:
    bigger = replace(SCALE, per_worker=1000, capacity=1000)
    assert connections_per_table(bigger) > connections_per_table(SCALE)
    # ... until a takeover of 4,000 connections writes 1,000 a second on a by-owner key.
    huge = replace(SCALE, per_worker=4000, capacity=4000)
    assert connections_per_table(huge) == 0


def test_taking_over_a_dead_worker() -> None:
    # 500 x (2 transactional table + 2 by-owner) + the reap (1) + forgetting the
    # session (1) and its page (13).
    assert takeover_write_units(SCALE) == 4 * 500 + 1 + 1 + 13


def test_per_connection_cost_grows_with_the_fleet_through_the_session_listing() -> None:
    small = cm.report(SCALE.fleet(), cm.Prices())
    large = cm.report(replace(SCALE, connections=1_000_000).fleet(), cm.Prices())
    assert small["write_units_per_connection_hour"] == large["write_units_per_connection_hour"]
    listing = cm.SESSION_LIST
    assert (
        large["read_units_per_connection_hour"][listing]
        > 5 * small["read_units_per_connection_hour"][listing]
    )


def test_command_prints_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--connections", "100000"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    printed = json.loads(lines[-1])
    assert printed["workers"] == 200
    assert printed["fits_writes"] is True
    assert printed["connections_per_table"] == 592_000
    assert printed["previous_design"]["connections_per_table"] == 2_500
    assert printed["hot_keys"][0]["key"] == "SESSIONS#n"
    assert any("connections per table: 592,000" in line for line in lines)
