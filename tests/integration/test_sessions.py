"""Sessions with real worker processes: what a reap, a stray hold and a restart under
a paused owner do (docs/DESIGN.md §3). Deadlines are about twice the promised bounds."""

from __future__ import annotations

import signal
import time

import pytest

from local_stack.audit import stale_deliveries
from tests.support.fleet import TIMING, Fleet, wait_until
from tests.support.timing import scaled
from wsfleet import schema
from wsfleet.desired_state import stop_update
from wsfleet.item_io import update_connection
from wsfleet.lease_rules import Lease
from wsfleet.lease_store import LeaseStore
from wsfleet.session_store import SessionStore

pytestmark = [pytest.mark.fleet, pytest.mark.timeout(scaled(120))]

CRASH_BOUND = TIMING.crash_failover_bound()


def session_gen_of(fleet: Fleet, worker_id: str) -> int:
    store = SessionStore(fleet.ddb, fleet.resources.table, TIMING)

    def alive_gen() -> int | None:
        gens = [s.session_gen for s in store.list_sessions() if s.worker_id == worker_id]
        return max(gens) if gens else None

    return wait_until(alive_gen, scaled(10), f"a session of {worker_id}")


def test_a_connection_owned_but_not_run_is_released_within_the_own_check_bound(fleet: Fleet):
    """An acquire whose reply never came back leaves the connection owned by a live
    session that does not run it; the owner's periodic check of its by-owner entries
    finds it and releases it (here the worker never saw the write: no error tells it
    to look sooner)."""
    worker = fleet.start_worker("w", MAX_CONNECTIONS="1")
    fleet.start_connection("filler")
    fleet.wait_handling(["filler"], scaled(15))  # full: takes nothing else now
    gen = session_gen_of(fleet, worker.worker_id)
    fleet.start_connection("stray")
    store = LeaseStore(fleet.ddb, fleet.resources.table, TIMING)
    won = store.acquire("stray", worker.worker_id, gen, int(time.time() * 1000))
    assert isinstance(won, Lease)  # the write landed; its reply "was lost"
    acquired_at = time.monotonic()
    bound = TIMING.own_check_bound()
    wait_until(
        lambda: fleet.item("stray").lease_owner is None,
        scaled(2 * bound),
        "the stray hold to be released",
    )
    print(f"stray hold released after {time.monotonic() - acquired_at:.2f} s (bound {bound} s)")
    item = fleet.item("stray")
    assert item.free_shard == schema.free_shard("stray")  # free for anyone again
    assert item.lease_epoch == won.epoch
    assert fleet.highest_seq("stray") == 0  # nobody ran it meanwhile


def test_a_restart_with_a_new_url_under_a_paused_owner_then_killed_loses_no_seq(
    fleet: Fleet,
):
    """The owner is paused (SIGSTOP) when the router restarts its connection with a new
    URL; the session lapses, another worker reaps it and takes the connection over
    with the new stream from its start (the page's entry belongs to the old stream);
    the paused owner is then killed. Nothing of the new stream is lost, and no
    delivery happens under an epoch older than one that began."""
    first = fleet.start_worker("first")
    fleet.start_connection("moving", fleet.feed("old-stream"))
    fleet.wait_handling(["moving"], scaled(15), min_seq=5)
    second = fleet.start_worker("second")
    assert fleet.item("moving").lease_owner == first.worker_id
    paused_at = time.time()
    first.signal(signal.SIGSTOP)
    fleet.stop_connection("moving")
    fleet.start_connection("moving", fleet.feed("new-stream"))
    wait_until(
        lambda: any(r.feed == "new-stream" and r.seq >= 10 for r in fleet.records()),
        scaled(2 * CRASH_BOUND + 2),
        "the new stream to be handled by the other worker",
    )
    first.signal(signal.SIGKILL)
    first.wait(timeout=scaled(10))
    new = [r for r in fleet.records() if r.feed == "new-stream"]
    assert {r.worker for r in new} == {second.worker_id}
    assert min(r.seq for r in new) == 1
    assert sorted({r.seq for r in new}) == list(range(1, max(r.seq for r in new) + 1))
    old = [r for r in fleet.records() if r.feed == "old-stream"]
    assert all(r.t <= paused_at + TIMING.fence_after for r in old)
    assert min(r.epoch for r in new) > max(r.epoch for r in old)
    assert stale_deliveries(fleet.records()) == []


def test_a_stop_whose_notice_was_lost_is_noticed_by_the_owners_reconcile(fleet: Fleet):
    """The router stopped the connection but died before telling the owner's session:
    the owner's next reconcile sees the STOPPED entry among its own and acts on it."""
    fleet.start_worker("w")
    fleet.start_connection("quiet-stop")
    fleet.wait_handling(["quiet-stop"], scaled(15))
    update_connection(
        fleet.ddb,
        fleet.resources.table,
        "quiet-stop",
        stop_update(int(time.time() * 1000)),
        return_values="NONE",
    )
    stopped_at = time.monotonic()
    bound = TIMING.own_check_bound()
    wait_until(
        lambda: fleet.item("quiet-stop").lease_owner is None,
        scaled(2 * bound),
        "the owner to notice the stop and release",
    )
    print(f"stop without a notice acted on after {time.monotonic() - stopped_at:.2f} s")
    item = fleet.item("quiet-stop")
    assert item.desired_state == schema.STOPPED
    assert item.last_seq == fleet.highest_seq("quiet-stop")  # the final checkpoint
