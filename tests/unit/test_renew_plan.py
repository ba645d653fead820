"""The renew plan (worker/renew_plan.py): when renews go out, which answers move the
fence deadline, and when the session is given up. Pure: every instant is passed in."""

from __future__ import annotations

import heapq

import pytest

from worker.renew_plan import RenewPlan, Step
from wsfleet.timing import RENEWS_IN_FLIGHT, LeaseTiming

DEFAULTS = LeaseTiming.from_lease()  # heartbeat 0.6 s, fence window 2.0 s
H, F = DEFAULTS.heartbeat, DEFAULTS.fence_after


def opened(at: float = 0.0) -> RenewPlan:
    return RenewPlan.opened(DEFAULTS, at, at + H)


def test_the_first_renew_goes_out_a_heartbeat_after_the_open_and_the_deadline_counts_from_it():
    plan = opened(10.0)
    assert plan.deadline == 10.0 + F
    assert plan.step(10.0 + H - 0.001) is Step.WAIT
    assert plan.wake_at() == 10.0 + H
    assert plan.step(10.0 + H) is Step.SEND


def test_renews_go_out_a_heartbeat_apart_while_earlier_ones_are_unanswered():
    plan = opened()
    sends = []
    now = 0.0
    while len(sends) < 3:
        now = plan.wake_at()
        assert plan.step(now) is Step.SEND
        plan.sent(now)
        sends.append(now)
    assert sends == pytest.approx([H, 2 * H, 3 * H])
    assert plan.in_flight == sends


def test_a_renew_answered_late_moves_the_deadline_from_its_send():
    """0.26 s, more than a third of a heartbeat: it counts, measured from its send."""
    plan = opened()
    plan.sent(H)
    assert plan.landed(H, H + 0.26)
    assert plan.deadline == H + F
    assert plan.in_flight == []


def test_an_answer_within_its_window_counts_however_late_and_one_after_it_does_not():
    plan = opened()
    plan.sent(H)
    plan.sent(2 * H)
    assert not plan.landed(H, H + F)  # its window has just closed
    assert plan.deadline == F
    assert plan.landed(2 * H, 2 * H + F - 0.001)
    assert plan.deadline == 2 * H + F


def test_an_older_renew_landing_after_a_newer_one_never_moves_the_deadline_back():
    plan = opened()
    plan.sent(H)
    plan.sent(2 * H)
    assert plan.landed(2 * H, 2 * H + 0.1)
    assert not plan.landed(H, 2 * H + 0.2)
    assert plan.deadline == 2 * H + F
    assert plan.in_flight == []


def test_a_renew_landing_after_a_later_one_changes_nothing_but_frees_its_place():
    plan = opened()
    plan.sent(H)
    plan.sent(2 * H)
    assert plan.landed(2 * H, 2 * H + 0.1)
    assert not plan.landed(H, 2 * H + 0.2)  # lands, but its window ends sooner
    assert plan.in_flight == []
    assert plan.deadline == 2 * H + F


def test_an_error_brings_the_next_renew_forward_to_a_quarter_heartbeat():
    plan = opened()
    plan.sent(H)
    plan.failed(H, H + 0.05)
    assert plan.next_at == pytest.approx(H + 0.05 + H / 4)
    assert plan.in_flight == []


def test_an_error_never_puts_the_next_renew_off():
    plan = opened()
    plan.sent(H)
    plan.sent(2 * H)
    plan.failed(H, 2 * H + 0.55)  # the next is due at 3H, sooner than a quarter heartbeat
    assert plan.next_at == pytest.approx(3 * H)


def test_no_more_than_the_cap_are_awaited_at_once():
    """A long window against a short heartbeat (a lease of 10 s renewed every 0.1 s)."""
    plan = RenewPlan(heartbeat=0.1, fence_after=7.0, deadline=7.0, next_at=0.1)
    for n in range(1, RENEWS_IN_FLIGHT + 1):
        assert plan.step(n * 0.1) is Step.SEND
        plan.sent(n * 0.1)
    assert plan.step(plan.next_at) is Step.WAIT
    assert plan.wake_at() == plan.give_up_at
    plan.failed(0.1, plan.next_at)
    assert plan.step(plan.next_at) is Step.SEND


def test_the_session_is_given_up_a_heartbeat_after_its_deadline_once():
    plan = opened()
    plan.sent(H)
    assert plan.give_up_at == F + H
    assert plan.step(F + H - 0.001) is not Step.GIVE_UP
    assert plan.step(F + H) is Step.GIVE_UP
    assert plan.over
    assert plan.step(F + H + 1) is Step.WAIT
    assert plan.wake_at() == float("inf")


def test_a_renew_landing_before_the_give_up_resumes_and_puts_it_off():
    plan = opened()
    plan.sent(H)
    assert plan.landed(H, F + 0.5)  # past the deadline, inside its own window
    assert plan.give_up_at == H + F + H
    assert plan.step(F + H) is not Step.GIVE_UP


def test_nothing_counts_once_given_up():
    plan = opened()
    plan.sent(H)
    plan.sent(2 * H)
    assert plan.step(F + H) is Step.GIVE_UP
    assert not plan.landed(2 * H, F + H + 0.01)  # its window is open, but too late
    assert plan.deadline == F


def simulate(round_trip: float, until: float) -> tuple[float | None, float]:
    """The plan against a DynamoDB whose every answer takes ``round_trip``: when it gave
    up (None: never) and the longest span past the fence deadline before a renew moved
    it again."""
    plan = opened()
    answers: list[float] = []  # sends, answered in order
    now, longest_dark = 0.0, 0.0
    while now < until:
        step = plan.step(now)
        if step is Step.GIVE_UP:
            return now, longest_dark
        if step is Step.SEND:
            plan.sent(now)
            heapq.heappush(answers, now)
            continue
        answer_at = answers[0] + round_trip if answers else float("inf")
        wake = plan.wake_at()
        if answer_at <= wake:
            now = answer_at
            sent_at = heapq.heappop(answers)
            before = plan.deadline
            if plan.landed(sent_at, now):
                longest_dark = max(longest_dark, now - before)
        else:
            now = wake
    return None, longest_dark


@pytest.mark.parametrize("round_trip", [0.01, 0.3, 0.6, 1.5, F - 0.01])
def test_a_session_whose_answers_come_within_the_window_is_never_given_up(round_trip):
    """Renews go out every heartbeat however slow the answers: the deadline is at most
    ``round_trip + heartbeat - window`` past before the next one lands (0.1 s at 1.5 s),
    never the heartbeat that would give the session up."""
    gave_up, dark = simulate(round_trip, until=60.0)
    assert gave_up is None
    assert dark == pytest.approx(max(0.0, round_trip + H - F), abs=1e-9)


@pytest.mark.parametrize("round_trip", [F, 2.5, 10.0])
def test_a_session_whose_answers_come_after_the_window_is_given_up_in_a_heartbeat(round_trip):
    gave_up, _ = simulate(round_trip, until=60.0)
    assert gave_up == pytest.approx(F + H)
