"""The per-connection decisions as tables: frames, handler calls and their failures,
renews and their answers, and endings, with boundaries. No sockets, no clock."""

from __future__ import annotations

import pytest

from worker.connection_state import (
    Call,
    ConnectionState,
    Ending,
    Failure,
    Frame,
    RenewStep,
)
from wsfleet.lease_rules import RenewRefusal
from wsfleet.timing import LeaseTiming

# lease 20: heartbeat 5, skew 1, margin 2 -> fence after 17 s; drain budget 17 s
TIMING = LeaseTiming.from_lease(20)
T0 = 1000.0  # loop time of the acquire
DEADLINE = T0 + 17.0


def state(checkpoint: int = 5, *, skip: bool = False) -> ConnectionState:
    return ConnectionState(TIMING, checkpoint=checkpoint, acquired_at=T0, skip_failed_messages=skip)


def test_a_new_state_is_proven_by_its_acquire():
    s = state()
    assert s.deadline == DEADLINE
    assert s.next_renew == T0 + 5.0
    assert s.renew_wake_at() == T0 + 5.0
    assert (s.ending, s.stopping, s.call_deadline) == (None, False, DEADLINE)


@pytest.mark.parametrize(
    ("checkpoint", "seq", "verdict"),
    [
        (5, 3, Frame.DUPLICATE),
        (5, 5, Frame.DUPLICATE),
        (5, 6, Frame.NEXT),
        (5, 7, Frame.GAP),
        (5, 1000, Frame.GAP),
        (0, 0, Frame.DUPLICATE),
        (0, 1, Frame.NEXT),
        (0, 2, Frame.GAP),
    ],
)
def test_frames(checkpoint, seq, verdict):
    assert state(checkpoint).classify(seq) is verdict


@pytest.mark.parametrize(
    ("now", "call", "ending"),
    [
        (T0, Call.GO, None),
        (DEADLINE - 0.001, Call.GO, None),
        (DEADLINE, Call.FENCE, Ending.FENCED),  # at the deadline: no call
        (DEADLINE + 5, Call.FENCE, Ending.FENCED),
    ],
)
def test_the_fence_check_before_every_call(now, call, ending):
    s = state()
    assert s.before_call(now) is call
    assert s.ending is ending


@pytest.mark.parametrize("ending", list(Ending))
def test_no_call_starts_once_any_ending_is_decided(ending):
    s = state()
    assert s.end(ending, T0 + 1)
    assert s.stopping
    assert s.before_call(T0 + 1) is Call.STOP
    assert s.ending is ending  # asking again changes nothing


def test_the_checkpoint_passes_a_message_only_when_its_call_returned():
    s = state(5)
    assert s.before_call(T0 + 1) is Call.GO
    assert s.checkpoint == 5  # entered, not yet returned
    s.call_returned(6)
    assert s.checkpoint == 6


@pytest.mark.parametrize(
    ("skip", "hit_deadline", "verdict", "checkpoint", "ending"),
    [
        (False, False, Failure.RETRY, 5, None),
        (True, False, Failure.SKIP, 6, None),
        (False, True, Failure.FENCE, 5, Ending.FENCED),
        (True, True, Failure.FENCE, 5, Ending.FENCED),  # cut short: never skipped
    ],
)
def test_handler_failures(skip, hit_deadline, verdict, checkpoint, ending):
    s = state(5, skip=skip)
    assert s.call_failed(6, T0 + 1, hit_deadline=hit_deadline) is verdict
    assert (s.checkpoint, s.ending) == (checkpoint, ending)


def test_the_first_ending_wins():
    s = state()
    assert s.end(Ending.LOST, T0 + 1)
    assert not s.end(Ending.SHUTDOWN, T0 + 2)
    assert s.ending is Ending.LOST


@pytest.mark.parametrize(
    ("ending", "graceful", "releases", "loses_lease"),
    [
        (Ending.SHUTDOWN, True, True, False),
        (Ending.STOPPED, True, True, False),
        (Ending.RESTARTED, True, True, False),
        (Ending.LOST, False, False, True),
        (Ending.FENCED, False, True, True),
        (Ending.GONE, False, False, False),
        (Ending.PARKED, True, True, False),
    ],
)
def test_what_each_ending_means(ending, graceful, releases, loses_lease):
    assert (ending.graceful, ending.releases, ending.loses_lease) == (
        graceful,
        releases,
        loses_lease,
    )


@pytest.mark.parametrize(
    ("stop_at", "drain_deadline"),
    [
        (T0 + 1, DEADLINE),  # the fence deadline comes before the drain budget runs out
        (DEADLINE - 0.5, DEADLINE),
    ],
)
def test_a_graceful_ending_fixes_the_deadline_of_the_call_in_flight(stop_at, drain_deadline):
    s = state()
    s.end(Ending.SHUTDOWN, stop_at)
    assert s.call_deadline == s.drain_deadline == drain_deadline
    # A renew during the drain keeps the lease proven, but does not stretch the call.
    assert s.renewed(stop_at) is None
    assert s.deadline == stop_at + 17.0
    assert s.call_deadline == drain_deadline


def test_the_drain_budget_caps_a_long_fence_window():
    long = LeaseTiming.from_lease(120)  # fence after 102 s, drain budget 30 s
    s = ConnectionState(long, checkpoint=0, acquired_at=T0)
    s.end(Ending.STOPPED, T0 + 1)
    assert s.drain_deadline == T0 + 1 + 30.0


def test_a_lost_lease_keeps_the_fence_deadline_as_the_bound():
    s = state()
    s.end(Ending.LOST, T0 + 1)
    assert s.call_deadline == DEADLINE


@pytest.mark.parametrize(
    ("sent_at", "moved_to"),
    [
        (T0 + 5, T0 + 22),  # counted from the send, not from the reply
        (T0 + 0.001, T0 + 17.001),
        (T0, None),  # proves nothing new
        (T0 - 1, None),  # a late answer to an older renew never moves it back
    ],
)
def test_a_landed_renew_extends_the_deadline_from_its_send(sent_at, moved_to):
    s = state()
    assert s.renewed(sent_at) == moved_to
    assert s.deadline == max(DEADLINE, sent_at + 17.0)
    assert s.next_renew == sent_at + TIMING.heartbeat  # one heartbeat after the send


@pytest.mark.parametrize(
    ("now", "step", "next_renew", "ending"),
    [
        (T0 + 5, RenewStep.CONTINUE, T0 + 5 + 1.25, None),  # retry after heartbeat/4
        (DEADLINE - 0.01, RenewStep.CONTINUE, DEADLINE - 0.01 + 1.25, None),
        (DEADLINE, RenewStep.FENCE, T0 + 5, Ending.FENCED),
        (DEADLINE + 3, RenewStep.FENCE, T0 + 5, Ending.FENCED),
    ],
)
def test_a_renew_with_no_answer(now, step, next_renew, ending):
    s = state()
    assert s.renew_failed(now) is step
    assert (s.next_renew, s.ending) == (next_renew, ending)


def test_the_renewer_wakes_for_the_deadline_when_it_comes_first():
    s = state()
    s.renew_failed(DEADLINE - 0.5)  # next try would be after the deadline
    assert s.renew_wake_at() == DEADLINE
    assert not s.before_renew(DEADLINE)
    assert s.ending is Ending.FENCED


@pytest.mark.parametrize(
    ("now", "allowed"), [(T0, True), (DEADLINE - 0.001, True), (DEADLINE, False)]
)
def test_before_renew_boundaries(now, allowed):
    s = state()
    assert s.before_renew(now) is allowed
    assert s.stopping is not allowed


@pytest.mark.parametrize(
    ("refusal", "step", "ending"),
    [
        (RenewRefusal.LOST, RenewStep.END, Ending.LOST),
        (RenewRefusal.STOPPED, RenewStep.END, Ending.STOPPED),
        (RenewRefusal.RESTARTED, RenewStep.END, Ending.RESTARTED),
        (RenewRefusal.GONE, RenewStep.END, Ending.GONE),
        (RenewRefusal.SUPERSEDED, RenewStep.CONTINUE, None),
    ],
)
def test_what_a_refused_renew_means(refusal, step, ending):
    s = state()
    assert s.renew_refused(refusal, T0 + 5, T0 + 5.1) is step
    assert s.ending is ending
    assert s.deadline == DEADLINE  # a refusal proves nothing
    assert s.next_renew == T0 + 10


def test_a_refusal_during_a_drain_keeps_the_first_ending():
    s = state()
    s.end(Ending.SHUTDOWN, T0 + 1)
    assert s.renew_refused(RenewRefusal.LOST, T0 + 5, T0 + 5.1) is RenewStep.END
    assert s.ending is Ending.SHUTDOWN
