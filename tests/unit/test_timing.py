"""Session timing: the defaults derived from the lease, the rules a configuration
must satisfy (at their boundaries), the budgets derived from it, and the drift of the
clocks that the fence window and the reaper's wait leave room for."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from wsfleet import timing as timing_module
from wsfleet.timing import (
    DEFAULT_CHECKPOINT_SECONDS,
    DEFAULT_LEASE_SECONDS,
    DRIFT_RATE,
    HEARTBEAT_SHARE,
    MAX_CHECKPOINT_SECONDS,
    InvalidTimingError,
    LeaseTiming,
)


def test_the_defaults():
    timing = LeaseTiming.from_lease()
    assert (DEFAULT_LEASE_SECONDS, DRIFT_RATE, DEFAULT_CHECKPOINT_SECONDS) == (2.2, 0.001, 5.0)
    assert HEARTBEAT_SHARE == 0.27
    assert timing.lease == 2.2
    assert timing.heartbeat == pytest.approx(0.594)  # 0.27 x 2.2
    assert timing.reconcile == pytest.approx(0.594)
    assert timing.margin == pytest.approx(0.22)  # 2.2 / 10
    assert timing.checkpoint == 5.0
    assert timing.fence_after == pytest.approx(1.98)
    assert timing.expire_after == pytest.approx(2.2022)  # 2.2 x 1.001
    assert timing.lease_ms == 2200
    assert timing.give_up_after == pytest.approx(2.574)  # 1.98 + 0.594
    assert timing.crash_failover_bound() == pytest.approx(3.915)  # 2.2022 + 0.7128 + 1


def test_there_is_no_skew_any_more():
    """Wall clocks decide nothing: no skew to set, to read, or to validate."""
    assert not hasattr(timing_module, "DEFAULT_SKEW_SECONDS")
    timing = LeaseTiming.from_lease()
    assert not hasattr(timing, "skew")
    assert not hasattr(timing, "skew_ms")
    skew: dict[str, Any] = {"skew": 0.25}
    with pytest.raises(TypeError, match="skew"):
        LeaseTiming.from_lease(2.5, **skew)


@pytest.mark.parametrize("lease", [0.01, 1, 2, 2.2, 2.5, 4, 20, 120])
def test_everything_follows_the_lease(lease):
    timing = LeaseTiming.from_lease(lease)
    assert timing.heartbeat == pytest.approx(0.27 * lease)
    assert timing.reconcile == pytest.approx(0.27 * lease)
    assert timing.margin == pytest.approx(lease / 10)
    assert timing.checkpoint == 5.0
    assert timing.fence_after == pytest.approx(0.9 * lease)
    assert timing.expire_after == pytest.approx(1.001 * lease)
    assert timing.crash_failover_bound() == pytest.approx(1.001 * lease + 1.2 * 0.27 * lease + 1)


@given(st.floats(min_value=1e-6, max_value=1e6))
def test_the_derived_defaults_validate_at_any_lease(lease):
    """Nothing in the defaults is fixed any more (the skew was): no lease is too short."""
    timing = LeaseTiming.from_lease(lease)
    assert 3 * timing.heartbeat <= timing.fence_after
    assert timing.margin > 2 * DRIFT_RATE * lease


def test_the_scaled_timings_of_the_tests_validate():
    timing = LeaseTiming.from_lease(2, heartbeat=0.5, reconcile=0.5)
    assert (timing.lease, timing.heartbeat, timing.reconcile) == (2, 0.5, 0.5)
    assert timing.margin == pytest.approx(0.2)
    assert timing.fence_after == pytest.approx(1.8)  # three heartbeats (1.5) fit
    assert timing.expire_after == pytest.approx(2.002)


def test_every_override_is_taken():
    timing = LeaseTiming.from_lease(4, heartbeat=0.7, reconcile=0.9, margin=0.1, checkpoint=12)
    assert timing == LeaseTiming(lease=4, heartbeat=0.7, reconcile=0.9, margin=0.1, checkpoint=12)


# lease 4, margin 1: lease - margin = 3.0, exactly (binary fractions)
EXACT = {"margin": 1.0}


@pytest.mark.parametrize(
    ("lease", "overrides"),
    [
        (4, EXACT | {"heartbeat": 1.0}),  # 3 x 1.0 == 3.0: allowed
        (4, EXACT | {"heartbeat": 0.999}),
        (1000, {"margin": 2.001, "heartbeat": 100}),  # just over twice the drift of a lease
        (20, {"margin": 0.0401}),
        (0.001, {}),  # the derived defaults fit any lease
        (20, {"checkpoint": MAX_CHECKPOINT_SECONDS}),
        (20, {"checkpoint": 0.001}),
    ],
)
def test_valid_timings(lease, overrides):
    LeaseTiming.from_lease(lease, **overrides)


@pytest.mark.parametrize(
    ("lease", "overrides", "message"),
    [
        (
            4,
            EXACT | {"heartbeat": 1.25},
            "need 3*heartbeat <= lease - margin (3 renew attempts before fencing):"
            " 3*1.25 > 4 - 1.0",
        ),
        (
            4,
            EXACT | {"heartbeat": 1.001},
            "need 3*heartbeat <= lease - margin (3 renew attempts before fencing):"
            " 3*1.001 > 4 - 1.0",
        ),
        (
            4,
            {"heartbeat": 1.0, "margin": 1.125},
            "need 3*heartbeat <= lease - margin (3 renew attempts before fencing):"
            " 3*1.0 > 4 - 1.125",
        ),
        (
            1000,
            {"margin": 2.0, "heartbeat": 100},  # exactly twice the drift of a lease
            "need margin > 2*0.001*lease (the clocks' drift over a lease): 2.0 <= 2.0",
        ),
        (
            2.5,
            {"margin": 0.005},
            "need margin > 2*0.001*lease (the clocks' drift over a lease): 0.005 <= 0.005",
        ),
        (
            20,
            {"margin": 0},
            "need margin > 2*0.001*lease (the clocks' drift over a lease): 0 <= 0.04",
        ),
        (
            20,
            {"margin": -1},
            "need margin > 2*0.001*lease (the clocks' drift over a lease): -1 <= 0.04",
        ),
        (0, {}, "lease must be > 0 s, got 0"),
        (-1, {}, "lease must be > 0 s, got -1"),
        (20, {"heartbeat": 0}, "heartbeat must be > 0 s, got 0"),
        (20, {"reconcile": 0}, "reconcile must be > 0 s, got 0"),
        (20, {"reconcile": -0.5}, "reconcile must be > 0 s, got -0.5"),
        (20, {"checkpoint": 0}, "checkpoint must be > 0 s, got 0"),
        (20, {"checkpoint": 300.5}, "checkpoint must be <= 300.0 s, got 300.5"),
    ],
)
def test_a_configuration_error_says_which_rule_failed_and_with_what(lease, overrides, message):
    """The worker prints this at start (exit status 2): it names the rule and the values."""
    with pytest.raises(InvalidTimingError) as raised:
        LeaseTiming.from_lease(lease, **overrides)
    assert str(raised.value) == message


def test_validate_checks_a_timing_built_by_hand():
    LeaseTiming(lease=4, heartbeat=1.0, reconcile=1.0, margin=1.0).validate()
    with pytest.raises(InvalidTimingError, match="3 renew attempts"):
        LeaseTiming(lease=4, heartbeat=1.001, reconcile=1.0, margin=1.0).validate()
    with pytest.raises(InvalidTimingError, match="the clocks' drift"):
        LeaseTiming(lease=4, heartbeat=0.5, reconcile=1.0, margin=0.008).validate()


def test_the_default_lease_is_two_point_two_seconds():
    assert LeaseTiming.from_lease() == LeaseTiming.from_lease(2.2)


# --- the drift of the clocks -----------------------------------------------------------


def _worst_fence_window(timing: LeaseTiming) -> float:
    """The longest real time a holder may handle after a renew's send: its clock runs
    slow by the whole drift, so its ``fence_after`` takes longer."""
    return timing.fence_after / (1 - DRIFT_RATE)


def _shortest_reap_wait(timing: LeaseTiming) -> float:
    """The shortest real time a reaper waits after it first saw the renew: its clock
    runs fast by the whole drift, so its ``expire_after`` passes sooner."""
    return timing.expire_after / (1 + DRIFT_RATE)


@pytest.mark.parametrize(
    "timing",
    [
        LeaseTiming.from_lease(),
        LeaseTiming.from_lease(2, heartbeat=0.5, reconcile=0.5),
        LeaseTiming.from_lease(120, heartbeat=30, reconcile=30),
        LeaseTiming.from_lease(1000, heartbeat=100, margin=2.001),  # the least margin
    ],
)
def test_the_reaper_waits_a_lease_of_real_time_whatever_its_clock(timing):
    """The reaper's wait (``lease x (1 + drift)`` on its clock) is never shorter than a
    lease of real time, and a holder's fence window (``lease - margin`` on its clock)
    ends before it even when that clock runs slow: the renew is seen after its send,
    so the reap comes after the fence deadline."""
    assert _shortest_reap_wait(timing) == pytest.approx(timing.lease)
    assert _worst_fence_window(timing) < _shortest_reap_wait(timing)


@given(
    st.floats(min_value=0.01, max_value=1e5),
    st.floats(min_value=0, max_value=0.9),
)
def test_any_timing_that_validates_fences_before_the_earliest_reap(lease, margin_fraction):
    margin = lease * margin_fraction
    try:
        timing = LeaseTiming.from_lease(lease, heartbeat=(lease - margin) / 4, margin=margin)
    except InvalidTimingError:
        assert margin <= 2 * DRIFT_RATE * lease
        return
    assert _worst_fence_window(timing) < _shortest_reap_wait(timing)


@given(st.floats(min_value=0.01, max_value=1e5))
def test_without_the_margin_rule_a_slow_holder_would_outlast_the_reaper(lease):
    """A margin of half the drift of a lease (which validation refuses) leaves a holder
    whose clock runs slow handling past the instant a fast reaper may reap: the margin
    rule is what keeps them apart."""
    margin = DRIFT_RATE * lease / 2
    timing = LeaseTiming(lease=lease, heartbeat=lease / 4, reconcile=lease / 4, margin=margin)
    assert _worst_fence_window(timing) > _shortest_reap_wait(timing)
    with pytest.raises(InvalidTimingError, match="the clocks' drift"):
        timing.validate()


# --- budgets -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("timing", "stale_after"),
    [
        (LeaseTiming.from_lease(), 10.0),  # three heartbeats are 1.782 s: the floor holds
        (LeaseTiming.from_lease(20), pytest.approx(16.2)),  # three heartbeats of 5.4 s
        (LeaseTiming.from_lease(20, heartbeat=10 / 3), pytest.approx(10.0)),
        (LeaseTiming.from_lease(120, heartbeat=30), 90.0),
    ],
)
def test_the_health_check_allows_three_heartbeats_and_never_less_than_ten_seconds(
    timing, stale_after
):
    assert timing.stale_health_after == stale_after


@pytest.mark.parametrize(
    ("timing", "attempt", "give_up"),
    [
        (LeaseTiming.from_lease(), pytest.approx(1.98), pytest.approx(2.574)),
        (
            LeaseTiming.from_lease(2, heartbeat=0.5, reconcile=0.5),
            pytest.approx(1.8),
            pytest.approx(2.3),
        ),
        (LeaseTiming.from_lease(20, heartbeat=3), pytest.approx(18.0), pytest.approx(21.0)),
    ],
)
def test_a_renew_is_awaited_for_the_fence_window_and_the_session_given_up_a_heartbeat_later(
    timing, attempt, give_up
):
    """A renew's answer counts as long as it can still move the fence deadline (its send
    plus the window); with nothing landing, the session is given up one heartbeat past
    the deadline."""
    assert timing.renew_attempt_timeout == attempt == timing.fence_after
    assert timing.give_up_after == give_up


@pytest.mark.parametrize(
    ("timing", "drain", "release", "shutdown"),
    [
        (LeaseTiming.from_lease(), 1.98, 2.2, 20.0),  # the floor: 5.18 s would be too short
        (LeaseTiming.from_lease(8), 7.2, 8, 20.0),
        (LeaseTiming.from_lease(10), 9.0, 10, 20.0),  # 9 + 10 + 1: exactly the floor
        (LeaseTiming.from_lease(11), 9.9, 11, 21.9),
        (LeaseTiming.from_lease(20), 18.0, 20, 39.0),
        (LeaseTiming.from_lease(120), 30.0, 30.0, 61.0),  # both capped
    ],
)
def test_the_budgets_of_an_ending(timing, drain, release, shutdown):
    assert timing.drain_budget == pytest.approx(drain)
    assert timing.release_budget == pytest.approx(release)
    assert timing.shutdown_budget == pytest.approx(shutdown)


@pytest.mark.parametrize(
    ("lease", "lease_ms"),
    [(2.5, 2500), (2.0004, 2000), (2.0006, 2001)],
)
def test_milliseconds_are_rounded(lease, lease_ms):
    assert LeaseTiming.from_lease(lease).lease_ms == lease_ms
