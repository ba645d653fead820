import pytest

from wsfleet.timing import InvalidTimingError, LeaseTiming


def test_defaults_follow_the_lease():
    timing = LeaseTiming.from_lease(20)
    assert (timing.heartbeat, timing.reconcile, timing.skew, timing.margin) == (5, 5, 1, 2)
    assert timing.fence_after == pytest.approx(17)
    assert timing.lease_ms == 20_000
    assert timing.skew_ms == 1_000
    assert timing.crash_failover_bound() == pytest.approx(20 + 1 + 6 + 1)


@pytest.mark.parametrize(
    ("lease", "overrides"),
    [
        (20, {}),
        (2, {}),
        (0.4, {}),
        (20, {"heartbeat": 8.4}),  # 16.8 + 2 = 18.8 < 19
        (20, {"skew": 4.9}),  # just under lease/4; 10 + 2 < 15.1
    ],
)
def test_valid_timings(lease, overrides):
    LeaseTiming.from_lease(lease, **overrides)


@pytest.mark.parametrize(
    ("lease", "overrides", "fragment"),
    [
        (20, {"heartbeat": 8.5}, "two renew attempts"),  # 17 + 2 = 19, not < 19
        (20, {"heartbeat": 9}, "two renew attempts"),
        (20, {"skew": 5}, "skew < lease/4"),  # exactly lease/4
        (20, {"heartbeat": 0}, "heartbeat must be > 0"),
        (0, {}, "lease must be > 0"),
        (-1, {}, "lease must be > 0"),
        (20, {"reconcile": 0}, "reconcile must be > 0"),
        (20, {"skew": -0.1}, "skew must be >= 0"),
        (20, {"margin": -1}, "margin must be >= 0"),
    ],
)
def test_invalid_timings(lease, overrides, fragment):
    with pytest.raises(InvalidTimingError, match=fragment):
        LeaseTiming.from_lease(lease, **overrides)


def test_the_default_lease_is_twenty_seconds():
    assert LeaseTiming.from_lease() == LeaseTiming.from_lease(20)
    assert LeaseTiming.from_lease().lease == 20


@pytest.mark.parametrize("zero", ["skew", "margin"])
def test_skew_and_margin_may_be_zero(zero):
    assert getattr(LeaseTiming.from_lease(20, **{zero: 0}), zero) == 0


@pytest.mark.parametrize(
    ("lease", "overrides", "message"),
    [
        (
            20,
            {"heartbeat": 8.5},
            "need 2*heartbeat + margin < lease - skew (two renew attempts before fencing): "
            "2*8.5 + 2.0 >= 20 - 1.0",
        ),
        (20, {"skew": 5}, "need skew < lease/4: 5 >= 5.0"),
        (20, {"skew": 6}, "need skew < lease/4: 6 >= 5.0"),
        (20, {"margin": -1}, "margin must be >= 0 s, got -1"),
    ],
)
def test_a_configuration_error_says_which_rule_failed_and_with_what(lease, overrides, message):
    """The worker prints this at start (exit status 2): it names the rule and the values."""
    with pytest.raises(InvalidTimingError) as raised:
        LeaseTiming.from_lease(lease, **overrides)
    assert str(raised.value) == message
