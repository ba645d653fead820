"""The session design's cost model against hand-computed cases: DynamoDB's item-size and
billing rules, the index writes of each ownership change, the sizes of the items the
code builds, and the per-connection figures of one worker at the shipped defaults."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest

from benchmarks import cost_model as cm
from tests.support.timing import scaled
from wsfleet import schema
from wsfleet.checkpoint_page import encode_entries
from wsfleet.timing import OWN_CHECK_PASSES, LeaseTiming

pytestmark = pytest.mark.timeout(scaled(30))

DEFAULT = LeaseTiming.from_lease()  # lease 2.2 s, heartbeat = reconcile = 0.594 s, checkpoint 5 s
HEARTBEAT = 0.594  # 0.27 x 2.2 s


# --- billing rules ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "size"),
    [
        ({"S": "abc"}, 3),
        ({"S": "é"}, 2),  # UTF-8 bytes
        ({"N": "0"}, 1),
        ({"N": "12"}, 2),
        ({"N": "123"}, 3),
        ({"N": "1000000"}, 2),  # trailing zeros trimmed
        ({"N": "1767225600000"}, 5),  # 17672256: 8 significant digits
        ({"N": "1767225600123"}, 8),  # 13 significant digits
        ({"B": b"\x00" * 10}, 10),
        ({"SS": ["ab", "cde"]}, 5),
        ({"BOOL": True}, 1),
        ({"L": [{"S": "ab"}, {"N": "1"}]}, 3 + (2 + 1) + (2 + 1)),
        ({"M": {"k": {"S": "ab"}}}, 3 + (1 + 2 + 1)),
    ],
)
def test_value_sizes_follow_dynamodbs_rules(value: dict[str, Any], size: int) -> None:
    assert cm.value_size(value) == size


def test_item_size_counts_names_and_values() -> None:
    assert cm.item_size({"Pk": {"S": "CONN#x"}, "n": {"N": "7"}}) == (2 + 6) + (1 + 2)
    assert cm.item_size(None) == 0


@pytest.mark.parametrize(("size", "units"), [(0, 1), (1, 1), (1024, 1), (1025, 2), (12_922, 13)])
def test_a_write_costs_one_unit_per_started_kb(size: int, units: int) -> None:
    assert cm.write_units(size) == units


def test_reads_cost_per_started_4_kb_half_when_eventually_consistent() -> None:
    assert cm.read_units(0, consistent=False) == 0.5  # an empty query is still billed
    assert cm.read_units(4096, consistent=False) == 0.5
    assert cm.read_units(4097, consistent=False) == 1.0
    assert cm.read_units(27_625, consistent=False) == 3.5
    assert cm.read_units(12_922, consistent=True) == 4.0


def test_a_write_is_billed_on_the_larger_of_the_old_and_new_item() -> None:
    big = {"Pk": {"S": "PAGE#w#1"}, "Sk": {"S": "PAGE"}, "b": {"B": b"x" * 5000}}
    small = {"Pk": {"S": "PAGE#w#1"}, "Sk": {"S": "PAGE"}, "b": {"B": b"x"}}
    assert cm.write_cost(big, small).table == 5
    assert cm.write_cost(small, big).table == 5
    assert cm.write_cost(None, small) == cm.WriteCost(1, {})


def test_a_failed_condition_costs_the_item_that_is_there() -> None:
    assert cm.failed_write_units(None) == 1
    assert cm.failed_write_units(cm.session_item(500)) == 1
    assert cm.failed_write_units(cm.page_item_of(500)) == 13


# --- index writes of the connection's writes ----------------------------------------------


def test_acquire_puts_a_by_owner_entry_and_deletes_the_unowned_one() -> None:
    assert cm.acquire_cost() == cm.WriteCost(
        1, {schema.OWNER_INDEX_NAME: 1, schema.UNOWNED_INDEX_NAME: 1}
    )


def test_release_does_the_reverse() -> None:
    assert cm.release_cost() == cm.WriteCost(
        1, {schema.OWNER_INDEX_NAME: 1, schema.UNOWNED_INDEX_NAME: 1}
    )


def test_a_takeover_moves_the_by_owner_key_a_delete_and_a_put() -> None:
    # The listing index (keys only, desired_state unchanged) is not written at all; the
    # table write is transactional: twice the units.
    assert cm.takeover_cost() == cm.WriteCost(2, {schema.OWNER_INDEX_NAME: 2})


def test_a_change_of_a_projected_attribute_alone_updates_the_entry() -> None:
    cid = uuid.uuid4().hex
    before = cm.connection_item(cid)
    after = dict(before, **{schema.LAST_SEQ: {"N": "5"}})
    assert cm.write_cost(before, after) == cm.WriteCost(1, {schema.OWNER_INDEX_NAME: 1})
    # ws_url is not projected anywhere: no index write.
    after = dict(before, **{schema.WS_URL: {"S": "wss://other"}})
    assert cm.write_cost(before, after) == cm.WriteCost(1, {})


def test_a_session_renew_writes_one_unit_and_no_index() -> None:
    before = cm.session_item(500)
    after = dict(before, **{schema.SESSION_EXPIRES_AT_MS: {"N": "1767225602500"}})
    assert cm.write_cost(before, after) == cm.WriteCost(1, {})


# --- the items the code builds -------------------------------------------------------------


def test_router_ids_are_uuid4_hex() -> None:
    ids = cm.uuid_hex_ids(3)
    assert ids == cm.uuid_hex_ids(3)  # reproducible
    assert all(len(i) == 32 and uuid.UUID(hex=i).version == 4 for i in ids)


def test_a_page_of_500_router_ids_packs_to_about_26_bytes_an_entry() -> None:
    entries = cm.page_entries(500)
    blob = encode_entries(entries, cm.EXAMPLE_NOW_MS)
    assert 24 * 500 < len(blob) < 28 * 500
    sizes = cm.sizes_of(500, DEFAULT)
    assert sizes.page_bytes == cm.item_size(cm.page_item_of(500))
    assert sizes.page_bytes - len(blob) < 100  # keys and the write time
    assert sizes.page_units == 13


def test_session_item_and_index_entry_sizes() -> None:
    sizes = cm.sizes_of(500, DEFAULT)
    assert 150 < sizes.session_bytes < 250
    assert sizes.renew_units == 1
    assert 150 < sizes.owner_entry_bytes < 300
    # Pending notices grow the session item; a renew still costs 1 unit up to ~13.
    assert cm.write_units(cm.item_size(cm.session_item(500, notices=13))) == 1


# --- one worker at the shipped defaults ----------------------------------------------------


def test_one_worker_of_500_at_the_defaults() -> None:
    fleet = cm.Fleet(connections=500, workers=1)
    load = cm.load_of(fleet)
    # 1 unit every 0.594 s, 13 units every 5 s.
    assert DEFAULT.heartbeat == pytest.approx(HEARTBEAT)
    assert load.writes[cm.RENEW] == pytest.approx(1 / HEARTBEAT)
    assert load.writes[cm.PAGE] == pytest.approx(13 / 5)
    # A full worker (500 of MAX_CONNECTIONS 500) does not query the unowned index.
    assert load.reads[cm.UNOWNED_QUERY] == 0.0
    # Sessions: one partition with one item (0.5), three empty ones (0.5 each).
    assert load.reads[cm.SESSION_LIST] == pytest.approx(4 * 0.5 / HEARTBEAT)
    # by-owner: 4 shards of 125 entries of ~221 B = ~27.6 KB -> 7 blocks -> 3.5 each,
    # every fourth pass.
    assert load.reads[cm.OWNER_QUERY] == pytest.approx(4 * 3.5 / (HEARTBEAT * OWN_CHECK_PASSES))


def test_report_per_connection_hour_and_month() -> None:
    result = cm.report(cm.Fleet(connections=500, workers=1), cm.Prices())
    writes = result["write_units_per_connection_hour"]
    # 6,061 renews an hour over 500 connections; 720 pages of 13 units.
    assert writes[cm.RENEW] == pytest.approx(3600 / HEARTBEAT / 500, abs=0.01)
    assert writes[cm.PAGE] == pytest.approx(720 * 13 / 500, abs=0.01)
    assert writes["total"] == pytest.approx(30.84, abs=0.01)
    reads = result["read_units_per_connection_hour"]
    assert reads["total"] == pytest.approx(
        (2 + 14 / OWN_CHECK_PASSES) / HEARTBEAT * 3600 / 500, abs=0.01
    )
    # 730 h x (30.84 x $0.625 + 66.7 x $0.125) / 1e6
    assert result["per_connection_month_usd_on_demand"] == pytest.approx(0.0202, abs=0.0001)
    assert result["write_units"] == {"acquire": 3, "release": 3, "takeover_per_connection": 4}


def test_churn_costs_an_acquire_and_a_release_per_move() -> None:
    still = cm.load_of(cm.Fleet(3600, 8))
    moving = cm.load_of(cm.Fleet(3600, 8, connection_churn_per_hour=2))
    assert moving.writes[cm.OWNERSHIP] - still.writes[cm.OWNERSHIP] == pytest.approx(2 * 6)


def test_the_previous_design_figures() -> None:
    previous = cm.previous_design()
    assert previous.write_units_per_connection_hour == 2160
    assert previous.usd_per_connection_month == pytest.approx(0.9855)
    assert previous.connections_per_table == 2500


def test_monthly_cost_on_a_hand_computed_case() -> None:
    load = cm.Load(writes={"w": 600.0}, reads={"r": 0.2}, requests={})
    cost = cm.monthly_cost(load, cm.Prices())
    assert cost.on_demand_writes == pytest.approx(985.50)  # 600 x 2,628,000 s x $0.625/M
    assert cost.on_demand_reads == pytest.approx(0.0657)
    assert cost.provisioned_writes == pytest.approx(355.875)  # 750 WCU x 730 h x $0.00065
    assert cost.provisioned_reads == pytest.approx(0.0949)


def test_command_prints_a_summary_and_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert cm.main(["--connections", "500", "--workers", "1"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert any("previous design: 2,160 write units" in line for line in lines)
    printed = json.loads(lines[-1])
    assert printed["write_units_per_connection_hour"]["total"] == pytest.approx(30.84, abs=0.01)
    assert cm.main(["--connections", "500", "--workers", "1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == printed
    assert cm.main(["--checkpoint-seconds", "10", "--json"]) == 0
    slower = json.loads(capsys.readouterr().out)
    assert slower["write_units_per_connection_hour"][cm.PAGE] == pytest.approx(9.36)
