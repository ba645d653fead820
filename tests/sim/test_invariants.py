"""The simulator's monitor: each invariant fires on the history that breaks it, and
the exceptions it documents hold (a call that will not end, a disturbed holder)."""

from __future__ import annotations

from dataclasses import dataclass

from sim.invariants import Monitor


@dataclass
class Clock:
    now: float = 0.0


def monitor(clock: Clock) -> Monitor:
    return Monitor(clock, stop_bound=1.6, dark_bound=8.0, checkpoint_bound=7.0, failover_bound=4.5)


def call(m: Monitor, worker: str, epoch: int, first: int, last: int | None = None) -> None:
    m.call_started(worker, "c1", epoch, "s0", first, first if last is None else last)
    m.call_ended(worker, "c1", returned=True)


def invariants(m: Monitor) -> list[int]:
    return [v.invariant for v in m.violations]


def test_two_workers_in_calls_of_one_connection_break_invariant_1() -> None:
    clock = Clock()
    m = monitor(clock)
    m.call_started("w1", "c1", 1, "s0", 1, 1)
    m.call_started("w2", "c1", 2, "s0", 1, 1)
    assert invariants(m) == [1]


def test_a_call_that_ignores_cancellation_is_counted_not_failed() -> None:
    clock = Clock()
    m = monitor(clock)
    m.call_started("w1", "c1", 1, "s0", 1, 1)
    m.ignores_cancellation("w1", "c1")
    m.call_started("w2", "c1", 2, "s0", 1, 1)
    assert invariants(m) == []
    assert m.zombie_overlaps == 1
    assert m.calls_in_flight("w1") == 1


def test_a_skipped_seq_breaks_invariant_2() -> None:
    m = monitor(Clock())
    call(m, "w1", 1, 1, 3)
    call(m, "w2", 2, 5)
    assert invariants(m) == [2]


def test_an_undisturbed_holders_messages_redelivered_under_a_new_epoch_break_invariant_6() -> None:
    clock = Clock(100.0)
    m = monitor(clock)
    for seq in range(1, 21):
        clock.now = 100.0 + seq
        call(m, "w1", 1, seq)
    clock.now = 125.0
    call(m, "w2", 2, 3)  # seq 3 was handled at t=103, a page at the latest by t=110
    assert invariants(m) == [6]


def test_redelivery_within_a_checkpoint_interval_or_after_a_disturbance_is_allowed() -> None:
    clock = Clock(100.0)
    m = monitor(clock)
    for seq in range(1, 21):
        clock.now = 100.0 + seq
        call(m, "w1", 1, seq)
    clock.now = 121.0
    call(m, "w2", 2, 16)  # handled at t=116: not yet covered by a page
    m.worker_disturbed("w1", 106.0, 130.0)  # e.g. partitioned from t=106
    clock.now = 122.0
    call(m, "w3", 3, 5)  # handled at t=105 by w1, disturbed before a page covered it
    for seq in range(6, 22):
        call(m, "w3", 3, seq)
    clock.now = 140.0
    call(m, "w3", 3, 21)  # the same hold again (a handler retried) is no redelivery
    assert invariants(m) == []


def test_a_crash_before_the_page_covers_a_seq_excuses_its_redelivery() -> None:
    clock = Clock(100.0)
    m = monitor(clock)
    call(m, "w1", 1, 1)
    clock.now = 103.0
    m.crashed("w1")
    clock.now = 110.0
    call(m, "w2", 2, 1)
    assert invariants(m) == []


def crash_of_a_streaming_worker(clock: Clock, room: int) -> Monitor:
    m = monitor(clock)
    m.started("c1")
    m.streaming("c1", "w1")
    call(m, "w1", 1, 1)
    clock.now = 10.0
    m.crashed("w1", room)
    return m


def test_a_crash_failover_past_the_bound_breaks_invariant_7() -> None:
    clock = Clock()
    m = crash_of_a_streaming_worker(clock, room=10)
    clock.now = 15.0  # 5 s after the crash: past the bound of 4.5
    m.streaming("c1", "w2")
    m.check_failovers()
    assert invariants(m) == [7]


def test_a_connection_the_crashed_worker_was_giving_back_is_not_a_crash_failover() -> None:
    """A release in flight at the crash (a hand-off whose notice was never written)
    leaves the connection free, not with the dead session: no reap moves it, so the
    crash bound is not its promise (the sweep of free connections is, and invariant 3
    watches it)."""
    clock = Clock()
    m = monitor(clock)
    m.started("c1")
    m.streaming("c1", "w1")
    clock.now = 10.0
    m.crashed("w1", room=10, given_back={"c1"})
    clock.now = 16.0
    m.streaming("c1", "w2")
    m.check_failovers()
    assert invariants(m) == []
    assert m.failovers.judged == 0


def test_a_failover_within_the_bound_or_outside_its_conditions_is_not_judged_late() -> None:
    clock = Clock()
    m = crash_of_a_streaming_worker(clock, room=10)
    clock.now = 14.0
    m.streaming("c1", "w2")
    m.check_failovers()
    assert invariants(m) == []
    assert m.failovers.judged == 1
    # The survivors had no room to spare: the bound does not hold (DESIGN.md §3.11).
    m = crash_of_a_streaming_worker(clock := Clock(), room=1)
    clock.now = 30.0
    m.check_failovers()
    assert invariants(m) == []
    # Another fault in the window.
    m = crash_of_a_streaming_worker(clock := Clock(), room=10)
    m.disturbance(11.0, 13.0)
    clock.now = 30.0
    m.check_failovers()
    assert invariants(m) == []


def test_a_connection_dark_until_its_stop_breaks_invariant_3() -> None:
    clock = Clock()
    m = monitor(clock)
    m.started("c1")
    call(m, "w1", 1, 1)
    clock.now = 20.0  # dark for 20 s, bound 8
    m.stopped("c1")
    assert invariants(m) == [3]


def two_delivered_by_w1(clock: Clock) -> Monitor:
    """A monitor where c1 and c2 were started and w1 delivered seq 1 of each."""
    m = monitor(clock)
    for cid in ("c1", "c2"):
        m.started(cid)
        m.call_started("w1", cid, 1, "s0", 1, 1)
        m.call_ended("w1", cid, returned=True)
    return m


def test_an_excuse_but_some_connections_leaves_their_darkness_a_violation() -> None:
    """A slow worker's DynamoDB excuses what it holds without running it, never what it
    runs (docs/DESIGN.md §3.11)."""
    clock = Clock(100.0)
    m = two_delivered_by_w1(clock)
    m.excuse(101.0, 120.0, but=frozenset({"c1"}))
    clock.now = 125.0
    m.check_streaming()
    assert [(v.invariant, v.what.split(":")[0]) for v in m.violations] == [(3, "c1")]


def test_a_slow_workers_excuse_leaves_what_it_then_runs_late_a_violation() -> None:
    """A connection handed to a slow worker after its slowness began must run there in
    time: a gap that the slow worker ends with its own delivery is not excused by its
    slowness; one another worker ends is (P2, docs/DESIGN.md §3.11)."""
    clock = Clock(100.0)
    m = two_delivered_by_w1(clock)
    m.excuse(101.0, 120.0, slow="w2")
    clock.now = 119.0
    m.call_started("w2", "c1", 2, "s0", 2, 2)  # moved to the slow worker: 18 s dark
    m.call_started("w3", "c2", 2, "s0", 2, 2)  # taken by another: the fault's
    assert [(v.invariant, v.what.split(":")[0]) for v in m.violations] == [(3, "c1")]


def test_darkness_while_the_fleet_is_still_short_of_room_is_excused() -> None:
    """A connection that finds room again while the fleet is still short of it was
    waiting for room: its shortage's excuse is open until room is back (seed 159 on
    later draws: checked at its first delivery, the excuse was not yet recorded)."""
    clock = Clock(100.0)
    m = monitor(clock)
    m.started("c1")
    call(m, "w1", 1, 1)
    m.short_since = 101.0
    clock.now = 120.0
    call(m, "w2", 2, 2)
    assert invariants(m) == []
    m.short_since = None
    clock.now = 140.0
    call(m, "w2", 2, 3)
    assert invariants(m) == [3]


def test_an_upstream_closed_after_the_stop_bound_breaks_invariant_4() -> None:
    clock = Clock(10.0)
    m = monitor(clock)
    m.started("c1")
    m.streaming("c1", "w1")
    call(m, "w1", 1, 1)
    m.stopped("c1")
    clock.now = 11.5  # within the 1.6 s bound
    m.stream_closed("c1", "w1")
    assert invariants(m) == []
    m.started("c1")
    m.streaming("c1", "w1")
    clock.now = 12.0
    m.stopped("c1")
    clock.now = 14.0  # 2 s after the stop, no delivery in between
    m.stream_closed("c1", "w1")
    assert invariants(m) == [4]


def test_a_late_close_is_excused_only_by_a_fault_of_its_worker() -> None:
    clock = Clock(10.0)
    m = monitor(clock)
    m.started("c1")
    m.streaming("c1", "w1")
    m.stopped("c1")
    m.disturbance(10.5, 14.0)
    m.worker_disturbed("w2", 10.5, 14.0)  # another worker's fault does not excuse it
    clock.now = 15.0
    m.stream_closed("c1", "w1")
    assert invariants(m) == [4]
    m.started("c1")
    m.streaming("c1", "w1")
    m.stopped("c1")
    m.worker_disturbed("w1", 15.5, 18.0)  # the owner partitioned, say
    clock.now = 19.0
    m.stream_closed("c1", "w1")
    assert invariants(m) == [4]


def test_a_late_close_after_a_call_that_ignored_cancellation_is_excused() -> None:
    clock = Clock(10.0)
    m = monitor(clock)
    m.started("c1")
    m.streaming("c1", "w1")
    m.call_started("w1", "c1", 1, "s0", 1, 1)
    m.ignores_cancellation("w1", "c1")
    m.stopped("c1")
    clock.now = 20.0
    m.call_ended("w1", "c1", returned=True)
    m.stream_closed("c1", "w1")
    assert invariants(m) == []
