"""The wall-clock benchmark's pure parts: the skewed worker's clock patch (``time.time``
and ``time.time_ns`` offset, the monotonic clocks left alone, the jump schedule), its
arguments, and the seeded fault plan. No fleet."""

from __future__ import annotations

import random
import time
import types

import pytest

from benchmarks import skewed_worker
from benchmarks.skewed_worker import (
    ClockSkew,
    keep_real_clock,
    parse_args,
    patch_wall_clock,
    real_time_module,
    skewed_wall_clock,
)
from benchmarks.wall_clock import (
    PARTITION_S,
    PAUSE_LEASES,
    SCENARIOS,
    SKEW_FAULTS,
    SkewSeen,
    parse_scenarios,
    plan_skew_faults,
)
from tests.support.timing import scaled
from wsfleet.session_rules import SessionItem
from wsfleet.timing import LeaseTiming

pytestmark = pytest.mark.timeout(scaled(30))

TOLERANCE_S = 0.5
"""How far apart two reads of "the same" clock may be on a busy machine."""


class FakeMonotonic:
    """A monotonic clock the test moves by hand (times the jumps)."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_patch_offsets_time_and_time_ns_and_leaves_the_monotonic_clocks_alone() -> None:
    real_time, real_time_ns = time.time, time.time_ns
    monotonic, perf_counter = time.monotonic, time.perf_counter
    with skewed_wall_clock(ClockSkew(-30.0)) as clock:
        assert time.time is not real_time
        assert time.time_ns is not real_time_ns
        assert time.time() - real_time() == pytest.approx(-30.0, abs=TOLERANCE_S)
        assert (time.time_ns() - real_time_ns()) / 1e9 == pytest.approx(-30.0, abs=TOLERANCE_S)
        assert time.time_ns() / 1e9 == pytest.approx(time.time(), abs=TOLERANCE_S)
        assert clock.real_time is real_time
        # Only the wall clock moves.
        assert time.monotonic is monotonic
        assert time.perf_counter is perf_counter
        before = time.monotonic()
        assert time.monotonic() - before < TOLERANCE_S
    assert time.time is real_time
    assert time.time_ns is real_time_ns


def test_a_module_imported_after_the_patch_sees_it() -> None:
    clock = patch_wall_clock(ClockSkew(30.0))
    try:
        from time import time as imported_time

        assert imported_time() - clock.real_time() == pytest.approx(30.0, abs=TOLERANCE_S)
    finally:
        clock.restore()
    clock.restore()  # idempotent
    assert time.time is clock.real_time


def test_the_jump_schedule_alternates_plus_jump_and_back() -> None:
    skew = ClockSkew(offset=-2.0, jump=10.0, every=3.0)
    assert skew.jumps
    assert [skew.offset_at(t) for t in (0.0, 2.9, 3.0, 5.9, 6.0, 8.9, 9.0, 12.0)] == [
        -2.0,
        -2.0,
        8.0,
        8.0,
        -2.0,
        -2.0,
        8.0,
        -2.0,
    ]
    steady = ClockSkew(offset=2.0)
    assert not steady.jumps
    assert {steady.offset_at(t) for t in (0.0, 3.0, 1e6)} == {2.0}


def test_the_patched_clock_jumps_on_the_monotonic_clock() -> None:
    monotonic = FakeMonotonic()
    with skewed_wall_clock(ClockSkew(0.0, jump=10.0, every=3.0), monotonic=monotonic) as clock:
        assert time.time() - clock.real_time() == pytest.approx(0.0, abs=TOLERANCE_S)
        monotonic.now += 3.5
        assert time.time() - clock.real_time() == pytest.approx(10.0, abs=TOLERANCE_S)
        assert (time.time_ns() - clock.real_time_ns()) / 1e9 == pytest.approx(10.0, abs=TOLERANCE_S)
        monotonic.now += 3.0
        assert time.time() - clock.real_time() == pytest.approx(0.0, abs=TOLERANCE_S)


def test_the_recording_handler_keeps_the_real_clock() -> None:
    module = types.ModuleType("handler")
    vars(module)["time"] = time
    with skewed_wall_clock(ClockSkew(-30.0)) as clock:
        keep_real_clock(module, clock)
        assert module.time.time() == pytest.approx(clock.real_time(), abs=TOLERANCE_S)
        assert module.time.time_ns() / 1e9 == pytest.approx(clock.real_time(), abs=TOLERANCE_S)
        assert module.time.monotonic is time.monotonic
        assert real_time_module(clock).sleep is time.sleep
        assert time.time() - clock.real_time() == pytest.approx(-30.0, abs=TOLERANCE_S)


def test_request_signing_reads_the_real_clock() -> None:
    with skewed_wall_clock(ClockSkew(-30.0)) as clock:
        assert skewed_worker.signing_offset(clock) == pytest.approx(0.0, abs=TOLERANCE_S)


@pytest.mark.parametrize("skew", [*SCENARIOS.values(), ClockSkew(0.25, jump=-1.5, every=0.5)])
def test_a_skew_goes_through_the_command_line(skew: ClockSkew) -> None:
    assert parse_args(skew.argv()) == skew


def test_jump_and_every_go_together() -> None:
    with pytest.raises(SystemExit):
        parse_args(["--jump", "10"])
    with pytest.raises(SystemExit):
        parse_args(["--every", "3"])
    assert parse_args(["--offset", "-2"]) == ClockSkew(-2.0)


def test_scenarios_by_name() -> None:
    assert parse_scenarios(["-2", "+30"]) == ["-2", "+30"]
    assert parse_scenarios(["-2,jump", "-2"]) == ["-2", "jump"]
    with pytest.raises(ValueError, match="unknown scenario"):
        parse_scenarios(["-3"])


def test_the_plan_takes_the_faults_in_turn_and_fits_the_duration() -> None:
    timing = LeaseTiming.from_lease(2.0)
    plan = plan_skew_faults(random.Random(7), 60.0, timing)
    assert plan == plan_skew_faults(random.Random(7), 60.0, timing)
    assert [f.kind for f in plan] == [SKEW_FAULTS[i % 3] for i in range(len(plan))]
    assert len(plan) >= 4
    assert sum(f.rest + f.hold for f in plan) <= 60.0
    for fault in plan:
        if fault.kind == "blackhole":
            assert fault.hold == pytest.approx(PARTITION_S, rel=0.06)
        elif fault.kind == "sigstop":
            assert fault.hold == pytest.approx(PAUSE_LEASES * timing.lease, rel=0.06)
        else:
            assert 0.5 <= fault.hold <= 1.5
    assert all(2 * timing.lease <= f.rest <= 3 * timing.lease for f in plan[1:])


def session(worker: str, beat: int, expires_at_ms: int) -> SessionItem:
    return SessionItem(worker, 1, "ALIVE", expires_at_ms, beat=beat)


def test_the_table_skew_counts_fresh_renews_only() -> None:
    seen = SkewSeen()
    lease_ms = 2000
    seen.sample([session("w1", 1, 10_000)], real_now_ms=9_000, lease_ms=lease_ms)
    assert seen.span(["w1"]) is None  # first sight: no change seen yet
    seen.sample([session("w1", 1, 10_000)], real_now_ms=9_500, lease_ms=lease_ms)
    assert seen.span(["w1"]) is None  # not renewed since
    seen.sample([session("w1", 2, 10_500)], real_now_ms=10_500, lease_ms=lease_ms)
    seen.sample([session("w1", 3, 10_800)], real_now_ms=11_000, lease_ms=lease_ms)
    assert seen.span(["w1"]) == [-2.2, -2.0]
    assert seen.span(["w2"]) is None
