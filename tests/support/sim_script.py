"""Scripted runs of the simulated fleet: a test says what happens when, the monitor
judges the run by the promises, with no excuse but those the script makes."""

from __future__ import annotations

from collections.abc import Callable

from sim.fleet import Fleet, Shape, watched
from sim.invariants import Violation
from sim.scenario import START


def run_script(
    shape: Shape, script: Callable[[Fleet], None], until: float, seed: int = 7
) -> list[Violation]:
    """Run ``script`` (it schedules its events on ``fleet.world``) from ``START`` to
    ``until``, check the streams, then SIGTERM every worker left; the violations."""
    fleet = Fleet(seed, shape)
    try:
        with watched(fleet):
            world = fleet.world
            world.now = START
            script(fleet)
            world.run_until(until)
            fleet.monitor.check_streaming(fleet.short_since)
            fleet.monitor.check_failovers()
            for process in fleet.processes:
                if process.alive:
                    process.terminate()
            world.run_until(world.now + fleet.timing.shutdown_budget + 5.0)
        return list(fleet.monitor.violations)
    finally:
        for process in fleet.processes:
            process.task.cancel()
        fleet.world.run_until(fleet.world.now)
        fleet.world.close()


def start_connections(fleet: Fleet, count: int, *, first_at: float = START + 0.5) -> None:
    """The router starts ``c0`` .. ``c<count-1>``, a tenth of a second apart."""
    for index in range(count):
        connection_id = f"c{index}"
        fleet.world.at(
            first_at + index * 0.1,
            lambda connection_id=connection_id: fleet.router.start(connection_id),
        )
