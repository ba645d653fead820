"""Sessions, checkpoint pages and takeovers against DynamoDB Local: racing reapers and
takers, late renews, a takeover racing the router's stop, resume points, late pages,
the router's notices and forgetting a dead session."""

from __future__ import annotations

import random
import threading
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from botocore.exceptions import ReadTimeoutError

from tests.support.stores import STORE_TIMING, T0, URL, eventually, won
from tests.support.timing import scaled
from wsfleet import schema, session_rules
from wsfleet.checkpoint_page import CheckpointPage, PageEntry
from wsfleet.desired_state import DesiredStateStore, StartOutcome, StopOutcome
from wsfleet.item import ConnectionItem
from wsfleet.item_io import get_connection, item_key
from wsfleet.lease_rules import AcquireRefusal, Lease, TakeoverStep
from wsfleet.lease_store import LeaseStore
from wsfleet.session_rules import RenewRefusal, SessionItem
from wsfleet.session_store import SessionRenewed, SessionStore

pytestmark = pytest.mark.timeout(scaled(240))

TIMING = STORE_TIMING
LAPSED = T0 + TIMING.lease_ms + 1
"""A wall time for the reaps' records: it decides nothing."""
"""The first instant at which a session opened (or last renewed) at T0 may be reaped."""


@pytest.fixture
def sessions(ddb, table) -> SessionStore:
    return SessionStore(ddb, table, TIMING)


@pytest.fixture
def read(ddb, table) -> Callable[[str], ConnectionItem]:
    def read_item(connection_id: str) -> ConnectionItem:
        item = get_connection(ddb, table, connection_id)
        assert item is not None, connection_id
        return item

    return read_item


def session_of(sessions: SessionStore, worker_id: str, gen: int = 1) -> SessionItem:
    found = sessions.get_session(worker_id, gen)
    assert found is not None, (worker_id, gen)
    return found


def owned_ids(store: LeaseStore, worker_id: str, gen: int = 1) -> set[str]:
    return {item.connection_id for item in store.owned_by(worker_id, gen)}


def reaped(sessions: SessionStore, worker_id: str, gen: int = 1) -> SessionItem:
    """Reap the (lapsed) session and return it as stored."""
    assert sessions.reap(session_of(sessions, worker_id, gen), "reaper", LAPSED)
    return session_of(sessions, worker_id, gen)


def session_owning(
    sessions: SessionStore, store: LeaseStore, control: DesiredStateStore, ids: list[str]
) -> None:
    """w1's session 1, opened at T0, owning ``ids``, and not renewed since (it lapses
    at ``LAPSED``)."""
    assert sessions.open("w1", 1, T0, capacity=len(ids))
    for cid in ids:
        control.start(cid, URL, T0)
        won(store.acquire(cid, "w1", 1, T0))


# --- many reapers, many takers ------------------------------------------------------------


def test_sixteen_reapers_of_a_lapsed_session_then_sixteen_takers_of_its_200_connections(
    sessions, store, control, read
):
    """Every round: one winning reap out of 16, then the 16 race through the dead
    session's listing, each in its own order; every connection is taken exactly once,
    with the next epoch, resuming from the dead session's page. (Three rounds: each
    makes 3 200 takeover attempts, about 15 s of DynamoDB Local on two vCPUs.)"""
    racers, connections, rounds = 16, 200, 3
    with ThreadPoolExecutor(racers) as pool:
        for round_no in range(rounds):
            dead = f"dead-{round_no}"
            ids = [f"r{round_no}-c{n}" for n in range(connections)]
            assert sessions.open(dead, 1, T0, capacity=connections)
            list(pool.map(lambda cid: control.start(cid, URL, T0), ids))
            leases = list(pool.map(lambda cid, d=dead: won(store.acquire(cid, d, 1, T0)), ids))
            page_seqs = {lease.connection_id: 10 + n for n, lease in enumerate(leases)}
            entries = {cid: PageEntry(1, 0, seq, T0) for cid, seq in page_seqs.items()}
            assert sessions.write_page(dead, 1, entries, T0 + 1_000, 1)
            listed = eventually(lambda d=dead: owned_ids(store, d), lambda found: len(found) == 200)
            assert listed == set(ids)
            session = session_of(sessions, dead)
            barrier = threading.Barrier(racers)

            def reap(
                i: int, session: SessionItem = session, barrier: threading.Barrier = barrier
            ) -> bool:
                barrier.wait(timeout=scaled(30))
                return sessions.reap(session, f"reaper-{i}", LAPSED)

            reaps = list(pool.map(reap, range(racers)))
            assert reaps.count(True) == 1, reaps
            after = session_of(sessions, dead)
            assert (after.state, after.reaped_by) == (schema.DEAD, f"reaper-{reaps.index(True)}")
            assert after.reaped_at_ms == LAPSED

            def take(i: int, dead: str = dead, barrier: threading.Barrier = barrier) -> list[Lease]:
                barrier.wait(timeout=scaled(30))
                seen = store.owned_by(dead, 1)
                page = sessions.read_page(dead, 1)
                random.Random(i).shuffle(seen)
                taken = []
                for item in seen:
                    result = store.take_over(item, f"reaper-{i}", 1, page, LAPSED + i)
                    if isinstance(result, Lease):
                        taken.append(result)
                    else:
                        assert result is TakeoverStep.GONE, result
                return taken

            per_taker = list(pool.map(take, range(racers)))
            won_leases = [lease for taken in per_taker for lease in taken]
            counts = Counter(lease.connection_id for lease in won_leases)
            assert set(counts) == set(ids)
            assert set(counts.values()) == {1}
            assert sum(1 for taken in per_taker if taken) > 1  # they did race
            for taker, taken in enumerate(per_taker):
                for lease in taken:
                    assert (lease.owner, lease.session_gen) == (f"reaper-{taker}", 1)
                    assert (lease.epoch, lease.last_seq) == (2, page_seqs[lease.connection_id])
            for lease in won_leases:
                item = read(lease.connection_id)
                assert (item.lease_owner, item.owner_session_gen) == (lease.owner, 1)
                assert (item.lease_epoch, item.last_seq) == (2, lease.last_seq)
            assert eventually(lambda d=dead: owned_ids(store, d), lambda found: not found) == set()


# --- renew, reap, retire ------------------------------------------------------------------


def test_a_late_renew_after_a_reap_is_refused_and_never_revives_the_session(sessions):
    assert sessions.open("w1", 1, T0, capacity=10)
    assert isinstance(sessions.renew("w1", 1, T0 + 1_000, connections=3), SessionRenewed)
    reap_at = T0 + 1_000 + TIMING.lease_ms + 1
    assert sessions.reap(session_of(sessions, "w1"), "w2", reap_at)
    for sent in (T0 + 1_500, reap_at, reap_at + 10**6):  # late, on time, far later
        assert sessions.renew("w1", 1, sent, connections=3) is RenewRefusal.REAPED
    session = session_of(sessions, "w1")
    assert (session.state, session.reaped_by, session.reaped_at_ms) == (schema.DEAD, "w2", reap_at)
    assert session.expires_at_ms == T0 + 1_000 + TIMING.lease_ms
    assert not sessions.reap(session, "w3", reap_at + 10**6)  # reaped once, by one
    assert session_of(sessions, "w1").reaped_by == "w2"


def test_a_reap_records_its_plan_and_a_refused_reap_leaves_it_alone(sessions):
    """The plan of who takes what lands with the reap and is read back, by a listing
    and a strong read alike, exactly; a second reaper's plan never replaces it."""
    assert sessions.open("w1", 1, T0, capacity=10)
    plan = (("w2", "c149"), ("w3", "c249"), ("w4", None))
    assert sessions.reap(session_of(sessions, "w1"), "w2", LAPSED, plan)
    assert not sessions.reap(session_of(sessions, "w1"), "w3", LAPSED + 5, (("w3", None),))
    listed = {s.key: s for s in sessions.list_sessions()}[("w1", 1)]
    assert listed == session_of(sessions, "w1")
    assert (listed.state, listed.reaped_by, listed.takers) == (schema.DEAD, "w2", plan)
    # A reap without one (an older worker's) reads back as no plan.
    assert sessions.open("w5", 1, T0, capacity=10)
    assert sessions.reap(session_of(sessions, "w5"), "w2", LAPSED)
    assert session_of(sessions, "w5").takers is None


def test_a_reap_passes_only_on_the_beat_its_reaper_saw(sessions):
    """The reap's condition is the beat, not a time: a renew that lands after the
    reaper's listing fails it, whatever the wall clocks say (here a reap stamped an
    hour early, and one stamped an hour late)."""
    assert sessions.open("w1", 1, T0, capacity=1)
    seen = session_of(sessions, "w1")
    assert (seen.beat, seen.expires_at_ms, seen.started_at_ms) == (0, T0 + TIMING.lease_ms, T0)
    assert isinstance(sessions.renew("w1", 1, T0 + 600, connections=0), SessionRenewed)
    assert not sessions.reap(seen, "w2", T0 + 3_600_000)
    assert session_of(sessions, "w1").alive
    renewed = session_of(sessions, "w1")
    assert renewed.beat == 1
    assert sessions.reap(renewed, "w2", T0 - 3_600_000)
    assert session_of(sessions, "w1").state == schema.DEAD


def test_every_renew_that_lands_changes_the_beat_in_any_order(sessions):
    """Renews overlap (one a heartbeat, each awaited for the fence window): one that
    lands after a later one still lands, and still changes the beat, so a reaper that
    saw neither cannot reap. The wall-clock expiry it writes is for people."""
    assert sessions.open("w1", 1, T0, capacity=4)
    assert isinstance(sessions.renew("w1", 1, T0 + 2_000, connections=2), SessionRenewed)
    assert isinstance(sessions.renew("w1", 1, T0 + 1_000, connections=1), SessionRenewed)
    session = session_of(sessions, "w1")
    assert (session.beat, session.connections) == (2, 1)
    # A wall clock stepped back an hour changes nothing either.
    assert isinstance(sessions.renew("w1", 1, T0 - 3_600_000, connections=1), SessionRenewed)
    assert session_of(sessions, "w1").beat == 3


def test_a_session_is_opened_once_per_generation_and_listed(sessions):
    for worker in ("w1", "w2", "w3", "w4", "w5"):
        assert sessions.open(worker, 1, T0, capacity=7)
    assert not sessions.open("w1", 1, T0 + 5, capacity=7)  # a retried put that had landed
    assert sessions.open("w1", 2, T0 + 5, capacity=7)
    listed = {s.key: s for s in sessions.list_sessions()}
    assert set(listed) == {("w1", 1), ("w1", 2), ("w2", 1), ("w3", 1), ("w4", 1), ("w5", 1)}
    assert listed[("w1", 1)].started_at_ms == T0  # not overwritten by the retry
    assert all(s.alive and s.capacity == 7 for s in listed.values())


def test_a_retired_session_is_dead_and_cannot_be_renewed(sessions):
    assert sessions.open("w1", 1, T0, capacity=1)
    assert sessions.retire("w1", 1, T0 + 10)
    assert not sessions.retire("w1", 1, T0 + 11)
    session = session_of(sessions, "w1")
    assert (session.state, session.reaped_by, session.reaped_at_ms) == (schema.DEAD, "w1", T0 + 10)
    assert sessions.renew("w1", 1, T0 + 12, connections=0) is RenewRefusal.REAPED


# --- a takeover racing the router ----------------------------------------------------------


def test_a_takeover_racing_a_stop_takes_nothing_and_a_restart_frees_the_connection(
    ddb, table, sessions, store, control, read, raw
):
    session_owning(sessions, store, control, ["c"])
    reaped(sessions, "w1")
    seen_list = eventually(lambda: store.owned_by("w1", 1), lambda found: len(found) == 1)
    [seen] = seen_list
    assert seen.started
    # The router stops it between the taker's listing and its takeover.
    assert control.stop("c", LAPSED + 1) is StopOutcome.STOPPED
    assert store.take_over(seen, "w2", 1, None, LAPSED + 2) is TakeoverStep.CLEAR
    item = read("c")
    assert (item.desired_state, item.lease_owner, item.owner_session_gen) == (
        schema.STOPPED,
        None,
        None,
    )
    assert item.lease_epoch == seen.lease_epoch  # never taken
    assert not {schema.OWNER_KEY, schema.FREE_SHARD} & set(raw("c"))
    assert eventually(lambda: owned_ids(store, "w1"), lambda found: not found) == set()
    # Started again: free, STARTED, in the unowned index, and acquirable.
    assert control.start("c", URL, LAPSED + 3).outcome is StartOutcome.RESTARTED
    item = read("c")
    assert (item.desired_state, item.lease_owner) == (schema.STARTED, None)
    assert raw("c")[schema.FREE_SHARD] == schema.free_shard("c")
    found = eventually(
        lambda: set(store.find_unowned(schema.free_shards(), limit=10)), lambda ids: "c" in ids
    )
    assert found == {"c"}
    lease = won(store.acquire("c", "w3", 1, LAPSED + 4))
    assert (lease.epoch, lease.start_gen) == (seen.lease_epoch + 1, seen.start_gen + 1)


def test_a_takeover_after_a_stop_and_a_start_takes_the_new_start(sessions, store, control, read):
    """Stopped and started again while its dead owner still names it (the start's
    owned variant leaves it out of the unowned index): only a takeover moves it, and
    it takes the newer start."""
    session_owning(sessions, store, control, ["c"])
    reaped(sessions, "w1")
    [seen] = eventually(lambda: store.owned_by("w1", 1), lambda found: len(found) == 1)
    control.stop("c", LAPSED + 1)
    assert control.start("c", URL, LAPSED + 2).outcome is StartOutcome.RESTARTED
    assert store.acquire("c", "w2", 1, LAPSED + 3) is AcquireRefusal.HELD
    lease = won(store.take_over(seen, "w2", 1, None, LAPSED + 4))
    assert (lease.start_gen, lease.epoch) == (seen.start_gen + 1, seen.lease_epoch + 1)
    assert read("c").lease_owner == "w2"


# --- resume points ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("entry", "resumes_at"),
    [
        # The item's hold is epoch 2, its stream seq_gen 0, its own checkpoint 5.
        (PageEntry(epoch=2, seq_gen=0, seq=42, advanced_at_ms=T0), 42),  # ahead: used
        (PageEntry(epoch=3, seq_gen=0, seq=42, advanced_at_ms=T0), 5),  # another epoch
        (PageEntry(epoch=1, seq_gen=0, seq=42, advanced_at_ms=T0), 5),  # an older hold
        (PageEntry(epoch=2, seq_gen=1, seq=42, advanced_at_ms=T0), 5),  # another stream
        (PageEntry(epoch=2, seq_gen=0, seq=3, advanced_at_ms=T0), 5),  # behind the item
        (None, 5),  # no entry for it
    ],
)
def test_the_resume_point_comes_from_the_page_only_for_the_items_hold_and_stream(
    sessions, store, control, read, entry, resumes_at
):
    control.start("c", URL, T0)
    first = won(store.acquire("c", "w0", 1, T0))
    assert store.release(first, 5, T0 + 1).released
    assert sessions.open("w1", 1, T0, capacity=1)
    assert won(store.acquire("c", "w1", 1, T0 + 2)).epoch == 2
    entries = {"other": PageEntry(2, 0, 99, T0)} | ({} if entry is None else {"c": entry})
    assert sessions.write_page("w1", 1, entries, T0 + 3, 1)
    reaped(sessions, "w1")
    page = sessions.read_page("w1", 1)
    assert page is not None
    [seen] = eventually(lambda: store.owned_by("w1", 1), lambda found: len(found) == 1)
    assert (seen.lease_epoch, seen.seq_gen, seen.last_seq) == (2, 0, 5)
    lease = won(store.take_over(seen, "w2", 1, page, LAPSED + 1))
    assert (lease.epoch, lease.last_seq) == (3, resumes_at)
    assert read("c").last_seq == resumes_at


class UpdateHook:
    """The client, with ``before_first_update`` run just before the first
    ``update_item`` call (another writer slipping in between a read and a write)."""

    def __init__(self, client: Any, before_first_update: Callable[[], object]) -> None:
        self._client = client
        self._hook: Callable[[], object] | None = before_first_update
        self.updates = 0

    def update_item(self, **kwargs: Any) -> Any:
        self.updates += 1
        hook, self._hook = self._hook, None
        if hook is not None:
            hook()
        return self._client.update_item(**kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)


def test_a_takeover_is_conditioned_on_the_checkpoint_it_read(
    ddb, table, sessions, store, control, read
):
    """A checkpoint lands on the item (owner unchanged) between the taker's read and
    its write: the first attempt fails, and the retry resumes from the fresh item."""
    session_owning(sessions, store, control, ["c"])
    assert sessions.write_page("w1", 1, {"c": PageEntry(1, 0, 42, T0)}, T0 + 1, 1)
    reaped(sessions, "w1")
    [seen] = eventually(lambda: store.owned_by("w1", 1), lambda found: len(found) == 1)
    page = sessions.read_page("w1", 1)

    def checkpoint() -> None:
        ddb.update_item(
            TableName=table,
            Key=item_key("c"),
            UpdateExpression="SET #seq = :seq",
            ExpressionAttributeNames={"#seq": schema.LAST_SEQ},
            ExpressionAttributeValues={":seq": {"N": "50"}},
        )

    client = UpdateHook(ddb, checkpoint)
    lease = won(LeaseStore(client, table, TIMING).take_over(seen, "w2", 1, page, LAPSED + 1))
    assert client.updates == 2  # refused on the stale last_seq, then again on the fresh one
    assert (lease.last_seq, lease.epoch) == (50, 2)  # 50, not the page's older 42
    item = read("c")
    assert (item.last_seq, item.lease_owner, item.lease_epoch) == (50, "w2", 2)


def test_a_final_release_between_the_read_and_the_takeover_leaves_the_connection_free(
    ddb, table, sessions, store, control, read
):
    """The dead session's runner was still releasing (with its final checkpoint) when
    the taker read the listing: the takeover takes nothing, and the connection is
    free with that checkpoint for anyone to acquire."""
    session_owning(sessions, store, control, ["c"])
    reaped(sessions, "w1")
    [seen] = eventually(lambda: store.owned_by("w1", 1), lambda found: len(found) == 1)
    late = Lease("c", "w1", seen.lease_epoch, seen.start_gen, URL, 0, session_gen=1)

    client = UpdateHook(ddb, lambda: store.release(late, 17, LAPSED))
    result = LeaseStore(client, table, TIMING).take_over(seen, "w2", 1, None, LAPSED + 1)
    assert result is TakeoverStep.GONE
    item = read("c")
    assert (item.lease_owner, item.last_seq, item.lease_epoch) == (None, 17, 1)
    assert won(store.acquire("c", "w2", 1, LAPSED + 2)).last_seq == 17


# --- checkpoint pages ---------------------------------------------------------------------


def test_a_page_written_late_records_nothing_unhandled(sessions):
    """A page write that arrives after a newer one (an older snapshot of the
    checkpoints, a lower number) is refused: the stored page keeps the newer entries."""
    t1, t2 = T0 + 5_000, T0 + 10_000
    newer = {"a": PageEntry(1, 0, 20, t2 - 300), "b": PageEntry(3, 1, 7, None)}
    older = {"a": PageEntry(1, 0, 12, t1 - 100), "b": PageEntry(3, 1, 2, t1 - 100)}
    assert sessions.write_page("w1", 1, newer, t2, 2)
    assert sessions.write_page("w1", 1, older, t1, 1) is False
    assert sessions.write_page("w1", 1, older, t2, 2) is False  # not even the same number
    page = sessions.read_page("w1", 1)
    assert page == CheckpointPage(written_at_ms=t2, entries=newer)
    assert sessions.write_page("w1", 1, older, t2 + 1, 3)  # a genuinely newer write passes
    assert sessions.read_page("w1", 1) == CheckpointPage(t2 + 1, older)
    assert sessions.read_page("w1", 2) is None


def test_a_page_is_ordered_by_its_number_not_by_its_wall_time(sessions):
    """A writer whose wall clock stepped back keeps writing its pages: before the
    number, every page was refused until the clock caught up, and a takeover resumed
    from the last page before the step (found by the simulator, seed 118 on the draws
    of `128e23a`: 15 s of messages delivered again after a crash)."""
    entries = {"a": PageEntry(1, 0, 30, None)}
    assert sessions.write_page("w1", 1, {"a": PageEntry(1, 0, 20, None)}, T0, 1)
    assert sessions.write_page("w1", 1, entries, T0 - 21_300, 2)  # the clock went back
    assert sessions.read_page("w1", 1) == CheckpointPage(T0 - 21_300, entries)


def test_a_page_of_five_hundred_connections_fits_in_one_small_item(ddb, table, sessions):
    entries = {
        f"conn-{n:04d}": PageEntry(n % 7 + 1, n % 3, 1_000_000 + n * 13, T0 - n) for n in range(500)
    }
    assert sessions.write_page("w1", 1, entries, T0, 1)
    page = sessions.read_page("w1", 1)
    assert page is not None
    assert page.entries == entries
    stored = ddb.get_item(TableName=table, Key=_page_key("w1", 1), ConsistentRead=True)["Item"]
    assert len(stored[schema.PAGE_ENTRIES]["B"]) < 16_000


def _page_key(worker_id: str, gen: int) -> dict[str, Any]:
    return {k: {"S": v} for k, v in schema.page_key(worker_id, gen).items()}


# --- notices ------------------------------------------------------------------------------


def test_a_stop_notifies_the_owner_and_a_renew_removes_exactly_what_was_acted_on(
    sessions, store, control
):
    session_owning(sessions, store, control, ["c", "d"])  # alive: renewed below
    assert sessions.renew("w1", 1, T0 + 100, connections=2) == SessionRenewed(frozenset())
    assert control.stop("c", T0 + 200) is StopOutcome.STOPPED
    (stop,) = sessions.renew("w1", 1, T0 + 300, connections=2).notices  # type: ignore[union-attr]
    assert stop.startswith(f"c stop {T0 + 200} ")
    assert session_rules.notice_connection_id(stop) == "c"
    # A second write for the same connection while the first is being acted on, and
    # one for another connection.
    assert control.start("c", URL, T0 + 400).outcome is StartOutcome.RESTARTED
    assert control.stop("d", T0 + 400) is StopOutcome.STOPPED
    renewed = sessions.renew("w1", 1, T0 + 500, connections=2, acted_on={stop})
    assert isinstance(renewed, SessionRenewed)
    (start,) = {t for t in renewed.notices if t.startswith(f"c start {T0 + 400} ")}
    (stop_d,) = {t for t in renewed.notices if t.startswith(f"d stop {T0 + 400} ")}
    assert renewed.notices == frozenset({start, stop_d})
    renewed = sessions.renew("w1", 1, T0 + 600, connections=2, acted_on={start, stop})
    assert renewed == SessionRenewed(frozenset({stop_d}))
    assert session_of(sessions, "w1").notices == frozenset({stop_d})


def test_a_start_or_stop_of_an_unowned_connection_notifies_nobody(sessions, store, control):
    assert sessions.open("w1", 1, T0, capacity=1)
    control.start("c", URL, T0)
    lease = won(store.acquire("c", "w1", 1, T0))
    assert store.release(lease, 0, T0 + 1).released
    control.stop("c", T0 + 2)
    control.start("c", URL, T0 + 3)
    assert session_of(sessions, "w1").notices == frozenset()


def test_a_notice_for_a_forgotten_session_is_a_no_op(ddb, table, sessions, store, control, read):
    session_owning(sessions, store, control, ["c"])
    assert sessions.forget(reaped(sessions, "w1"))
    assert read("c").lease_owner == "w1"  # the item still names the forgotten session
    assert control.stop("c", LAPSED + 1) is StopOutcome.STOPPED  # no error
    assert control.start("c", URL, LAPSED + 2).outcome is StartOutcome.RESTARTED
    assert sessions.get_session("w1", 1) is None  # not brought back by the notice
    assert not sessions.notify("w1", 1, session_rules.notice_token("c", "stop", LAPSED, "n0"))
    assert sessions.get_session("w1", 1) is None
    assert sessions.list_sessions() == []


# --- forgetting ---------------------------------------------------------------------------


def test_forget_deletes_only_a_dead_session_and_its_page(sessions):
    for worker in ("alive", "dead", "retired"):
        assert sessions.open(worker, 1, T0, capacity=1)
        assert sessions.write_page(worker, 1, {"c": PageEntry(1, 0, 1, T0)}, T0 + 1, 1)
    assert isinstance(sessions.renew("alive", 1, LAPSED, connections=0), SessionRenewed)
    assert sessions.retire("retired", 1, T0 + 2)
    dead = reaped(sessions, "dead")

    assert not sessions.forget(session_of(sessions, "alive"))
    assert session_of(sessions, "alive").alive
    assert sessions.read_page("alive", 1) is not None

    assert sessions.forget(dead)
    assert sessions.get_session("dead", 1) is None
    assert sessions.read_page("dead", 1) is None
    assert sessions.forget(session_of(sessions, "retired"))
    assert sessions.read_page("retired", 1) is None

    # A session that was renewed since it was listed (as lapsed) is not forgotten
    # either: the condition reads the stored state, not the listed one.
    stale = SessionItem("alive", 1, schema.DEAD, T0)
    assert not sessions.forget(stale)
    assert {s.key for s in sessions.list_sessions()} == {("alive", 1)}


# --- batched takeovers -------------------------------------------------------------------


def test_a_batched_takeover_takes_every_connection_once_from_the_page(
    sessions, store, control, read
):
    """200 connections in transactions of 50: each taken with the next epoch, resuming
    from the dead session's page where its entry belongs to the hold."""
    ids = [f"b{n:03d}" for n in range(200)]
    session_owning(sessions, store, control, ids)
    entries = {
        cid: PageEntry(epoch=1, seq_gen=0, seq=n, advanced_at_ms=T0) for n, cid in enumerate(ids)
    }
    assert sessions.write_page("w1", 1, entries, T0 + 1, 1)
    assert sessions.reap(session_of(sessions, "w1"), "w2", LAPSED)
    seen = eventually(lambda: store.owned_by("w1", 1), lambda found: len(found) == 200)
    page = sessions.read_page("w1", 1)
    results = store.take_over_many(seen, "w2", 7, page, LAPSED + 1, latency_ms=5)
    assert set(results) == set(ids)
    for n, cid in enumerate(ids):
        lease = results[cid]
        assert isinstance(lease, Lease), (cid, lease)
        assert (lease.owner, lease.session_gen, lease.epoch) == ("w2", 7, 2)
        assert lease.last_seq == n
        assert lease.ws_url == URL
        assert lease.takeover_latency_ms == 5
        assert lease.advanced_at_ms == T0  # when its stream last moved, by the page
        item = read(cid)
        assert (item.lease_owner, item.owner_session_gen, item.lease_epoch) == ("w2", 7, 2)
        assert item.last_seq == n
    assert store.takeover_conflicts == 0


class LostReplies:
    """The table's client, except that every transaction's answer is lost (a read
    timeout): after it landed, or before it reached the table."""

    def __init__(self, client: Any, *, lands: bool) -> None:
        self._client = client
        self._lands = lands
        self.transactions = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    def transact_write_items(self, **kwargs: Any) -> Any:
        self.transactions += 1
        if self._lands:
            self._client.transact_write_items(**kwargs)
        raise ReadTimeoutError(endpoint_url="http://dynamodb.local")


@pytest.mark.parametrize("lands", [True, False])
def test_a_batched_takeover_whose_answer_was_lost_is_read_back(
    ddb, table, sessions, store, control, read, lands
):
    """The transaction's outcome is unknown: it landed whole or not at all, and its
    token on the items says which. Landed, every connection is this session's lease
    (not left owned and run by nobody); not landed, each is taken over on its own."""
    ids = [f"t{n:02d}" for n in range(60)]
    session_owning(sessions, store, control, ids)
    assert sessions.reap(session_of(sessions, "w1"), "w2", LAPSED)
    seen = eventually(lambda: store.owned_by("w1", 1), lambda found: len(found) == 60)
    client = LostReplies(ddb, lands=lands)
    results = LeaseStore(client, table, TIMING).take_over_many(seen, "w2", 7, None, LAPSED + 1)
    assert client.transactions == 2  # 50 and 10
    assert set(results) == set(ids)
    for cid in ids:
        lease = results[cid]
        assert isinstance(lease, Lease), (cid, lease)
        assert (lease.owner, lease.session_gen, lease.epoch) == ("w2", 7, 2)
        item = read(cid)
        assert (item.lease_owner, item.owner_session_gen, item.lease_epoch) == ("w2", 7, 2)


def test_a_batch_refused_for_one_changed_item_is_taken_apart(sessions, store, control, read):
    """One connection of the batch was stopped after the listing: the transaction is
    refused as a whole, and each connection is then decided on its own item: the
    others are taken, the stopped one cleared."""
    ids = [f"p{n}" for n in range(5)]
    session_owning(sessions, store, control, ids)
    assert sessions.reap(session_of(sessions, "w1"), "w2", LAPSED)
    seen = eventually(lambda: store.owned_by("w1", 1), lambda found: len(found) == 5)
    assert control.stop("p2", LAPSED) is StopOutcome.STOPPED
    results = store.take_over_many(seen, "w2", 1, None, LAPSED + 1)
    assert results["p2"] is TakeoverStep.CLEAR
    assert read("p2").lease_owner is None
    for cid in ("p0", "p1", "p3", "p4"):
        assert isinstance(results[cid], Lease), cid
        assert read(cid).lease_owner == "w2"


class _BeforeBatchGet:
    """A DynamoDB client that runs ``before`` ahead of its next ``BatchGetItem``: a
    write ordered exactly between a takeover's transaction and its batch read."""

    def __init__(self, client: Any, before: Callable[[], None]) -> None:
        self._client = client
        self._before: Callable[[], None] | None = before

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    def batch_get_item(self, **kwargs: Any) -> Any:
        before, self._before = self._before, None
        if before is not None:
            before()
        return self._client.batch_get_item(**kwargs)


def test_a_batched_takeover_never_pairs_a_new_stream_with_the_old_resume_point(
    ddb, table, sessions, store, control, read
):
    """F2: between the takeover's transaction and its batch read, the router stops the
    connection and starts it again on a new URL (a new stream: ``last_seq`` reset,
    ``seq_gen`` moved). The lease must resume the new stream from its own start,
    not from the old stream's page entry: seqs 1..40 of the new stream would reach
    no handler."""
    session_owning(sessions, store, control, ["f"])
    assert sessions.write_page(
        "w1", 1, {"f": PageEntry(epoch=1, seq_gen=0, seq=40, advanced_at_ms=T0)}, T0 + 1, 1
    )
    assert sessions.reap(session_of(sessions, "w1"), "w2", LAPSED)
    seen = eventually(lambda: store.owned_by("w1", 1), lambda found: len(found) == 1)
    new_url = URL + "/new"

    def restart_on_a_new_stream() -> None:
        assert control.stop("f", LAPSED + 2) is StopOutcome.STOPPED
        assert control.start("f", new_url, LAPSED + 3).outcome is StartOutcome.RESTARTED

    taker = LeaseStore(_BeforeBatchGet(ddb, restart_on_a_new_stream), table, TIMING)
    results = taker.take_over_many(seen, "w2", 1, sessions.read_page("w1", 1), LAPSED + 1)
    lease = results["f"]
    assert isinstance(lease, Lease), lease
    item = read("f")
    assert (item.ws_url, item.seq_gen, item.last_seq) == (new_url, 1, 0)
    assert (lease.ws_url, lease.seq_gen, lease.last_seq) == (new_url, 1, 0)
    assert lease.advanced_at_ms is None  # the old stream's advance says nothing of this one


def test_two_batched_takers_racing_take_each_connection_once(sessions, store, control, read):
    ids = [f"x{n:02d}" for n in range(60)]
    session_owning(sessions, store, control, ids)
    assert sessions.reap(session_of(sessions, "w1"), "w2", LAPSED)
    seen = eventually(lambda: store.owned_by("w1", 1), lambda found: len(found) == 60)
    with ThreadPoolExecutor(2) as pool:
        first, second = pool.map(
            lambda taker: store.take_over_many(
                sorted(seen, key=lambda item: item.connection_id, reverse=taker == "w3"),
                taker,
                1,
                None,
                LAPSED + 1,
            ),
            ["w2", "w3"],
        )
    winners = Counter()
    for results in (first, second):
        for cid, result in results.items():
            if isinstance(result, Lease):
                winners[cid] += 1
    assert winners == Counter(dict.fromkeys(ids, 1))
    assert {read(cid).lease_epoch for cid in ids} == {2}


# --- offers between workers ------------------------------------------------------------------


def test_an_offer_lands_on_a_live_session_in_one_write_and_is_idempotent(sessions):
    """A balance move or a drain offers released connections to a live session: every
    token arrives with the receiver's next renew; a retried offer (an ADD) adds nothing
    twice; the router's notices and the offers sit side by side."""
    assert sessions.open("r", 1, T0, capacity=10)
    offers = [
        session_rules.notice_token(cid, session_rules.OFFER, T0 + 1, "n1") for cid in ("a", "b")
    ]
    drain = session_rules.notice_token("c", session_rules.DRAIN, T0 + 2, "n2")
    assert sessions.offer("r", 1, offers)
    assert sessions.offer("r", 1, [offers[0]])  # the retry of a write that had landed
    assert sessions.offer("r", 1, [offers[1], offers[1]])  # one token twice: written once
    assert sessions.offer("r", 1, [drain])
    assert sessions.notify("r", 1, session_rules.notice_token("d", "stop", T0 + 3, "n3"))
    renewed = sessions.renew("r", 1, T0 + 100, connections=0)
    assert isinstance(renewed, SessionRenewed)
    by_kind = Counter(session_rules.notice_kind(token) for token in renewed.notices)
    assert by_kind == {session_rules.OFFER: 2, session_rules.DRAIN: 1, "stop": 1}
    assert {session_rules.notice_connection_id(t) for t in renewed.notices} == set("abcd")
    assert set(offers) | {drain} <= renewed.notices
    # Acted on: gone with the next renew, the rest stays.
    renewed = sessions.renew("r", 1, T0 + 200, connections=3, acted_on=[*offers, drain])
    assert isinstance(renewed, SessionRenewed)
    assert {session_rules.notice_kind(t) for t in renewed.notices} == {"stop"}


@pytest.mark.parametrize("how", ["retired", "reaped", "never opened"])
def test_an_offer_to_a_session_that_is_not_alive_is_refused_and_writes_nothing(sessions, how):
    """The giver then leaves the connection to the unowned index (a hint, a sweep):
    a dead session never gathers offers it cannot act on, and none is created."""
    if how != "never opened":
        assert sessions.open("r", 1, T0, capacity=10)
    if how == "retired":
        assert sessions.retire("r", 1, T0 + 10)
    elif how == "reaped":
        reaped(sessions, "r")
    token = session_rules.notice_token("a", session_rules.OFFER, T0 + 20, "n1")
    assert not sessions.offer("r", 1, [token])
    stored = sessions.get_session("r", 1)
    assert (stored is None) if how == "never opened" else (stored.notices == frozenset())
