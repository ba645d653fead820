"""The fleet balance benchmark's pure parts: the balance of a table, the moves between
two of them, the pause of a moved connection, the delivery lag against a stream's
schedule, the EMF sums and the compact delivery log with its audit."""

from __future__ import annotations

from typing import Any

import pytest

from benchmarks.rebalance import (
    DeliveryLog,
    Holder,
    acquired_by_second,
    audit,
    counts_per_worker,
    emf_sum,
    emf_values,
    epochs_gained,
    flush_at_or_after,
    flush_before,
    imbalance,
    move_gap,
    owner_changes,
    schedule_lags,
    streams,
)
from local_stack.audit import Record
from tests.support.timing import scaled

pytestmark = pytest.mark.timeout(scaled(30))


def held(*owners: str | None, epoch: int = 1) -> dict[str, Holder]:
    return {f"c{i}": Holder(owner, epoch) for i, owner in enumerate(owners)}


def emf(at_ms: int, moved: Any) -> dict[str, Any]:
    return {"_aws": {"Timestamp": at_ms, "CloudWatchMetrics": []}, "ConnectionsMoved": moved}


def rec(cid: str, seq: int, t: float, *, worker: str = "w1", epoch: int = 1) -> Record:
    return Record(worker=worker, connection_id=cid, epoch=epoch, seq=seq, t=t)


# --- the balance of a table ---------------------------------------------------------------


def test_counts_list_every_worker_even_one_holding_nothing() -> None:
    holders = held("w1", "w1", "w2", None)
    assert counts_per_worker(holders, ["w1", "w2", "w3"]) == {"w1": 2, "w2": 1, "w3": 0}


def test_imbalance_is_the_busiest_over_the_mean_of_every_connection() -> None:
    holders = held(*["w1"] * 11, *["w2"] * 10, *["w3"] * 10, *["w4"] * 9)
    assert imbalance(holders, ["w1", "w2", "w3", "w4"]) == pytest.approx(1.1)
    assert imbalance(held("w1", "w1"), ["w1", "w2"]) == pytest.approx(2.0)


@pytest.mark.parametrize(
    "owners",
    [
        ("w1", "w2", None),  # released, not taken yet
        ("w1", "w2", "gone"),  # held by a worker not counted
    ],
)
def test_imbalance_is_unknown_while_a_connection_is_not_held_by_the_workers(
    owners: tuple[str | None, ...],
) -> None:
    assert imbalance(held(*owners), ["w1", "w2"]) is None


def test_imbalance_of_nothing_is_unknown() -> None:
    assert imbalance({}, ["w1"]) is None
    assert imbalance(held("w1"), []) is None


# --- moves between two tables ---------------------------------------------------------------


def test_owner_changes_count_connections_whose_owner_differs() -> None:
    before = {"a": Holder("w1", 1), "b": Holder("w1", 1), "c": Holder("w2", 4)}
    after = {"a": Holder("w3", 2), "b": Holder("w1", 1), "c": Holder("w4", 5), "d": Holder("w1", 1)}
    assert owner_changes(before, after) == ["a", "c"]


def test_epochs_gained_count_a_move_away_and_back() -> None:
    before = {"a": Holder("w1", 1), "b": Holder("w1", 3)}
    after = {"a": Holder("w1", 3), "b": Holder("w1", 3)}  # a: to w3 and back to w1
    assert owner_changes(before, after) == []
    assert epochs_gained(before, after) == 2


def test_epochs_gained_ignore_connections_listed_once() -> None:
    assert epochs_gained({"a": Holder("w1", 1)}, {"b": Holder("w2", 9)}) == 0


# --- the pause of a moved connection -----------------------------------------------------------


def ticks(start: float, end: float, step: float, epoch: int) -> list[tuple[float, int]]:
    count = round((end - start) / step)
    return [(round(start + i * step, 6), epoch) for i in range(count + 1)]


def test_the_move_gap_is_the_pause_between_the_two_owners() -> None:
    deliveries = ticks(0.0, 10.0, 0.1, 1) + ticks(10.8, 20.0, 0.1, 2)
    assert move_gap(deliveries, 1, 2) == pytest.approx(0.8)


def test_the_move_gap_takes_a_slow_start_of_the_new_owner() -> None:
    deliveries = [*ticks(0.0, 10.0, 0.1, 1), (10.3, 2), (10.9, 2), *ticks(11.0, 12.0, 0.1, 2)]
    assert move_gap(deliveries, 1, 2) == pytest.approx(0.6)


def test_the_move_gap_looks_only_around_the_move() -> None:
    # A longer pause long before the move (a reconnect) is not the move's.
    deliveries = [(0.0, 1), (5.0, 1), *ticks(5.1, 10.0, 0.1, 1), *ticks(10.4, 12.0, 0.1, 2)]
    assert move_gap(deliveries, 1, 2) == pytest.approx(0.4)
    assert move_gap(deliveries, 1, 2, margin=10.5) == pytest.approx(5.0)


def test_the_move_gap_spans_a_move_through_another_owner() -> None:
    deliveries = [*ticks(0.0, 5.0, 0.1, 1), (5.5, 2), *ticks(6.5, 8.0, 0.1, 3)]
    assert move_gap(deliveries, 1, 3) == pytest.approx(1.0)


def test_the_move_gap_needs_deliveries_by_both_owners() -> None:
    assert move_gap(ticks(0.0, 1.0, 0.1, 1), 1, 2) is None
    assert move_gap(ticks(0.0, 1.0, 0.1, 2), 1, 2) is None


def test_the_move_gap_reads_deliveries_in_any_order() -> None:
    deliveries = ticks(0.0, 2.0, 0.1, 1) + ticks(2.5, 4.0, 0.1, 2)
    assert move_gap(list(reversed(deliveries)), 1, 2) == pytest.approx(0.5)


# --- the delivery lag against the stream's schedule --------------------------------------------


def test_a_stream_on_schedule_has_no_lag() -> None:
    deliveries = [(100.0 + (seq - 1) / 10, 1, seq) for seq in range(1, 51)]
    assert max(lag for _, lag in schedule_lags(deliveries, 10.0)) == pytest.approx(0.0, abs=1e-9)


def test_a_stream_that_falls_behind_shows_its_delay() -> None:
    on_time = [(100.0 + (seq - 1) / 10, 1, seq) for seq in range(1, 11)]
    late = [(100.0 + (seq - 1) / 10 + 0.7, 1, seq) for seq in range(11, 21)]
    lags = dict(schedule_lags(on_time + late, 10.0))
    assert lags[101.0 + 0.7] == pytest.approx(0.7)
    assert max(lags.values()) == pytest.approx(0.7)


def test_each_owner_has_a_schedule_of_its_own() -> None:
    # The new owner resumes from seq 21 at t = 105: on its own schedule, not late.
    first = [(100.0 + (seq - 1) / 10, 1, seq) for seq in range(1, 21)]
    second = [(105.0 + (seq - 21) / 10, 2, seq) for seq in range(21, 41)]
    assert max(lag for _, lag in schedule_lags(first + second, 10.0)) == pytest.approx(
        0.0, abs=1e-9
    )


def test_the_earliest_delivery_sets_the_schedule_even_when_the_first_is_late() -> None:
    deliveries = [(100.45, 1, 1), *[(100.0 + (seq - 1) / 10, 1, seq) for seq in range(2, 30)]]
    lags = dict(schedule_lags(deliveries, 10.0))
    assert lags[100.45] == pytest.approx(0.45)
    assert min(lags.values()) == pytest.approx(0.0, abs=1e-9)


def test_a_reconnect_opens_a_stream_with_a_schedule_of_its_own() -> None:
    # The same owner reconnects at t = 103 after a 1 s pause and resumes from seq 21.
    first = [(100.0 + (seq - 1) / 10, 1, seq) for seq in range(1, 21)]
    again = [(103.0 + (seq - 21) / 10, 1, seq) for seq in range(21, 41)]
    deliveries = first + again
    assert max(lag for _, lag in schedule_lags(deliveries, 10.0)) == pytest.approx(1.0)
    split = streams(deliveries, [99.9, 102.95])
    assert max(lag for _, lag in schedule_lags(split, 10.0)) == pytest.approx(0.0, abs=1e-9)


def test_streams_tell_owners_and_reconnects_apart() -> None:
    deliveries = [(1.0, 1, 1), (2.5, 1, 2), (3.5, 2, 3), (4.5, 2, 4)]
    numbered = streams(deliveries, [0.5, 2.0, 3.0, 4.0])
    keys = [stream for _, stream, _ in numbered]
    assert len(set(keys)) == 4
    assert [(t, seq) for t, _, seq in numbered] == [(1.0, 1), (2.5, 2), (3.5, 3), (4.5, 4)]
    # Without connect times, one stream per epoch.
    assert len({stream for _, stream, _ in streams(deliveries, [])}) == 2


def test_schedule_lags_need_a_rate() -> None:
    with pytest.raises(ValueError, match="rate"):
        schedule_lags([(1.0, 1, 1)], 0.0)


# --- EMF sums ------------------------------------------------------------------------------------


def test_emf_values_read_a_number_or_a_list() -> None:
    assert emf_values(emf(1, 3), "ConnectionsMoved") == 3.0
    assert emf_values(emf(1, [2, 5]), "ConnectionsMoved") == 7.0
    assert emf_values({"_aws": {"Timestamp": 1}}, "ConnectionsMoved") == 0.0
    assert emf_values(emf(1, True), "ConnectionsMoved") == 0.0


def test_emf_sum_counts_the_flushes_in_the_half_open_window() -> None:
    events = [
        emf(1000, 1),
        {"message": "balance round", "moved": 50},  # a log line, not a document
        emf(2000, [2]),
        emf(3000, 4),
        emf(4000, 8),
    ]
    assert emf_sum(events, "ConnectionsMoved", 1000, 3000) == 6
    assert emf_sum(events, "ConnectionsMoved", None, None) == 15
    assert emf_sum(events, "ConnectionsMoved", 3000, None) == 8
    assert emf_sum(events, "ConnectionsMoved", None, 1000) == 1


def test_flush_boundaries() -> None:
    events = [emf(1000, 0), emf(2000, 0), emf(3000, 0)]
    assert flush_at_or_after(events, 2000) == 2000
    assert flush_at_or_after(events, 2001) == 3000
    assert flush_at_or_after(events, 3001) is None
    assert flush_before(events, 2000) == 1000
    assert flush_before(events, 1000) is None


def test_consecutive_windows_count_every_flush_once() -> None:
    events = [emf(ms, 1) for ms in range(1000, 11000, 1000)]
    launched, converged, ended = 2500, 6200, 9100
    first = emf_sum(
        events,
        "ConnectionsMoved",
        flush_before(events, launched),
        flush_at_or_after(events, converged),
    )
    second = emf_sum(
        events,
        "ConnectionsMoved",
        flush_at_or_after(events, converged),
        flush_at_or_after(events, ended),
    )
    # (2000, 7000] and (7000, 10000]
    assert (first, second) == (5, 3)


# --- the compact delivery log and its audit ---------------------------------------------------


def test_the_log_gives_back_each_connections_records() -> None:
    log = DeliveryLog()
    records = [rec("a", 1, 1.0), rec("b", 1, 1.1, worker="w2"), rec("a", 2, 1.2, epoch=2)]
    assert log.add(records) == 3
    assert log.connection_ids() == ["a", "b"]
    assert log.records("a") == [records[0], records[2]]
    assert log.records("b") == [records[1]]
    assert log.records("c") == []
    assert log.timed("a") == [(1.0, 1, 1), (1.2, 2, 2)]
    assert log.count_between(1.0, 1.2) == 2


def test_the_log_leaves_failed_deliveries_out_of_the_timings() -> None:
    log = DeliveryLog()
    failed = Record(worker="w1", connection_id="a", epoch=1, seq=1, t=1.0, failed=True)
    log.add([failed, rec("a", 1, 1.5)])
    assert log.records("a")[0].failed
    assert log.timed("a") == [(1.5, 1, 1)]


def test_first_elsewhere_is_the_earliest_delivery_by_another_worker_after_a_time() -> None:
    log = DeliveryLog()
    log.add(
        [
            rec("a", 1, 1.0, worker="big"),
            rec("a", 2, 1.5, worker="s1"),  # before the signal
            rec("a", 3, 3.0, worker="big"),
            rec("a", 4, 4.2, worker="s2", epoch=2),
            rec("a", 5, 4.1, worker="s2", epoch=2),
        ]
    )
    found = log.first_elsewhere("a", "big", 2.0)
    assert found is not None
    assert (found.worker, found.seq) == ("s2", 5)
    assert log.first_elsewhere("a", "big", 5.0) is None


def test_the_audit_sums_duplicates_lost_seqs_and_stale_deliveries() -> None:
    log = DeliveryLog()
    log.add(
        [
            # a: clean handoff from w1 to w2
            rec("a", 1, 1.0),
            rec("a", 2, 1.1),
            rec("a", 3, 1.5, worker="w2", epoch=2),
            # b: seq 2 delivered twice, seq 4 never
            rec("b", 1, 1.0),
            rec("b", 2, 1.1),
            rec("b", 2, 1.6, worker="w2", epoch=2),
            rec("b", 3, 1.7, worker="w2", epoch=2),
            rec("b", 5, 1.8, worker="w2", epoch=2),
            # c: the old owner delivers after the new one began
            rec("c", 1, 1.0),
            rec("c", 2, 1.2, worker="w2", epoch=2),
            rec("c", 3, 1.3),
        ]
    )
    result = audit(log, ["a", "b", "c"])
    assert (result.duplicates, result.lost, result.stale) == (1, 1, 1)
    assert (result.connections_with_duplicates, result.connections_with_lost) == (1, 1)
    assert audit(log, ["a"]).as_dict() == {
        "duplicates": 0,
        "lost_seqs": 0,
        "stale_deliveries": 0,
        "connections_with_duplicates": 0,
        "connections_with_lost_seqs": 0,
    }


def test_acquired_by_second_counts_in_steps_up_to_the_last() -> None:
    assert acquired_by_second([]) == []
    assert acquired_by_second([0.5, 4.0, 6.0, 12.1]) == [[5.0, 2], [10.0, 3], [15.0, 4]]
    assert acquired_by_second([5.0]) == [[5.0, 1]]
