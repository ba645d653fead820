"""Sessions with real worker processes: what a reap, a stray hold and a restart under
a paused owner do (docs/DESIGN.md §3). Deadlines are about twice the promised bounds."""

from __future__ import annotations

import itertools
import signal
import time

import pytest

from benchmarks.tcp_proxy import ProxyThread
from local_stack.audit import Record, stale_deliveries
from local_stack.workers import wait_ready
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


def longest_dark(records: list[Record], connection_id: str, since: float) -> float:
    """The longest time ``connection_id`` went without a delivery (by any worker),
    from its last delivery at or before ``since`` to its last one."""
    times = sorted(r.t for r in records if r.connection_id == connection_id)
    before = [t for t in times if t <= since]
    span = [before[-1] if before else since, *(t for t in times if t > since)]
    return max((b - a for a, b in itertools.pairwise(span)), default=0.0)


@pytest.mark.parametrize(
    ("one_way", "given_up"),
    [(0.15, False), (1.0, True)],
    ids=["round-trips-0.3s", "round-trips-2s"],
)
def test_one_slow_worker_leaves_no_connection_dark_longer_than_the_crash_bound(
    fleet: Fleet, one_way: float, given_up: bool
):
    """One worker's DynamoDB round trips slow down to 0.3 s (more than a third of a
    heartbeat: its renews still land in their window and count, and it keeps
    delivering), or to 2 s (more than the 1.6 s fence window: it gives its session up,
    and the other worker takes its connections over). Either way no connection goes
    without deliveries for longer than the crash failover bound, and none is handled
    under an epoch that was superseded."""
    ids = [f"slow-{i}" for i in range(3)]
    with ProxyThread() as proxies:
        proxy = proxies.add(int(fleet.endpoints.dynamodb.rsplit(":", 1)[1]))
        # No balance rounds: a move between the two would change who delivers for
        # reasons that have nothing to do with the renew.
        no_balance = {"BALANCE_ROUND_SECONDS": "0"}
        slow = fleet.launch_worker(
            "slow", fleet.worker_env("slow", no_balance, dynamodb_endpoint=proxy.endpoint)
        )
        wait_ready([slow], scaled(30))
        for cid in ids:
            fleet.start_connection(cid)
        fleet.wait_handling(ids, scaled(15))
        other = fleet.start_worker("other", **no_balance)
        slowed_at = time.time()
        proxy.delay(one_way)
        # Long enough past the slowdown for a paused connection to show (the fence
        # window) and for a given-up one to be taken over (the crash bound).
        watch_until = slowed_at + TIMING.fence_after + CRASH_BOUND

        def all_flowing_after() -> bool:
            records = fleet.records()
            return all(
                any(r.connection_id == cid and r.t > watch_until for r in records) for cid in ids
            )

        wait_until(
            all_flowing_after,
            scaled(2 * CRASH_BOUND) + (watch_until - time.time()),
            "every connection to be delivering again past the slowdown",
        )
        records = fleet.records()
        dark = {cid: longest_dark(records, cid, slowed_at) for cid in ids}
        print(f"longest without deliveries at {2 * one_way:g} s round trips: {dark}")
        assert max(dark.values()) <= CRASH_BOUND, dark
        after = [r for r in records if r.t > watch_until]
        if given_up:
            assert {r.worker for r in after} == {other.worker_id}
            assert "session given up" in slow.log()
        else:
            assert {r.worker for r in after} == {slow.worker_id}
            assert "session fence deadline passed" not in slow.log()
        proxy.heal()
    fleet.assert_clean_audit()
