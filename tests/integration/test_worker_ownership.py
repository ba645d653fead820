"""The worker's ownership rules under interleavings that a test orders explicitly: a
real :class:`Worker` in this process against DynamoDB Local, with its store calls
held and let go at chosen moments (tests.support.in_process)."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from tests.support.in_process import SCALED_TIMING, InProcessWorker, in_process_worker, until
from tests.support.timing import scaled
from wsfleet import session_rules
from wsfleet.desired_state import DesiredStateStore
from wsfleet.item import ConnectionItem
from wsfleet.item_io import get_connection
from wsfleet.lease_store import LeaseStore
from wsfleet.session_store import SessionStore

pytestmark = pytest.mark.timeout(scaled(90))


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def reap_from_outside(ddb, table: str, running: InProcessWorker, gen: int) -> None:
    """Another worker marks the session DEAD (its clock a lease ahead, so that the
    session counts as lapsed)."""
    sessions = SessionStore(ddb, table, running.worker.config.timing)
    session = sessions.get_session(running.worker.worker_id, gen)
    assert session is not None
    assert session.alive
    timing = running.worker.config.timing
    assert sessions.reap(session, "another-worker", now_ms() + timing.lease_ms + 500)


def item(ddb, table: str, connection_id: str) -> ConnectionItem:
    got = get_connection(ddb, table, connection_id)
    assert got is not None
    return got


@pytest.fixture
def in_process(ddb, table, sqs, queues, tmp_path):
    def start(**kwargs):
        return in_process_worker(ddb, table, sqs, queues.queue_url, tmp_path, **kwargs)

    return start


async def test_f1_a_lease_won_under_a_session_reaped_meanwhile_is_never_run(
    ddb, table, control: DesiredStateStore, in_process, feed_url
):
    """F1: an acquire waits (here: held before it is sent) while the session is
    reaped; it then lands under the DEAD session. It must not be run (the next
    session's renews would keep it alive while the reaper's sweepers run it too):
    it is given back at once, and taken again under the next session."""
    async with in_process() as running:
        await until(lambda: running.worker.session_gen == 1, what="session 1 open")
        acquires = running.store.hold("acquire")
        control.start("c1", f"{feed_url}/c1", now_ms())
        await acquires.entered_async()
        opens = running.renewals.hold("open")
        reap_from_outside(ddb, table, running, 1)
        await opens.entered_async()  # the worker saw the reap: the next open waits
        acquires.release()
        # The acquire landed under session 1 (epoch 1): given back without a run.
        # The acquire landed (epoch 1) and was given back (no owner).
        await until(
            lambda: (lambda got: got.lease_epoch == 1 and got.lease_owner is None)(
                item(ddb, table, "c1")
            ),
            what="the lease won under the reaped session given back",
        )
        assert "c1" not in running.worker.owned()  # no runner
        opens.release()
        await until(lambda: running.handler.deliveries, what="deliveries under session 2")
        assert {d.epoch for d in running.handler.deliveries} == {2}
        assert item(ddb, table, "c1").owner_session_gen == 2


async def test_f1_a_lease_landing_after_its_session_was_forgotten_is_given_back(
    ddb, table, control: DesiredStateStore, in_process, feed_url
):
    """F1: the acquire lands after the reaped session was swept and forgotten. Left
    alone, the connection would stay owned by a session item that no longer exists,
    which nobody sweeps: no worker would ever run it again."""
    sessions = SessionStore(ddb, table, SCALED_TIMING)
    async with in_process() as running:
        await until(lambda: running.worker.session_gen == 1, what="session 1 open")
        acquires = running.store.hold("acquire")
        control.start("c2", f"{feed_url}/c2", now_ms())
        await acquires.entered_async()
        worker_id = running.worker.worker_id
        reap_from_outside(ddb, table, running, 1)
        await until(lambda: running.worker.session_gen == 2, what="session 2 open")
        # Another worker swept the reaped session, found nothing, and forgot it.
        dead = sessions.get_session(worker_id, 1)
        assert dead is not None
        assert sessions.forget(dead)
        acquires.release()
        await until(
            lambda: item(ddb, table, "c2").owner_session_gen == running.worker.session_gen > 1,
            what="the connection owned by the live session",
        )
        await until(lambda: running.handler.deliveries, what="deliveries")
        assert {d.epoch for d in running.handler.deliveries} == {2}


async def test_f1_a_connection_owned_by_a_forgotten_session_is_taken_over(
    ddb, table, control: DesiredStateStore, in_process, feed_url
):
    """F1: a worker's acquire landed under its session 1 after that session was
    forgotten, and the worker died before giving it back; its session 2 is reaped.
    Whoever sweeps session 2 also takes what is still owned by the worker's earlier,
    forgotten sessions: otherwise nobody ever takes that connection again."""
    sessions = SessionStore(ddb, table, SCALED_TIMING)
    store = LeaseStore(ddb, table, SCALED_TIMING)
    t0 = now_ms() - 60_000  # session 2 lapsed a minute ago
    control.start("c3", f"{feed_url}/c3", t0)
    assert store.acquire("c3", "gone-worker", 1, t0)  # session 1: no item any more
    assert sessions.open("gone-worker", 2, t0, capacity=10)
    session = sessions.get_session("gone-worker", 2)
    assert session is not None
    assert sessions.reap(session, "another-worker", now_ms())
    async with in_process() as running:
        await until(
            lambda: item(ddb, table, "c3").lease_owner == running.worker.worker_id,
            within=15,
            what="the forgotten session's connection taken over",
        )
        await until(lambda: running.handler.deliveries, what="deliveries")
        assert {d.epoch for d in running.handler.deliveries} == {2}


async def test_f7_a_runner_cancelled_is_released_with_its_checkpoint_and_gives_its_slot_back(
    ddb, table, control: DesiredStateStore, in_process, feed_url
):
    """F7: cancelling a connection's task (as the shutdown does with a runner still
    going after its budget) must still end it in order: released with the
    checkpoint of what was handled, its slot given back."""
    async with in_process() as running:
        worker = running.worker
        control.start("c7", f"{feed_url}/c7", now_ms())
        await until(lambda: len(running.handler.deliveries) >= 5, what="deliveries")
        (task,) = [t for t in worker.holdings.owning if t.get_name() == "own:c7"]
        epoch = worker.owned()["c7"]
        task.cancel()
        await asyncio.wait([task], timeout=scaled(10))
        assert task.done()
        # What this hold handled: the shutdown ending's reassign hint may already have
        # had it taken again, and the next hold delivering.
        handled = max(d.seq for d in running.handler.deliveries if d.epoch == epoch)
        # Its slot was given back: every slot in use is a runner's or an acquire's
        # (the shutdown ending's reassign hint may already have it taken again).
        assert worker.capacity.used == len(worker.owned()) + len(worker.holdings.acquiring)
        assert item(ddb, table, "c7").last_seq == handled  # released with its checkpoint


async def test_f6_a_release_without_an_answer_keeps_its_final_checkpoint(
    ddb, table, control: DesiredStateStore, in_process, feed_url
):
    """F6: the release of a stopped connection never gets an answer. Its final
    checkpoint must not be lost: it stays on the session's page (for a takeover
    after a crash), and the own-check's stray release writes it, not the
    ``last_seq`` the item had when the lease was taken (0: everything handled
    during the hold would come again)."""
    async with in_process() as running:
        worker = running.worker
        control.start("c6", f"{feed_url}/c6", now_ms())
        await until(lambda: len(running.handler.deliveries) >= 5, what="deliveries")
        running.store.fail("release")
        control.stop("c6", now_ms())
        sessions = SessionStore(ddb, table, SCALED_TIMING)
        token = session_rules.notice_token("c6", "stop", now_ms(), "n1")
        assert sessions.notify(worker.worker_id, worker.session_gen, token)
        await until(lambda: "c6" not in worker.owned(), what="the runner ended")
        handled = running.handler.deliveries[-1].seq
        assert item(ddb, table, "c6").lease_owner == worker.worker_id  # not released
        assert await worker.write_page()
        page = sessions.read_page(worker.worker_id, worker.session_gen)
        assert page is not None
        assert page.entries["c6"].seq == handled
        running.store.heal("release")
        await until(
            lambda: item(ddb, table, "c6").lease_owner is None,
            within=15,
            what="the stray released by the own-check",
        )
        assert item(ddb, table, "c6").last_seq == handled


async def test_f8_a_burst_of_stops_is_read_in_batches_not_one_connection_at_a_time(
    ddb, table, control: DesiredStateStore, in_process, feed_url
):
    """F8: 150 stops noticed in one renew: the owner does not read the named
    connections one strongly consistent read each in series (which put the last stop
    far past the stop bound). A stop notice now ends its runner with no read at all
    (P3); what the own-check lists is read in batches of a hundred."""
    ids = [f"s{n:03d}" for n in range(150)]
    async with in_process(max_connections=200) as running:
        worker = running.worker
        t0 = now_ms()
        for cid in ids:
            control.start(cid, f"{feed_url}/{cid}?rate=1", t0)
        await until(lambda: len(worker.owned()) == len(ids), within=30, what="all owned")
        sessions = SessionStore(ddb, table, SCALED_TIMING)
        gen = worker.session_gen
        for cid in ids:
            control.stop(cid, now_ms())
        tokens = [session_rules.notice_token(cid, "stop", now_ms(), "n") for cid in ids]
        assert sessions.offer(worker.worker_id, gen, tokens)  # one write of all notices
        await until(lambda: not worker.owned(), within=20, what="every runner stopped")
        assert running.store.calls.get("get", 0) == 0
        # None for the notices, and maybe a batch or two for the own-check finding
        # the same stops in its listing: a handful, not one per connection.
        assert running.store.calls.get("get_many", 0) <= 5
        for cid in ids:
            assert item(ddb, table, cid).lease_owner is None


async def test_a_move_the_receiver_declines_is_hinted_not_left_in_the_unowned_index(
    ddb, table, control: DesiredStateStore, in_process, feed_url
):
    """A balance move offered to a worker whose own view puts it at its share (the
    giver's view said otherwise: another worker's loads as listed, a slow listing) is
    declined. Left in the unowned index, where every worker at or above its share
    leaves it too, it went without deliveries until the loads changed (seen: 17 s with
    one worker's DynamoDB slow). Declined, it is hinted on the start queue, which any
    worker with a free slot takes (here the receiver itself: its sweep takes nothing)."""
    ids = ["m1", "m2", "m3"]
    async with in_process() as running:
        worker = running.worker
        worker.balancer.room = lambda: 0  # type: ignore[method-assign]
        worker.balancer.room_for_free = lambda seen: 0  # type: ignore[method-assign]
        t0 = now_ms()
        for cid in ids:
            control.start(cid, f"{feed_url}/{cid}", t0)  # free, as a giver's release leaves it
        await until(lambda: worker.session_gen, what="session open")
        tokens = [
            session_rules.notice_token(cid, session_rules.OFFER, now_ms(), "n") for cid in ids
        ]
        sessions = SessionStore(ddb, table, SCALED_TIMING)
        assert sessions.offer(worker.worker_id, worker.session_gen, tokens)
        await until(
            lambda: set(worker.owned()) == set(ids), within=15, what="the declined moves taken"
        )


async def test_p2_the_own_check_runs_when_the_session_listing_fails(
    ddb, table, sqs, queues, control: DesiredStateStore, in_process, feed_url
):
    """P2: while every listing of the sessions fails, an acquire (from a start hint)
    lands and its answer is lost: the connection is this session's, run by nobody.
    The own-check, due on the next pass, must not wait for the listing: it gives the
    connection back with a hint, and it runs again."""
    async with in_process() as running:
        await until(lambda: running.worker.session_gen == 1, what="session 1 open")
        running.sessions.fail("list_sessions")
        running.store.lose_replies("acquire", 1)
        control.start("c1", f"{feed_url}/c1", now_ms())
        sqs.send_message(
            QueueUrl=queues.queue_url,
            MessageBody=json.dumps({"type": "reassign", "connection_id": "c1"}),
        )
        await until(
            lambda: item(ddb, table, "c1").owner_session_gen == 1,
            what="the acquire landed",
        )
        await until(
            lambda: running.handler.deliveries,
            within=2 * running.worker.config.timing.own_check_bound(),
            what="deliveries after the own-check gave the stray back",
        )
