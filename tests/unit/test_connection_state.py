"""The per-connection decisions as tables: frames, handler calls at the session's
fence deadline (pause, not end), their failures, renews that move the deadline, and
endings, with boundaries. No sockets, no clock."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from worker.connection_state import Call, ConnectionState, Ending, Failure, Frame, Watch
from wsfleet.timing import LeaseTiming

# lease 2.2: heartbeat 0.594, margin 0.22 -> fence after 1.98 s; drain budget 1.98 s
TIMING = LeaseTiming.from_lease()
T0 = 1000.0  # loop time the last session renew was sent
DEADLINE = T0 + 1.98
# lease 120: fence after 108 s, drain budget 30 s (MAX_DRAIN_SECONDS)
LONG = LeaseTiming.from_lease(120, heartbeat=30, reconcile=30)


def state(checkpoint: int = 5, *, skip: bool = False) -> ConnectionState:
    return ConnectionState(
        TIMING, checkpoint=checkpoint, deadline=DEADLINE, skip_failed_messages=skip
    )


def test_a_new_state_runs_until_the_deadline_it_was_given():
    s = state()
    assert (s.ending, s.stopping) == (None, False)
    assert s.deadline == s.drain_deadline == s.call_deadline == DEADLINE
    assert s.skip_failed_messages is False
    assert ConnectionState(TIMING, 0, DEADLINE).skip_failed_messages is False


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
        (0, -1, Frame.DUPLICATE),
    ],
)
def test_frames(checkpoint, seq, verdict):
    assert state(checkpoint).classify(seq) is verdict


@pytest.mark.parametrize(
    ("now", "call"),
    [
        (T0, Call.GO),
        (DEADLINE - 0.001, Call.GO),
        (DEADLINE, Call.PAUSE),  # at the deadline: no call
        (DEADLINE + 0.001, Call.PAUSE),
        (DEADLINE + 60, Call.PAUSE),  # however long: only a reap ends it
    ],
)
def test_the_fence_check_before_every_call_pauses_at_the_deadline(now, call):
    s = state()
    assert s.before_call(now) is call
    assert s.may_handle(now) is (call is Call.GO)
    assert (s.ending, s.stopping) == (None, False)  # a pause is not an ending


@pytest.mark.parametrize("ending", list(Ending))
@pytest.mark.parametrize("now", [T0, DEADLINE + 1])
def test_no_call_starts_once_any_ending_is_decided(ending, now):
    s = state()
    assert s.end(ending, T0)
    assert s.stopping
    assert s.before_call(now) is Call.STOP  # stopping wins over pausing
    assert s.ending is ending


def test_the_checkpoint_passes_a_message_only_when_its_call_returned():
    s = state(5)
    assert s.before_call(T0 + 1) is Call.GO
    assert s.checkpoint == 5  # entered, not yet returned
    s.call_returned(6)
    assert s.checkpoint == 6


@pytest.mark.parametrize(
    ("skip", "hit_deadline", "verdict", "checkpoint"),
    [
        (False, False, Failure.RETRY, 5),
        (True, False, Failure.SKIP, 6),
        (False, True, Failure.PAUSE, 5),  # cut by the fence: not the handler's failure
        (True, True, Failure.PAUSE, 5),  # and never skipped
    ],
)
def test_handler_failures(skip, hit_deadline, verdict, checkpoint):
    s = state(5, skip=skip)
    assert s.call_failed(6, hit_deadline=hit_deadline) is verdict
    assert s.checkpoint == checkpoint
    assert s.ending is None


@pytest.mark.parametrize(
    ("sent_at", "moved_to"),
    [
        (T0 + 0.6, DEADLINE + 0.6),  # counted from the send, not from the reply
        (T0 + 0.001, DEADLINE + 0.001),
        (T0, None),  # proves nothing new
        (T0 - 1, None),  # a late answer to an older renew never moves it back
    ],
)
def test_a_landed_renew_moves_the_deadline_forward_only(sent_at, moved_to):
    s = state()
    assert s.renewed(sent_at) == moved_to
    assert s.deadline == max(DEADLINE, sent_at + TIMING.fence_after)
    assert s.call_deadline == s.deadline


def test_a_paused_connection_resumes_after_a_later_renew_under_the_same_lease():
    s = state(5)
    assert s.before_call(DEADLINE + 0.1) is Call.PAUSE
    assert s.call_failed(6, hit_deadline=True) is Failure.PAUSE
    assert s.renewed(DEADLINE - 0.5) == DEADLINE + 1.48
    assert s.before_call(DEADLINE + 0.1) is Call.GO
    s.call_returned(6)
    assert (s.checkpoint, s.ending) == (6, None)


@pytest.mark.parametrize("ending", list(Ending))
def test_a_renew_during_an_ending_moves_the_deadline_but_reschedules_nothing(ending):
    s = state()
    s.end(ending, T0 + 0.5)
    assert s.renewed(T0 + 0.6) is None
    assert s.deadline == DEADLINE + 0.6


def test_the_first_ending_wins():
    s = state()
    assert s.end(Ending.LOST, T0 + 0.1)
    assert not s.end(Ending.SHUTDOWN, T0 + 0.2)
    assert s.ending is Ending.LOST
    assert s.drain_deadline == DEADLINE  # the losing graceful ending fixed nothing


@pytest.mark.parametrize(
    ("ending", "graceful", "releases", "loses_lease"),
    [
        (Ending.SHUTDOWN, True, True, False),
        (Ending.STOPPED, True, True, False),
        (Ending.RESTARTED, True, True, False),
        (Ending.PARKED, True, True, False),
        (Ending.LOST, False, False, True),
        (Ending.FENCED, False, True, True),
        (Ending.GONE, False, False, False),
    ],
)
def test_what_each_ending_means(ending, graceful, releases, loses_lease):
    assert (ending.graceful, ending.releases, ending.loses_lease) == (
        graceful,
        releases,
        loses_lease,
    )


@pytest.mark.parametrize(
    ("timing", "deadline", "stop_at", "drain_deadline"),
    [
        (TIMING, DEADLINE, T0 + 0.5, DEADLINE),  # the fence deadline comes first
        (TIMING, DEADLINE, T0, DEADLINE),  # both at once
        (TIMING, DEADLINE + 5, T0 + 1, T0 + 2.98),  # the drain budget (1.98 s) comes first
        (TIMING, DEADLINE, DEADLINE + 1, DEADLINE),  # stopped while paused: no call left
        (LONG, T0 + 108, T0 + 1, T0 + 31),  # the budget is capped at 30 s
        (LONG, T0 + 108, T0 + 80, T0 + 108),
    ],
)
@pytest.mark.parametrize("ending", [e for e in Ending if e.graceful])
def test_a_graceful_ending_fixes_the_deadline_of_the_call_in_flight(
    timing, deadline, stop_at, drain_deadline, ending
):
    s = ConnectionState(timing, checkpoint=0, deadline=deadline)
    assert s.end(ending, stop_at)
    assert s.call_deadline == s.drain_deadline == pytest.approx(drain_deadline)
    # A renew during the drain keeps the session proven, but does not stretch the call.
    assert s.renewed(deadline) is None
    assert s.deadline == deadline + timing.fence_after
    assert s.call_deadline == pytest.approx(drain_deadline)


@pytest.mark.parametrize("ending", [e for e in Ending if not e.graceful])
def test_an_abrupt_ending_keeps_the_fence_deadline_as_the_bound(ending):
    s = ConnectionState(TIMING, checkpoint=0, deadline=DEADLINE + 5)
    assert s.end(ending, T0 + 1)
    assert s.drain_deadline == DEADLINE + 5  # untouched
    assert s.call_deadline == DEADLINE + 5


# --- batches ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("checkpoint", "after", "seq", "verdict"),
    [
        (5, 5, 6, Frame.NEXT),  # the batch is empty so far: as against the checkpoint
        (5, 8, 9, Frame.NEXT),  # 6..8 gathered, not yet handled
        (5, 8, 8, Frame.DUPLICATE),  # already in the batch
        (5, 8, 6, Frame.DUPLICATE),
        (5, 8, 3, Frame.DUPLICATE),  # below the checkpoint as well
        (5, 8, 10, Frame.GAP),  # the batch ends before a gap
        (0, 0, 1, Frame.NEXT),
    ],
)
def test_frames_while_a_batch_is_gathered(checkpoint, after, seq, verdict):
    s = state(checkpoint)
    assert s.classify(seq, after) is verdict
    assert s.checkpoint == checkpoint  # gathering moves nothing


@pytest.mark.parametrize(
    ("skip", "hit_deadline", "verdict", "checkpoint"),
    [
        (False, False, Failure.RETRY, 5),  # retried whole: nothing of it passed
        (True, False, Failure.SKIP, 9),  # skipped whole: past its last message
        (False, True, Failure.PAUSE, 5),  # cut at the fence: whole again after a renew
        (True, True, Failure.PAUSE, 5),
    ],
)
def test_a_failed_batch_is_retried_skipped_or_cut_whole(skip, hit_deadline, verdict, checkpoint):
    s = state(5, skip=skip)  # the batch is 6..9
    assert s.call_failed(9, hit_deadline=hit_deadline) is verdict
    assert s.checkpoint == checkpoint


def test_a_batch_that_returned_passes_the_checkpoint_over_all_of_it():
    s = state(5)
    s.call_returned(9)
    assert s.checkpoint == 9
    assert s.classify(10) is Frame.NEXT


@pytest.mark.parametrize(
    ("now", "watch"),
    [
        (T0, Watch.LATER),  # fired early (a renew moved nothing yet): wait for the deadline
        (DEADLINE - 0.001, Watch.LATER),
        (DEADLINE, Watch.CUT),  # at the deadline, as no call may start there
        (DEADLINE + 5, Watch.CUT),
    ],
)
def test_the_watchdog_cuts_the_call_in_flight_at_the_deadline(now, watch):
    s = state()
    assert s.watchdog(now, in_call=True) is watch
    assert s.watchdog(now, in_call=False) is Watch.IDLE  # nothing to cut: disarm


def test_the_watchdog_follows_the_deadline_that_renews_move():
    """Armed at the first deadline; renews land while the call runs; when the timer
    fires it finds the new deadline and fires again then, not before."""
    s = state()
    s.renewed(T0 + 0.6)
    s.renewed(T0 + 1.2)
    assert s.watchdog(DEADLINE, in_call=True) is Watch.LATER
    moved = T0 + 1.2 + TIMING.fence_after  # 1003.18
    assert s.call_deadline == moved
    assert s.watchdog(moved - 0.001, in_call=True) is Watch.LATER
    assert s.watchdog(moved, in_call=True) is Watch.CUT


@pytest.mark.parametrize("ending", [Ending.SHUTDOWN, Ending.HANDED_OFF])
def test_the_watchdog_cuts_a_drained_call_at_the_drain_deadline(ending):
    """A graceful ending brings the call deadline forward (the budget of the drain);
    renews after it do not stretch it."""
    s = ConnectionState(LONG, checkpoint=5, deadline=T0 + 100)
    s.end(ending, T0)
    s.renewed(T0 + 10)
    assert s.call_deadline == T0 + 30  # the drain budget
    assert s.watchdog(T0 + 29.9, in_call=True) is Watch.LATER
    assert s.watchdog(T0 + 30, in_call=True) is Watch.CUT


_EVENTS = st.lists(
    st.one_of(
        st.tuples(st.just("renewed"), st.floats(T0 - 5, T0 + 10)),
        st.tuples(st.just("end"), st.sampled_from(list(Ending))),
        st.tuples(st.just("probe"), st.floats(T0 - 5, T0 + 15)),
    ),
    max_size=12,
)


@settings(max_examples=300, deadline=None)
@given(events=_EVENTS, checkpoint=st.integers(0, 10))
def test_the_readers_one_comparison_says_go_exactly_when_before_call_does(events, checkpoint):
    """The reader checks ``now < go_until`` per message instead of calling
    before_call: after any renews and endings, in any order, the two agree."""
    s = state(checkpoint)
    for kind, value in events:
        if kind == "renewed":
            s.renewed(value)
        elif kind == "end":
            s.end(value, T0)
        for now in (value, s.deadline - 0.001, s.deadline, T0) if kind == "probe" else (T0,):
            assert (now < s.go_until) is (s.before_call(now) is Call.GO)
