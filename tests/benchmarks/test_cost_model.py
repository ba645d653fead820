"""The DynamoDB cost model against hand-computed cases: index write amplification, the
index partition limit, on-demand and provisioned arithmetic."""

from __future__ import annotations

import json

import pytest

from benchmarks.cost_model import (
    GSI_PARTITION_WRITES_PER_SECOND,
    HOURS_PER_MONTH,
    INDEX_WRITES_PER_RENEW,
    Fleet,
    Prices,
    index_saturation_connections,
    load_of,
    main,
    monthly_cost,
    report,
)
from tests.support.timing import scaled
from wsfleet.timing import LeaseTiming

pytestmark = pytest.mark.timeout(scaled(30))

DEFAULT = LeaseTiming.from_lease(20.0)  # heartbeat 5 s, reconcile 5 s


def test_every_renew_costs_one_table_write_and_two_index_writes() -> None:
    assert INDEX_WRITES_PER_RENEW == 2
    load = load_of(Fleet(connections=100, workers=1, timing=DEFAULT))
    assert load.renews_per_second == pytest.approx(20.0)  # 100 / 5 s
    assert load.table_writes_per_second == pytest.approx(20.0)
    assert load.index_writes_per_second == pytest.approx(40.0)
    assert load.write_units_per_second == pytest.approx(60.0)


def test_acquisitions_from_churn_move_the_index_key_too() -> None:
    load = load_of(Fleet(connections=3600, workers=1, timing=DEFAULT, connection_churn_per_hour=2))
    acquires = 3600 * 2 / 3600  # 2 per second
    assert load.table_writes_per_second == pytest.approx(720 + acquires)
    assert load.index_writes_per_second == pytest.approx(2 * (720 + acquires))


@pytest.mark.parametrize(
    ("lease", "connections"),
    [(20.0, 2_500), (40.0, 5_000), (8.0, 1_000)],
)
def test_the_started_index_partition_saturates(lease: float, connections: int) -> None:
    timing = LeaseTiming.from_lease(lease)
    assert index_saturation_connections(timing) == connections
    # At that size the index receives exactly one partition's worth of writes.
    load = load_of(Fleet(connections=connections, workers=1, timing=timing))
    assert load.index_writes_per_second == pytest.approx(GSI_PARTITION_WRITES_PER_SECOND)


def test_reads_are_one_half_unit_query_per_worker_per_reconcile() -> None:
    load = load_of(Fleet(connections=10, workers=4, timing=DEFAULT))
    assert load.reads_per_second == pytest.approx(0.5 * 4 / 5)


def test_monthly_cost_on_a_hand_computed_case() -> None:
    # 1,000 connections, heartbeat 5 s: 200 renews/s -> 200 table + 400 index = 600 WCU/s.
    # Month: 730 h = 2,628,000 s.
    load = load_of(Fleet(connections=1_000, workers=2, timing=DEFAULT))
    cost = monthly_cost(load, Prices())
    assert HOURS_PER_MONTH == 730.0
    # On-demand: 600 x 2,628,000 = 1,576.8 M write units x $0.625 = $985.50.
    assert cost.on_demand_writes == pytest.approx(985.50)
    # Reads: 0.2 RRU/s x 2,628,000 = 0.5256 M x $0.125 = $0.0657.
    assert cost.on_demand_reads == pytest.approx(0.0657)
    # Provisioned with 25% headroom: ceil(750) WCU x 730 h x $0.00065 = $355.875.
    assert cost.provisioned_writes == pytest.approx(355.875)
    # ceil(0.25) = 1 RCU x 730 h x $0.00013 = $0.0949.
    assert cost.provisioned_reads == pytest.approx(0.0949)
    assert cost.on_demand == pytest.approx(985.5657)
    assert cost.provisioned == pytest.approx(355.9699)


def test_report_and_command_line_agree() -> None:
    fleet = Fleet(connections=1_000, workers=2, timing=DEFAULT)
    result = report(fleet, Prices())
    assert result["write_units_per_second"] == 600.0
    assert result["index_write_share"] == pytest.approx(0.667)
    assert result["index_partition_saturates_at_connections"] == 2_500
    assert result["monthly_usd"] == {
        "on_demand": 985.57,
        "provisioned": 355.97,
        "on_demand_writes": 985.5,
        "provisioned_writes": 355.88,
    }


def test_command_prints_a_table_and_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--connections", "1000", "--workers", "2"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert any("saturates at 2,500 connections" in line for line in lines)
    printed = json.loads(lines[-1])
    assert printed["monthly_usd"]["on_demand"] == 985.57
    assert main(["--connections", "1000", "--workers", "2", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == printed
