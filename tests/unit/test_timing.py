"""Session timing: the defaults derived from the lease, the rules a configuration
must satisfy (at their boundaries), and the budgets derived from it."""

import pytest

from wsfleet.timing import (
    DEFAULT_CHECKPOINT_SECONDS,
    DEFAULT_LEASE_SECONDS,
    DEFAULT_SKEW_SECONDS,
    MAX_CHECKPOINT_SECONDS,
    InvalidTimingError,
    LeaseTiming,
)


def test_the_defaults():
    timing = LeaseTiming.from_lease()
    assert (DEFAULT_LEASE_SECONDS, DEFAULT_SKEW_SECONDS, DEFAULT_CHECKPOINT_SECONDS) == (
        2.5,
        0.25,
        5.0,
    )
    assert timing.lease == 2.5
    assert timing.heartbeat == pytest.approx(0.6)
    assert timing.reconcile == pytest.approx(0.6)
    assert (timing.skew, timing.margin, timing.checkpoint) == (0.25, 0.25, 5.0)
    assert timing.fence_after == pytest.approx(2.0)
    assert (timing.lease_ms, timing.skew_ms) == (2500, 250)
    assert timing.crash_failover_bound() == pytest.approx(4.47)  # 2.5 + 0.25 + 0.72 + 1


@pytest.mark.parametrize("lease", [2, 2.5, 4, 20, 120])
def test_heartbeat_and_reconcile_follow_the_lease_and_the_skew_does_not(lease):
    timing = LeaseTiming.from_lease(lease)
    assert timing.heartbeat == pytest.approx(0.24 * lease)
    assert timing.reconcile == pytest.approx(0.24 * lease)
    assert timing.margin == pytest.approx(lease / 10)
    assert timing.skew == 0.25
    assert timing.checkpoint == 5.0
    assert timing.crash_failover_bound() == pytest.approx(lease + 0.25 + 1.2 * 0.24 * lease + 1)


def test_the_scaled_timings_of_the_tests_validate():
    timing = LeaseTiming.from_lease(2, heartbeat=0.5, reconcile=0.5, skew=0.2)
    assert (timing.lease, timing.heartbeat, timing.reconcile, timing.skew) == (2, 0.5, 0.5, 0.2)
    assert timing.margin == pytest.approx(0.2)
    assert timing.fence_after == pytest.approx(1.6)  # three heartbeats (1.5) fit


def test_every_override_is_taken():
    timing = LeaseTiming.from_lease(
        4, heartbeat=0.7, reconcile=0.9, skew=0.3, margin=0.1, checkpoint=12
    )
    assert timing == LeaseTiming(
        lease=4, heartbeat=0.7, reconcile=0.9, skew=0.3, margin=0.1, checkpoint=12
    )


# lease 4, skew 0.5, margin 0.5: lease - skew - margin = 3.0, exactly (binary fractions)
EXACT = {"skew": 0.5, "margin": 0.5}


@pytest.mark.parametrize(
    ("lease", "overrides"),
    [
        (4, EXACT | {"heartbeat": 1.0}),  # 3 x 1.0 == 3.0: allowed
        (4, EXACT | {"heartbeat": 0.999}),
        (4, {"skew": 0.999, "margin": 0.5, "heartbeat": 0.5}),  # just under lease/4
        (1.39, {}),  # about the shortest lease the derived defaults allow (fixed skew)
        (20, {"skew": 0}),
        (20, {"margin": 0}),
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
            "need 3*heartbeat <= lease - skew - margin (3 renew attempts before fencing):"
            " 3*1.25 > 4 - 0.5 - 0.5",
        ),
        (
            4,
            EXACT | {"heartbeat": 1.001},
            "need 3*heartbeat <= lease - skew - margin (3 renew attempts before fencing):"
            " 3*1.001 > 4 - 0.5 - 0.5",
        ),
        (
            4,
            {"heartbeat": 1.0, "skew": 0.5, "margin": 0.625},
            "need 3*heartbeat <= lease - skew - margin (3 renew attempts before fencing):"
            " 3*1.0 > 4 - 0.5 - 0.625",
        ),
        (
            1.25,  # too short for the derived defaults: the skew does not shrink with it
            {},
            "need 3*heartbeat <= lease - skew - margin (3 renew attempts before fencing):"
            " 3*0.3 > 1.25 - 0.25 - 0.125",
        ),
        (4, {"heartbeat": 0.5, "skew": 1.0, "margin": 0.5}, "need skew < lease/4: 1.0 >= 1.0"),
        (4, {"heartbeat": 0.25, "skew": 1.5, "margin": 0}, "need skew < lease/4: 1.5 >= 1.0"),
        (0, {}, "lease must be > 0 s, got 0"),
        (-1, {}, "lease must be > 0 s, got -1"),
        (20, {"heartbeat": 0}, "heartbeat must be > 0 s, got 0"),
        (20, {"reconcile": 0}, "reconcile must be > 0 s, got 0"),
        (20, {"reconcile": -0.5}, "reconcile must be > 0 s, got -0.5"),
        (20, {"checkpoint": 0}, "checkpoint must be > 0 s, got 0"),
        (20, {"skew": -0.1}, "skew must be >= 0 s, got -0.1"),
        (20, {"margin": -1}, "margin must be >= 0 s, got -1"),
        (20, {"checkpoint": 300.5}, "checkpoint must be <= 300.0 s, got 300.5"),
    ],
)
def test_a_configuration_error_says_which_rule_failed_and_with_what(lease, overrides, message):
    """The worker prints this at start (exit status 2): it names the rule and the values."""
    with pytest.raises(InvalidTimingError) as raised:
        LeaseTiming.from_lease(lease, **overrides)
    assert str(raised.value) == message


def test_validate_checks_a_timing_built_by_hand():
    LeaseTiming(lease=4, heartbeat=1.0, reconcile=1.0, skew=0.5, margin=0.5).validate()
    with pytest.raises(InvalidTimingError, match="3 renew attempts"):
        LeaseTiming(lease=4, heartbeat=1.001, reconcile=1.0, skew=0.5, margin=0.5).validate()


def test_the_default_lease_is_two_and_a_half_seconds():
    assert LeaseTiming.from_lease() == LeaseTiming.from_lease(2.5)


@pytest.mark.parametrize(
    ("timing", "stale_after"),
    [
        (LeaseTiming.from_lease(), 10.0),  # three heartbeats are 1.8 s: the floor holds
        (LeaseTiming.from_lease(20), pytest.approx(14.4)),  # three heartbeats of 4.8 s
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
        (LeaseTiming.from_lease(), pytest.approx(2.0), pytest.approx(2.6)),
        (
            LeaseTiming.from_lease(2, heartbeat=0.5, reconcile=0.5, skew=0.2),
            pytest.approx(1.6),
            pytest.approx(2.1),
        ),
        (LeaseTiming.from_lease(20, heartbeat=3), pytest.approx(17.75), pytest.approx(20.75)),
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
        (LeaseTiming.from_lease(), 2.0, 2.5, 20.0),  # the floor: 5.5 s would be too short
        (LeaseTiming.from_lease(8), 6.95, 8, 20.0),
        (LeaseTiming.from_lease(10), 8.75, 10, 20.0),
        (LeaseTiming.from_lease(11), 9.65, 11, 21.65),
        (LeaseTiming.from_lease(20), 17.75, 20, 38.75),
        (LeaseTiming.from_lease(120), 30.0, 30.0, 61.0),  # both capped
    ],
)
def test_the_budgets_of_an_ending(timing, drain, release, shutdown):
    assert timing.drain_budget == pytest.approx(drain)
    assert timing.release_budget == pytest.approx(release)
    assert timing.shutdown_budget == pytest.approx(shutdown)


@pytest.mark.parametrize(
    ("lease", "skew", "lease_ms", "skew_ms"),
    [(2.5, 0.25, 2500, 250), (2.0004, 0.2004, 2000, 200), (2.0006, 0.2006, 2001, 201)],
)
def test_milliseconds_are_rounded(lease, skew, lease_ms, skew_ms):
    timing = LeaseTiming.from_lease(lease, skew=skew)
    assert (timing.lease_ms, timing.skew_ms) == (lease_ms, skew_ms)
