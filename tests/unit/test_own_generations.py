"""Which of its sessions a worker's own-check lists: the live one, and earlier ones
under which a write may have landed unseen, until a check a release budget after
that write lists nothing there (worker/standing.py)."""

from __future__ import annotations

import time

import pytest

from tests.support.bare_worker import bare_worker
from worker.fleet_worker import Worker
from wsfleet.timing import LeaseTiming

pytestmark = pytest.mark.timeout(10)

TIMING = LeaseTiming.from_lease(2.5)


def worker() -> Worker:
    return bare_worker(TIMING)


def live(w: Worker, gen: int) -> None:
    w.standing.gen, w.standing.live = gen, True


async def test_an_earlier_session_with_a_write_in_doubt_is_listed_until_settled() -> None:
    w = worker()
    live(w, 1)
    assert w.own_generations() == [1]
    w.standing.suspect(1, time.monotonic())  # an acquire under session 1 got no answer
    w.standing.live = False  # then session 1 was reaped
    assert w.session_gen == 0
    assert w.own_generations() == [1]
    live(w, 2)
    assert w.own_generations() == [2, 1]
    marked = w.standing.suspect_gens[1]
    # Nothing listed, but too soon after the write: it may still land.
    w.own_check_found(1, 0, marked + TIMING.release_budget / 2)
    assert w.own_generations() == [2, 1]
    # Something listed: the stray release follows; still listed until clean.
    w.own_check_found(1, 1, marked + TIMING.release_budget)
    assert w.own_generations() == [2, 1]
    w.own_check_found(1, 0, marked + TIMING.release_budget)
    assert w.own_generations() == [2]


async def test_a_doubt_under_the_live_session_is_covered_by_its_own_listing() -> None:
    w = worker()
    live(w, 3)
    w.standing.suspect(3, time.monotonic())
    assert w.take_doubt()
    assert w.own_generations() == [3]
    w.own_check_found(3, 5, time.monotonic())
    assert 3 not in w.standing.suspect_gens
