"""The chaos run's pure parts: the seeded plan, the unhandled-time figures and the
explanation of duplicates."""

from __future__ import annotations

import itertools
import random
from typing import Any

import pytest

from benchmarks.chaos_audit import (
    NO_FAULT,
    Balance,
    Fault,
    Outcome,
    audit,
    explain_duplicates,
    is_balanced,
    longest_gaps,
    render,
    stuck,
)
from benchmarks.chaos_plan import (
    FAULT_KINDS,
    UPSTREAM_FAULTS,
    Options,
    PlannedConnection,
    plan_connections,
    plan_faults,
)
from local_stack.audit import Record
from tests.support.timing import scaled
from wsfleet.timing import LeaseTiming

pytestmark = pytest.mark.timeout(scaled(30))

TIMING = LeaseTiming.from_lease(2.0)


def rec(cid: str, seq: int, t: float, *, worker: str = "w1", epoch: int = 1) -> Record:
    return Record(worker=worker, connection_id=cid, epoch=epoch, seq=seq, t=t)


def test_the_plan_is_fixed_by_the_seed() -> None:
    first = plan_faults(random.Random(3), 60, TIMING)
    again = plan_faults(random.Random(3), 60, TIMING)
    other = plan_faults(random.Random(4), 60, TIMING)
    assert first == again
    assert first != other


def test_the_first_deck_applies_every_kind_once() -> None:
    plan = plan_faults(random.Random(11), 60, TIMING)
    assert sorted(f.kind for f in plan[: len(FAULT_KINDS)]) == sorted(FAULT_KINDS)


@pytest.mark.parametrize("seed", range(5))
def test_planned_faults_fit_their_rules(seed: int) -> None:
    duration = 40.0
    plan = plan_faults(random.Random(seed), duration, TIMING)
    assert plan
    times = [f.at for f in plan]
    assert times == sorted(times)
    for before, after in itertools.pairwise(times):
        assert 0.5 * TIMING.lease - 0.01 <= after - before <= 1.5 * TIMING.lease + 0.01
    for fault in plan:
        assert fault.at + fault.hold <= duration
        if fault.kind == "sigstop":  # paused past the lease, so the leases lapse
            assert fault.hold > TIMING.lease
        if fault.kind == "delay":  # late by more than a heartbeat
            assert fault.delay > TIMING.heartbeat
            assert fault.hold > 0


def test_every_third_connection_carries_an_upstream_fault_but_never_a_gap() -> None:
    planned = plan_connections(random.Random(1), 30, 10.0)
    faulty = [p for p in planned if p.upstream_fault]
    assert len(faulty) == 10
    assert {p.upstream_fault for p in faulty} == set(UPSTREAM_FAULTS)
    assert all("gap_after" not in p.params for p in planned)
    assert all(20 <= int(p.params[p.upstream_fault]) <= 60 for p in faulty if p.upstream_fault)
    assert all(p.params["rate"] == 10.0 for p in planned)
    assert len({p.connection_id for p in planned}) == 30


def test_longest_gap_covers_start_between_and_tail() -> None:
    records = [rec("a", 1, 10.5), rec("a", 2, 11.0), rec("a", 3, 14.0), rec("b", 1, 13.0)]
    gaps = longest_gaps(records, {"a": 10.0, "b": 10.0, "c": 10.0}, until=14.5)
    assert (gaps["a"].where, gaps["a"].seconds) == ("between", pytest.approx(3.0))
    assert (gaps["b"].where, gaps["b"].seconds) == ("start", pytest.approx(3.0))
    assert (gaps["c"].where, gaps["c"].seconds) == ("start", pytest.approx(4.5))
    tail = longest_gaps([rec("d", 1, 10.1)], {"d": 10.0}, until=20.0)["d"]
    assert (tail.where, tail.seconds) == ("tail", pytest.approx(9.9))


def test_stuck_lists_connections_without_a_recent_delivery() -> None:
    records = [rec("a", 1, 5.0), rec("b", 1, 12.0)]
    assert stuck(records, ["a", "b", "c"], since=10.0) == ["a", "c"]


def test_duplicates_are_blamed_on_the_fault_that_ended_the_epoch() -> None:
    records = [
        # w1 handled 1..3 under epoch 1, was killed; w2 resumed from checkpoint 1.
        rec("a", 1, 1.0),
        rec("a", 2, 1.1),
        rec("a", 3, 1.2),
        rec("a", 2, 4.0, worker="w2", epoch=2),
        rec("a", 3, 4.1, worker="w2", epoch=2),
        # w3 handled 7 and lost its lease without any fault of ours.
        rec("b", 7, 1.0, worker="w3"),
        rec("b", 7, 5.0, worker="w2", epoch=2),
    ]
    faults = [Fault("sigkill", "w1", 1.3), Fault("blackhole", "w9", 1.0, 3.0)]
    causes = {c.cause: c for c in explain_duplicates(records, faults, lease_seconds=2.0)}
    assert causes["sigkill"].deliveries == 2
    assert causes["sigkill"].handovers == 1
    assert causes["sigkill"].max_per_handover == 2
    assert causes["sigkill"].same_epoch == 0
    assert causes[NO_FAULT].deliveries == 1


def test_a_message_handed_over_twice_is_blamed_on_each_handover() -> None:
    records = [
        rec("a", 4, 1.0),  # w1, epoch 1, then killed
        rec("a", 4, 4.0, worker="w2", epoch=2),  # w2 resumed before 4, then paused
        rec("a", 4, 8.0, worker="w3", epoch=3),
    ]
    faults = [
        Fault("scale_out", "w1", 0.5),  # starting a worker is never a cause
        Fault("sigkill", "w1", 1.2),
        Fault("sigstop", "w2", 4.5, 7.0),
    ]
    causes = {c.cause: c for c in explain_duplicates(records, faults, lease_seconds=2.0)}
    assert set(causes) == {"sigkill", "sigstop"}
    assert causes["sigkill"].deliveries == causes["sigstop"].deliveries == 1


def test_a_partition_that_began_before_the_last_messages_is_still_the_cause() -> None:
    # Cut off at 1.0, the worker kept handling until its fence deadline (1.0 < t < 2.7).
    records = [rec("a", 5, 2.5), rec("a", 5, 4.0, worker="w2", epoch=2)]
    causes = explain_duplicates(records, [Fault("blackhole", "w1", 1.0, 5.0)], lease_seconds=2.0)
    assert [(c.cause, c.deliveries) for c in causes] == [("blackhole", 1)]


def clean_audit(
    options: Options, planned: list[PlannedConnection], **overrides: Any
) -> dict[str, Any]:
    """The audit of a run where each connection handled seq 1 and nothing went wrong."""
    a, b = (p.connection_id for p in planned)
    arguments: dict[str, Any] = {
        "options": options,
        "records": [rec(a, 1, 1.0), rec(b, 1, 1.0)],
        "planned": planned,
        "started_at": {a: 0.5, b: 0.5},
        "settle_since": 0.9,
        "measured_until": 1.5,
        "outcome": Outcome(),
        "held": [],
        "connection_endings": {},
    }
    return audit(**(arguments | overrides))


def test_audit_reports_violations_and_renders_them() -> None:
    options = Options(duration=10, workers=2, connections=2)
    planned = plan_connections(random.Random(0), 2, 10.0)
    a, b = (p.connection_id for p in planned)
    records = [
        rec(a, 1, 1.0),
        rec(a, 3, 2.0),  # seq 2 lost
        rec(b, 1, 1.0),
        rec(b, 2, 3.0, worker="w2", epoch=2),
        rec(b, 3, 3.5),  # epoch 1 after epoch 2 began: stale
    ]
    result = audit(
        options=options,
        records=records,
        planned=planned,
        started_at={a: 0.5, b: 0.5},
        settle_since=1.5,
        measured_until=4.0,
        outcome=Outcome(),
        held=[],
        connection_endings={},
    )
    assert result["stale_deliveries"] == 1
    assert result["lost_seqs"] == 1
    assert len(result["violations"]) == 2
    assert "violations: 2" in render(result)
    clean = clean_audit(options, planned, connection_endings={"shutdown": 2})
    assert clean["violations"] == []
    assert "violations: 0" in render(clean)


@pytest.mark.parametrize(
    ("loads", "balanced"),
    [
        ({"w1": 15, "w2": 15, "w3": 15, "w4": 15}, True),
        ({"w1": 16, "w2": 15, "w3": 15, "w4": 14}, True),  # 16 <= ceil(16.5)
        ({"w1": 17, "w2": 15, "w3": 14, "w4": 14}, True),  # 17 = ceil(16.5)
        ({"w1": 18, "w2": 14, "w3": 14, "w4": 14}, False),
        ({"w1": 5, "w2": 4, "w3": 3}, True),  # 12 on 3: 5 = ceil(4.4), at rest
        ({"w1": 6, "w2": 3, "w3": 3}, False),
        ({"w1": 10, "w2": 10}, True),  # 1.10 x 10 is 11 in floats too, not 11.000...1
        ({"w1": 12, "w2": 8}, False),
        ({}, False),
    ],
)
def test_balanced_is_the_ratio_target_in_whole_connections(loads, balanced) -> None:
    assert is_balanced(loads) is balanced


def test_an_unbalanced_fleet_after_the_faults_is_a_violation() -> None:
    options = Options(duration=10, workers=2, connections=2)
    planned = plan_connections(random.Random(0), 2, 10.0)
    late = clean_audit(options, planned, balance=Balance(None, {"w1": 2, "w2": 0}))
    assert late["violations"] == ["not balanced 60 s after the faults: {'w1': 2, 'w2': 0}"]
    assert late["balance"] == {
        "seconds_after_faults": None,
        "max_over_mean": 2.0,
        "loads": {"w1": 2, "w2": 0},
    }
    assert "not reached" in render(late)
    on_time = clean_audit(options, planned, balance=Balance(12.345, {"w1": 1, "w2": 1}))
    assert on_time["violations"] == []
    assert on_time["balance"]["seconds_after_faults"] == 12.35
    assert "12.3 s" in render(on_time)
