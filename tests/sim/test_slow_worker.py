"""A worker that is slow but alive (docs/DESIGN.md §3.11): its DynamoDB round trips lie
between the shared client's attempt timeout and the renew window, so its renews land
and its session lives while every other call of its times out, and lands all the same.
Nothing it is handed, nothing it is told, may go dark or run on for that: the
simulator's invariants judge it with no excuse for the slowness.

- P2: balance moves to a worker that turns slow ran nowhere for most of the slowdown
  (its acquires timed out, landed, and were never run; its own-check could not list).
- P3: stops of the slow worker's connections did not end their delivery until its
  reads answered again; a start again on a new stream went the same way.
"""

from __future__ import annotations

import pytest

from sim.fleet import Fleet, Shape
from sim.scenario import START
from tests.support.sim_script import run_script, start_connections

SLOW_ONE_WAY = (0.35, 0.85)
"""Extra seconds each way: round trips of about 0.7 s and 1.7 s, past the shared
client's 0.5 s attempt timeout and inside the renew window (1.98 s)."""


def _slow(fleet: Fleet, name: str, at: float, seconds: float, one_way: float) -> None:
    def begin() -> None:
        process = next(p for p in fleet.processes if p.name == name)
        process.link.brownouts.append((at, at + seconds, one_way))
        fleet.monitor.event(f"{name}'s DynamoDB slow for {seconds:.0f}s")

    fleet.world.at(at, begin)


SHAPE = Shape(
    workers=2, connections=24, rate=4.0, max_connections=24, duration=80.0, faults=0, batch=False
)


def _start_fleet(fleet: Fleet, workers: int) -> None:
    for _ in range(workers):
        fleet.start_worker()
    start_connections(fleet, SHAPE.connections)


@pytest.mark.parametrize("one_way", SLOW_ONE_WAY)
def test_moves_to_a_worker_that_turns_slow_run_within_the_crash_bound(one_way: float) -> None:
    """P2: a third worker joins (the others move a share of their connections to it)
    and its DynamoDB turns slow as it does, for 30 s."""

    def script(fleet: Fleet) -> None:
        _start_fleet(fleet, 2)
        fleet.world.at(START + 15.0, fleet.start_worker)
        _slow(fleet, "w3", START + 15.5, 30.0, one_way)

    violations = run_script(SHAPE, script, START + 60.0)
    assert [v for v in violations if v.invariant == 3] == []
    assert violations == []


@pytest.mark.parametrize("one_way", SLOW_ONE_WAY)
def test_stops_and_restarts_sent_to_a_slow_worker_are_honoured(one_way: float) -> None:
    """P3: one worker of two turns slow for 30 s; the router stops four of its
    connections, then starts two of them again on a new stream."""
    stopped: list[str] = []

    def script(fleet: Fleet) -> None:
        _start_fleet(fleet, 2)
        _slow(fleet, "w1", START + 15.0, 30.0, one_way)

        def stop_some() -> None:
            stopped.extend(sorted(fleet.monitor.run_by("w1"))[:4])
            for connection_id in stopped:
                fleet.router.stop(connection_id)

        def start_again() -> None:
            for connection_id in stopped[:2]:
                fleet.router.start(connection_id, new_stream=True)

        fleet.world.at(START + 20.0, stop_some)
        fleet.world.at(START + 28.0, start_again)

    violations = run_script(SHAPE, script, START + 60.0)
    assert len(stopped) == 4
    assert [v for v in violations if v.invariant == 4] == []
    assert violations == []
