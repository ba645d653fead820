"""The simulated fleet's own bookkeeping, which the invariants' excuses rest on."""

from __future__ import annotations

from sim.fleet import Fleet, Shape


def test_a_worker_counts_as_room_from_the_instant_it_starts() -> None:
    """A worker started while the fleet is short of room ends the shortage's excuse at
    once, not when its process first runs (the monitor kept excusing, or stopped
    excusing, at the wrong instant; seen at seed 58, where a replacement's start went
    uncounted and the excuse ended with the next SIGTERM instead)."""
    shape = Shape(
        workers=3, connections=20, rate=1.0, max_connections=8, duration=60.0, faults=0, batch=False
    )
    fleet = Fleet(1, shape)
    try:
        first = fleet.start_worker()
        fleet.start_worker()
        assert fleet.short_since is not None  # 16 slots for 20 connections
        fleet.world.now += 5.0
        fleet.start_worker()
        assert fleet.short_since is None  # 24 slots: room again, from this instant
        assert (1000.0, 1005.0, None, frozenset(), None) in fleet.monitor._excuses
        first.terminate()  # not run yet: a SIGTERM reaches it all the same
        assert fleet.short_since == 1005.0
        assert first.stop.is_set()
    finally:
        for process in fleet.processes:
            process.task.cancel()  # before it first ran: nothing of it was started
        fleet.world.run_until(fleet.world.now)
        fleet.world.close()


def test_a_worker_lost_during_a_brownout_can_leave_no_room_for_the_slow_workers_connections() -> (
    None
):
    """A worker whose DynamoDB is slow (or cut off, or whose process is paused) is not
    room for the others' connections while it lasts: it may lose its session and be
    slow to keep a new one. A crash during the brownout can leave the rest without
    room (seed 159 on the tight fleets: the slow worker gave its session up, the three
    others had 30 slots for 32 connections, and the excuse had been decided at the
    brownout's start, when a fourth still lived)."""
    shape = Shape(
        workers=4,
        connections=32,
        rate=1.0,
        max_connections=10,
        duration=60.0,
        faults=0,
        batch=False,
    )
    fleet = Fleet(1, shape)
    try:
        slow, *others = (fleet.start_worker() for _ in range(5))
        fleet.impair(slow, fleet.world.now + 10.0)
        assert fleet.short_since is None  # four others: 40 slots
        fleet.world.now += 2.0
        others[0].terminate()  # as a crash would: one worker less
        assert fleet.short_since == 1002.0  # 30 slots
        fleet.world.run_until(1010.0)  # the brownout ends: its worker is room again
        assert fleet.short_since is None
        assert (1002.0, 1010.0, None, frozenset(), None) in fleet.monitor._excuses
    finally:
        for process in fleet.processes:
            process.task.cancel()
        fleet.world.run_until(fleet.world.now)
        fleet.world.close()
