"""The lease store against DynamoDB Local (moto is not atomic for racing conditional
writes, so the lease protocol is only ever tested here).

A connection item is written only when its ownership changes (acquire, takeover,
release, park) and by the router (start, stop); the index keys move with those writes:
``owner_key`` while owned, ``free_shard`` exactly while STARTED, unowned and not parked.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

import pytest

from tests.support.stores import STORE_TIMING, T0, URL, eventually, won
from tests.support.timing import scaled
from wsfleet import schema
from wsfleet.checkpoint_page import CheckpointPage, PageEntry
from wsfleet.desired_state import StartOutcome, StopOutcome
from wsfleet.item import ConnectionItem
from wsfleet.item_io import get_connection, item_key
from wsfleet.lease_rules import AcquireRefusal, Lease, TakeoverStep
from wsfleet.lease_store import LeaseStore, Released

pytestmark = pytest.mark.timeout(scaled(120))

TIMING = STORE_TIMING
GEN = 1
"""The session generation every owner in these tests holds its leases under."""
NOT_RELEASED = Released(released=False, restarted=False, checkpointed=False)


@pytest.fixture
def read(ddb, table) -> Callable[[str], ConnectionItem | None]:
    """The item as stored (a consistent read), not through the store under test."""
    return lambda connection_id: get_connection(ddb, table, connection_id)


def item_of(read: Callable[[str], ConnectionItem | None], connection_id: str) -> ConnectionItem:
    item = read(connection_id)
    assert item is not None, connection_id
    return item


def unowned(store: LeaseStore) -> set[str]:
    return set(store.find_unowned(schema.free_shards(), limit=1_000))


# --- acquire ------------------------------------------------------------------------------


def test_sixteen_racing_acquirers_have_exactly_one_winner_every_round(store, control, read):
    racers = 16
    rounds = 50
    control.start("race", URL, T0)
    barrier = threading.Barrier(racers)
    winners_per_round: list[int] = []
    holder: Lease | None = None
    with ThreadPoolExecutor(racers) as pool:
        for round_no in range(rounds):
            now = T0 + round_no * 100
            if holder is not None and round_no % 2:
                # A plain release as the starting point ...
                assert store.release(holder, 0, now).released
            elif holder is not None:
                # ... or a stop, a release of the stopped connection, and a start again.
                control.stop("race", now)
                assert store.release(holder, 0, now).released
                assert control.start("race", URL, now).outcome is StartOutcome.RESTARTED

            def race(i: int, now: int = now) -> object:
                barrier.wait(timeout=scaled(30))
                return store.acquire("race", f"racer-{i}", GEN, now)

            results = list(pool.map(race, range(racers)))
            leases = [r for r in results if isinstance(r, Lease)]
            winners_per_round.append(len(leases))
            assert all(r is AcquireRefusal.HELD for r in results if not isinstance(r, Lease))
            holder = leases[0] if leases else None
            item = item_of(read, "race")
            assert holder is not None
            assert (item.lease_owner, item.lease_epoch) == (holder.owner, holder.epoch)
    assert winners_per_round == [1] * rounds
    assert item_of(read, "race").lease_epoch == rounds  # +1 per acquisition, never more


def test_acquire_returns_what_the_worker_needs_and_moves_the_index_keys(store, control, read, raw):
    control.start("c", URL, T0)
    assert raw("c")[schema.FREE_SHARD] == schema.free_shard("c")
    lease = won(store.acquire("c", "w1", GEN, T0 + 5))
    assert (lease.epoch, lease.last_seq, lease.start_gen, lease.ws_url) == (1, 0, 1, URL)
    assert (lease.owner, lease.session_gen, lease.seq_gen) == ("w1", GEN, 0)
    assert lease.takeover_latency_ms is None
    assert lease.failing_since_ms is None
    item = item_of(read, "c")
    assert (item.lease_owner, item.owner_session_gen, item.lease_epoch) == ("w1", GEN, 1)
    assert item.updated_at_ms == T0 + 5
    stored = raw("c")
    assert stored[schema.OWNER_KEY] == schema.owner_key("w1", GEN, "c")
    assert stored[schema.OWNER_KEY] in schema.owner_keys("w1", GEN)
    assert schema.FREE_SHARD not in stored
    assert "lease_expires_at_ms" not in stored  # the item carries no liveness of its own


def test_an_owned_connection_is_never_acquired_whatever_the_time(store, control, read):
    """Ownership lives as long as the owner's session: no clock on the item lets
    another worker take it; only a takeover after the reap does."""
    control.start("c", URL, T0)
    won(store.acquire("c", "w1", GEN, T0))
    for now in (T0 + 1, T0 + 10**6, T0 + 10**12):
        assert store.acquire("c", "w2", GEN, now) is AcquireRefusal.HELD
        assert store.acquire("c", "w1", GEN + 1, now) is AcquireRefusal.HELD
    assert item_of(read, "c").lease_epoch == 1


def test_acquire_of_stopped_parked_or_unknown_fails(store, control):
    control.start("c", URL, T0)
    assert control.stop("c", T0 + 1) is StopOutcome.STOPPED
    assert store.acquire("c", "w1", GEN, T0 + 2) is AcquireRefusal.STOPPED
    assert store.acquire("nope", "w1", GEN, T0 + 2) is AcquireRefusal.UNKNOWN_ID
    assert control.stop("nope", T0) is StopOutcome.NOT_FOUND
    control.start("p", URL, T0)
    store.park(won(store.acquire("p", "w1", GEN, T0)), 0, "HTTP 404", T0 + 1)
    assert store.acquire("p", "w2", GEN, T0 + 2) is AcquireRefusal.PARKED


def test_acquire_whose_reply_was_lost_adopts_the_lease_by_its_token(store, control, read):
    """What an SDK retry of the same attempt sees when its first try had in fact
    landed: the same owner, session and token. The lease is adopted with its stored
    epoch, not left held and run by nobody."""
    control.start("c", URL, T0)
    first = won(store.acquire("c", "w1", GEN, T0, token="attempt-1"))
    adopted = won(store.acquire("c", "w1", GEN, T0 + 3, token="attempt-1"))
    assert adopted == first
    assert adopted.epoch == 1
    item = item_of(read, "c")
    assert (item.lease_epoch, item.lease_token, item.updated_at_ms) == (1, "attempt-1", T0)
    assert store.release(adopted, 4, T0 + 10).released


def test_the_same_token_under_another_session_is_not_adopted(store, control):
    control.start("c", URL, T0)
    won(store.acquire("c", "w1", GEN, T0, token="attempt-1"))
    assert store.acquire("c", "w1", GEN + 1, T0, token="attempt-1") is AcquireRefusal.HELD
    assert store.acquire("c", "w2", GEN, T0, token="attempt-1") is AcquireRefusal.HELD


def test_a_new_attempt_never_adopts_an_older_hold_whose_release_is_in_flight(store, control, read):
    """A fenced runner's release was still on its way when the same worker tried the
    connection again. Adopting the old epoch would let the late release free the
    lease under a runner that believed it held it."""
    control.start("c", URL, T0)
    old = won(store.acquire("c", "w1", GEN, T0, token="attempt-1"))
    assert store.acquire("c", "w1", GEN, T0 + 1, token="attempt-2") is AcquireRefusal.HELD
    assert store.release(old, 7, T0 + 2).released  # the late release lands
    taken = won(store.acquire("c", "w2", GEN, T0 + 3))
    assert (taken.epoch, taken.last_seq) == (2, 7)
    item = item_of(read, "c")
    assert (item.lease_owner, item.lease_epoch) == ("w2", 2)


def test_each_acquire_attempt_writes_a_fresh_random_token(store, control, read):
    control.start("c", URL, T0)
    tokens = []
    for attempt in range(3):
        lease = won(store.acquire("c", "w1", GEN, T0 + attempt))
        tokens.append(item_of(read, "c").lease_token)
        assert store.release(lease, 0, T0 + attempt).released
    assert all(re.fullmatch(r"[0-9a-f]{16}", str(token)) for token in tokens), tokens
    assert len(set(tokens)) == 3


# --- the unowned index ------------------------------------------------------------------


def test_the_unowned_index_holds_a_connection_exactly_while_started_unowned_and_unparked(
    store, control, raw
):
    """create -> in; acquire -> out; release STARTED -> in; stop -> out; start -> in;
    acquire and park -> out; re-arming start -> in. The item's own ``free_shard`` is
    read strongly at every step; the (eventually consistent) index is polled."""

    def indexed(expected: bool) -> None:
        assert (schema.FREE_SHARD in raw("c")) is expected
        found = eventually(lambda: unowned(store), lambda ids: ("c" in ids) is expected)
        assert ("c" in found) is expected

    control.start("c", URL, T0)
    indexed(True)
    lease = won(store.acquire("c", "w1", GEN, T0 + 1))
    indexed(False)
    assert store.release(lease, 3, T0 + 2).released
    indexed(True)
    assert control.stop("c", T0 + 3) is StopOutcome.STOPPED
    indexed(False)
    assert control.start("c", URL, T0 + 4).outcome is StartOutcome.RESTARTED
    indexed(True)
    lease = won(store.acquire("c", "w2", GEN, T0 + 5))
    indexed(False)
    assert store.park(lease, 3, "HTTP 404", T0 + 6).parked
    indexed(False)
    assert control.start("c", URL, T0 + 7).outcome is StartOutcome.RESTARTED  # re-armed
    indexed(True)
    assert raw("c")[schema.FREE_SHARD] == schema.free_shard("c")


def test_find_unowned_reads_the_given_shards_up_to_the_limit(store, control):
    ids = [f"c{n}" for n in range(24)]
    for cid in ids:
        control.start(cid, URL, T0)
    held = won(store.acquire("c0", "w1", GEN, T0))
    control.stop("c1", T0)
    expected = set(ids) - {"c0", "c1"}
    assert eventually(lambda: unowned(store), lambda found: found == expected) == expected
    assert len(store.find_unowned(schema.free_shards(), limit=5)) == 5
    for shard in schema.free_shards():
        in_shard = {cid for cid in expected if schema.free_shard(cid) == shard}
        assert set(store.find_unowned([shard], limit=100)) == in_shard
    assert store.find_unowned(schema.free_shards(), limit=0) == []
    assert held.connection_id not in store.find_unowned(schema.free_shards(), limit=100)


# --- the owner index ----------------------------------------------------------------------


def test_owned_by_lists_a_sessions_connections_with_what_a_takeover_decides_on(store, control, raw):
    ids = [f"c{n}" for n in range(12)]
    for cid in ids:
        control.start(cid, URL, T0)
    leases = {cid: won(store.acquire(cid, "w1", GEN, T0)) for cid in ids[:10]}
    won(store.acquire("c10", "w1", GEN + 1, T0))  # the same worker, another session
    won(store.acquire("c11", "w2", GEN, T0))
    assert len({raw(cid)[schema.OWNER_KEY] for cid in ids[:10]}) > 1  # spread over shards

    def owned() -> dict[str, ConnectionItem]:
        return {item.connection_id: item for item in store.owned_by("w1", GEN)}

    listed = eventually(owned, lambda found: set(found) == set(ids[:10]))
    assert set(listed) == set(ids[:10])
    for cid, item in listed.items():
        assert (item.lease_owner, item.owner_session_gen) == ("w1", GEN)
        assert (item.desired_state, item.start_gen, item.lease_epoch) == (schema.STARTED, 1, 1)
        assert (item.seq_gen, item.last_seq, item.parked_reason) == (0, 0, None)
        assert item.lease_epoch == leases[cid].epoch
    other_session = eventually(
        lambda: {i.connection_id for i in store.owned_by("w1", GEN + 1)}, lambda ids: bool(ids)
    )
    assert other_session == {"c10"}

    assert store.release(leases["c0"], 5, T0 + 1).released
    assert store.park(leases["c1"], 5, "HTTP 404", T0 + 1).parked
    after = eventually(owned, lambda found: set(found) == set(ids[2:10]))
    assert set(after) == set(ids[2:10])


def test_owned_page_pages_through_one_owner_key_to_the_same_entries_as_owned_by(store, control):
    ids = [f"p{n}" for n in range(40)]
    for cid in ids:
        control.start(cid, URL, T0)
        won(store.acquire(cid, "w1", GEN, T0))

    def paged() -> list[str]:
        found: list[str] = []
        for key in schema.owner_keys("w1", GEN):
            start = None
            while True:
                page, start = store.owned_page(key, start, 3)
                assert len(page) <= 3
                found += [item.connection_id for item in page]
                if start is None:
                    break
        return found

    listed = eventually(paged, lambda found: sorted(found) == sorted(ids))
    assert sorted(listed) == sorted(ids)  # every entry once, none twice
    assert sorted(i.connection_id for i in store.owned_by("w1", GEN)) == sorted(ids)
    assert store.owned_page(schema.owner_keys("nobody", 1)[0], None, 3) == ([], None)


# --- takeover of a dead session's connections ---------------------------------------------


def dead_owned(store, control, read, cid: str = "c") -> ConnectionItem:
    """A STARTED connection owned by w1's session (the caller treats it as DEAD)."""
    control.start(cid, URL, T0)
    won(store.acquire(cid, "w1", GEN, T0))
    return item_of(read, cid)


def test_take_over_moves_the_connection_to_the_taker_with_the_next_epoch(store, control, read, raw):
    seen = dead_owned(store, control, read)
    lease = won(store.take_over(seen, "w2", 3, None, T0 + 100, latency_ms=42))
    assert (lease.owner, lease.session_gen, lease.epoch) == ("w2", 3, 2)
    assert (lease.takeover_latency_ms, lease.last_seq, lease.start_gen) == (42, 0, 1)
    stored = raw("c")
    assert stored[schema.OWNER_KEY] == schema.owner_key("w2", 3, "c")
    assert schema.FREE_SHARD not in stored
    item = item_of(read, "c")
    assert (item.lease_owner, item.owner_session_gen, item.lease_epoch) == ("w2", 3, 2)
    assert item.updated_at_ms == T0 + 100
    # The same listing taken over again (a second sweeper): nothing left to take.
    assert store.take_over(seen, "w3", 1, None, T0 + 101) is TakeoverStep.GONE
    assert item_of(read, "c").lease_owner == "w2"


def test_take_over_of_a_connection_started_again_since_it_was_read_retries_with_the_new_item(
    store, control, read
):
    seen = dead_owned(store, control, read)
    control.stop("c", T0 + 1)
    assert control.start("c", URL, T0 + 2).outcome is StartOutcome.RESTARTED  # still owned
    lease = won(store.take_over(seen, "w2", GEN, None, T0 + 3))
    assert (lease.start_gen, lease.epoch) == (2, 2)


def test_take_over_of_a_stopped_connection_clears_the_dead_owner(store, control, read, raw):
    seen = dead_owned(store, control, read)
    control.stop("c", T0 + 1)
    assert store.take_over(seen, "w2", GEN, None, T0 + 2) is TakeoverStep.CLEAR
    stored = raw("c")
    assert not {schema.LEASE_OWNER, schema.OWNER_SESSION_GEN, schema.OWNER_KEY} & set(stored)
    assert schema.FREE_SHARD not in stored
    item = item_of(read, "c")
    assert (item.desired_state, item.lease_epoch) == (schema.STOPPED, 1)


def test_clear_dead_owner_only_clears_a_stopped_connection_of_that_session(store, control, read):
    seen = dead_owned(store, control, read)
    assert not store.clear_dead_owner(seen, None, T0 + 1)  # STARTED: a takeover's business
    control.stop("c", T0 + 2)
    stopped = item_of(read, "c")
    assert store.clear_dead_owner(stopped, None, T0 + 3)
    item = item_of(read, "c")
    assert (item.lease_owner, item.owner_session_gen, item.updated_at_ms) == (None, None, T0 + 3)
    assert not store.clear_dead_owner(stopped, None, T0 + 4)  # already cleared


def test_a_connection_stopped_while_its_owner_was_dead_keeps_the_pages_checkpoint(
    store, control, read
):
    """Clearing the dead owner writes the dead session's page entry, so that a start on
    the same stream resumes from it instead of delivering the whole dead hold again
    (found by the simulator's redelivery invariant, seed 28)."""
    dead_owned(store, control, read)
    control.stop("c", T0 + 1)
    stopped = item_of(read, "c")
    entry = PageEntry(epoch=1, seq_gen=0, seq=9, advanced_at_ms=T0 + 20)
    assert store.clear_dead_owner(stopped, CheckpointPage(T0 + 50, {"c": entry}), T0 + 2)
    assert item_of(read, "c").last_seq == 9
    control.start("c", URL, T0 + 3)
    assert won(store.acquire("c", "w2", GEN, T0 + 4)).last_seq == 9


def test_clearing_a_dead_owner_writes_no_entry_of_another_hold_or_stream(store, control, read):
    dead_owned(store, control, read)
    control.stop("c", T0 + 1)
    stopped = item_of(read, "c")
    others = {
        "c": PageEntry(epoch=1, seq_gen=1, seq=9, advanced_at_ms=T0 + 20),  # another stream
    }
    assert store.clear_dead_owner(stopped, CheckpointPage(T0 + 50, others), T0 + 2)
    assert item_of(read, "c").last_seq == 0
    # The item is not as listed (its checkpoint differs): nothing is cleared.
    dead_owned(store, control, read, "d")
    control.stop("d", T0 + 3)
    listed = item_of(read, "d")
    entry = PageEntry(epoch=1, seq_gen=0, seq=9, advanced_at_ms=T0 + 20)
    later = replace(listed, last_seq=4)
    assert not store.clear_dead_owner(later, CheckpointPage(T0 + 50, {"d": entry}), T0 + 4)
    assert item_of(read, "d").lease_owner == "w1"


def test_take_over_of_a_connection_the_dead_owner_parked_meanwhile_takes_nothing(
    store, control, read
):
    seen = dead_owned(store, control, read)
    lease = Lease("c", "w1", 1, 1, URL, 0, session_gen=GEN)
    assert store.park(lease, 0, "HTTP 404", T0 + 1).parked
    assert store.take_over(seen, "w2", GEN, None, T0 + 2) is TakeoverStep.GONE
    item = item_of(read, "c")
    assert (item.lease_owner, item.parked_reason) == (None, "HTTP 404")


def test_a_takeover_knows_when_the_stream_last_moved_by_the_page(store, control, read):
    seen = dead_owned(store, control, read)
    page = CheckpointPage(
        T0 + 50, {"c": PageEntry(epoch=1, seq_gen=0, seq=9, advanced_at_ms=T0 + 20)}
    )
    lease = won(store.take_over(seen, "w2", 3, page, T0 + 100))
    assert (lease.last_seq, lease.advanced_at_ms) == (9, T0 + 20)


# --- what the runner needs beyond the URL ---------------------------------------------------


def test_the_protocol_and_the_secret_reference_reach_the_lease(store, control, ddb, table):
    control.start("c", URL, T0)
    ddb.update_item(
        TableName=table,
        Key=item_key("c"),
        UpdateExpression="SET #p = :p, #a = :a",
        ExpressionAttributeNames={"#p": schema.PROTOCOL, "#a": schema.AUTH_SECRET},
        ExpressionAttributeValues={
            ":p": {"S": '{"name":"live","options":{}}'},
            ":a": {"S": "websocket-fleet/feed"},
        },
    )
    lease = won(store.acquire("c", "w1", GEN, T0))
    assert (lease.protocol, lease.auth_secret) == (
        '{"name":"live","options":{}}',
        "websocket-fleet/feed",
    )


def test_a_release_leaves_when_the_stream_last_moved_for_the_next_holder(store, control, raw):
    control.start("c", URL, T0)
    lease = won(store.acquire("c", "w1", GEN, T0))
    assert store.release(lease, 12, T0 + 1_000, advanced_at_ms=T0 + 900).released
    stored = raw("c")
    assert (stored[schema.ADVANCED_AT_MS], stored[schema.ADVANCED_START_GEN]) == (T0 + 900, 1)
    taken = won(store.acquire("c", "w2", GEN, T0 + 1_001))
    assert taken.advanced_at_ms == T0 + 900
    # Stopped and started again: a new start, which lost nothing of the previous one.
    assert store.release(taken, 12, T0 + 1_500, advanced_at_ms=T0 + 1_400).released
    control.stop("c", T0 + 2_000)
    control.start("c", URL, T0 + 3_000)
    assert won(store.acquire("c", "w3", GEN, T0 + 3_001)).advanced_at_ms is None


# --- release ------------------------------------------------------------------------------


def test_release_then_acquire_by_another_resumes_from_the_checkpoint(store, control, read, raw):
    control.start("c", URL, T0)
    lease = won(store.acquire("c", "w1", GEN, T0))
    assert store.release(lease, 77, T0 + 1_000) == Released(
        released=True, restarted=False, checkpointed=True, started=True
    )
    stored = raw("c")
    assert not {schema.LEASE_OWNER, schema.OWNER_SESSION_GEN, schema.OWNER_KEY} & set(stored)
    assert schema.LEASE_TOKEN not in stored
    assert (stored[schema.LAST_SEQ], stored[schema.UPDATED_AT_MS]) == (77, T0 + 1_000)
    taken = won(store.acquire("c", "w2", GEN, T0 + 1_001))
    assert (taken.epoch, taken.last_seq) == (2, 77)
    assert taken.takeover_latency_ms is None  # a handoff, not a takeover
    assert store.release(lease, 80, T0 + 2_000) == NOT_RELEASED  # nothing left to the old
    assert item_of(read, "c").last_seq == 77


def test_a_plain_stop_release_is_the_stopped_variant(store, control, read, raw):
    control.start("c", URL, T0)
    lease = won(store.acquire("c", "w1", GEN, T0))
    control.stop("c", T0 + 1_000)
    released = store.release(lease, 4, T0 + 2_000)
    assert released == Released(released=True, restarted=False, checkpointed=True)
    item = item_of(read, "c")
    assert (item.last_seq, item.desired_state, item.lease_owner) == (4, schema.STOPPED, None)
    assert schema.FREE_SHARD not in raw("c")  # stopped: not in the unowned index


def test_release_after_restart_with_new_url_keeps_the_reset_checkpoint(store, control, read, raw):
    control.start("c", URL, T0)
    lease = won(store.acquire("c", "w1", GEN, T0))
    control.stop("c", T0 + 2_000)
    restarted = control.start("c", "wss://feed.example/b", T0 + 3_000)
    assert restarted.outcome is StartOutcome.RESTARTED
    assert schema.FREE_SHARD not in raw("c")  # still owned: the owner is told instead
    released = store.release(lease, 60, T0 + 4_000)
    assert released == Released(released=True, restarted=True, checkpointed=False, started=True)
    item = item_of(read, "c")
    assert (item.last_seq, item.ws_url, item.start_gen, item.lease_owner) == (
        0,
        "wss://feed.example/b",
        2,
        None,
    )
    assert raw("c")[schema.FREE_SHARD] == schema.free_shard("c")  # started and free
    again = won(store.acquire("c", "w2", GEN, T0 + 4_001))
    assert (again.ws_url, again.last_seq, again.start_gen, again.seq_gen) == (
        "wss://feed.example/b",
        0,
        2,
        1,
    )


def test_release_after_restart_with_the_same_url_keeps_the_final_checkpoint(store, control):
    """Stopped and started again with the same URL while held, released with 15: the
    stream is the same, so 15 must land, or the next owner delivers messages again."""
    control.start("c", URL, T0)
    lease = won(store.acquire("c", "w1", GEN, T0))
    control.stop("c", T0 + 2_000)
    assert control.start("c", URL, T0 + 3_000).outcome is StartOutcome.RESTARTED
    released = store.release(lease, 15, T0 + 4_000)
    assert released == Released(released=True, restarted=True, checkpointed=True, started=True)
    again = won(store.acquire("c", "w2", GEN, T0 + 4_001))
    assert (again.last_seq, again.start_gen) == (15, 2)


def test_a_release_retried_after_its_answer_was_lost_counts_as_released(store, control, read):
    """The first write lands and its answer is lost (a timeout; the SDK, or the
    release budget, tries again): the retry finds the item free under the lease's own
    epoch, which only this hold's release leaves. Counted as not released, the worker
    neither took a restarted connection again nor offered or hinted it, and it waited
    in the unowned index (found by the simulator, seed 50)."""
    control.start("c", URL, T0)
    lease = won(store.acquire("c", "w1", GEN, T0))
    control.stop("c", T0 + 1_000)
    assert control.start("c", "wss://feed.example/b", T0 + 1_500).outcome is (
        StartOutcome.RESTARTED
    )
    assert store.release(lease, 36, T0 + 2_000).released  # landed; its answer lost
    assert store.release(lease, 36, T0 + 2_100) == Released(
        released=True, restarted=True, checkpointed=False, started=True
    )
    item = item_of(read, "c")
    assert (item.lease_owner, item.lease_epoch, item.last_seq) == (None, 1, 0)
    # Same stream: the checkpoint the first try left is this release's.
    lease = won(store.acquire("c", "w1", GEN, T0 + 3_000))
    assert store.release(lease, 12, T0 + 4_000).released
    assert store.release(lease, 12, T0 + 4_100) == Released(
        released=True, restarted=False, checkpointed=True, started=True
    )
    # Taken by another since: nothing of this hold's is left.
    won(store.acquire("c", "w2", GEN, T0 + 5_000))
    assert store.release(lease, 12, T0 + 5_100) == NOT_RELEASED


def test_a_late_release_of_an_older_epoch_of_the_same_worker_frees_nothing(store, control, read):
    """w1's first session was reaped and w1 took the connection over under its next
    session (epoch 2). The release of epoch 1 arrives late: epoch 2 stays held."""
    seen = dead_owned(store, control, read)
    old = Lease("c", "w1", seen.lease_epoch, seen.start_gen, URL, 0, session_gen=GEN)
    newer = won(store.take_over(seen, "w1", GEN + 1, None, T0 + 1_000))
    assert newer.epoch == 2
    assert store.release(old, 5, T0 + 2_000) == NOT_RELEASED
    item = item_of(read, "c")
    assert (item.lease_owner, item.owner_session_gen, item.lease_epoch, item.last_seq) == (
        "w1",
        GEN + 1,
        2,
        0,
    )
    assert store.acquire("c", "w2", GEN, T0 + 3_000) is AcquireRefusal.HELD


class ClientSpy:
    """The DynamoDB Local client with a look at each call: records the arguments of
    every call, and runs ``before_update[n]`` just before the n-th ``update_item``
    (0-based), to let another writer in between two writes of the store."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.before_update: dict[int, Callable[[], object]] = {}

    def updates(self) -> int:
        return sum(1 for name, _ in self.calls if name == "update_item")

    def update_item(self, **kwargs: Any) -> Any:
        hook = self.before_update.pop(self.updates(), None)
        self.calls.append(("update_item", kwargs))
        if hook is not None:
            hook()
        return self._client.update_item(**kwargs)

    def get_item(self, **kwargs: Any) -> Any:
        self.calls.append(("get_item", kwargs))
        return self._client.get_item(**kwargs)

    def query(self, **kwargs: Any) -> Any:
        self.calls.append(("query", kwargs))
        return self._client.query(**kwargs)


def test_releasing_a_lease_no_longer_held_is_one_write_that_changes_nothing(
    ddb, table, control, read
):
    spy = ClientSpy(ddb)
    store = LeaseStore(spy, table, TIMING)
    seen = dead_owned(store, control, read)
    old = Lease("c", "w1", 1, 1, URL, 0, session_gen=GEN)
    won(store.take_over(seen, "w2", GEN, None, T0 + 1))
    before = read("c")
    writes = spy.updates()
    assert store.release(old, 5, T0 + 2) == NOT_RELEASED
    assert spy.updates() == writes + 1  # no second try without the checkpoint
    assert read("c") == before


def test_a_release_whose_second_write_finds_the_lease_taken_frees_nothing(
    ddb, table, control, read
):
    """The checkpoint was reset (restart with a new URL), so the release is sent again
    without it; in between, the session was reaped and another worker took the
    connection over. The second write must not free the new hold."""
    spy = ClientSpy(ddb)
    store = LeaseStore(spy, table, TIMING)
    other = LeaseStore(ddb, table, TIMING)
    control.start("c", URL, T0)
    lease = won(store.acquire("c", "w1", GEN, T0))
    control.stop("c", T0 + 1_000)
    control.start("c", "wss://feed.example/b", T0 + 2_000)
    taken: list[Lease] = []
    first_release = spy.updates()
    spy.before_update[first_release + 1] = lambda: taken.append(
        won(other.take_over(item_of(read, "c"), "w2", GEN, None, T0 + 3_000))
    )
    assert store.release(lease, 40, T0 + 3_001) == NOT_RELEASED
    assert spy.updates() == first_release + 2
    item = item_of(read, "c")
    assert (item.lease_owner, item.lease_epoch, item.last_seq) == ("w2", taken[0].epoch, 0)


# --- the router's writes -----------------------------------------------------------------


def test_start_outcomes_are_decided_by_conditional_writes(control, read):
    assert control.start("c", URL, T0).outcome is StartOutcome.CREATED
    assert control.start("c", URL, T0 + 1).outcome is StartOutcome.ALREADY_STARTED
    assert control.start("c", URL + "x", T0 + 2).outcome is StartOutcome.CONFLICT
    item = item_of(read, "c")
    assert (item.ws_url, item.start_gen, item.lease_owner, item.lease_epoch) == (URL, 1, None, 0)


def test_restart_with_the_same_url_keeps_the_checkpoint(store, control, read):
    control.start("c", URL, T0)
    lease = won(store.acquire("c", "w1", GEN, T0))
    assert store.release(lease, 12, T0 + 1).released
    control.stop("c", T0 + 2)
    assert item_of(read, "c").expires_at is not None
    assert control.start("c", URL, T0 + 3).outcome is StartOutcome.RESTARTED
    item = item_of(read, "c")
    assert (item.last_seq, item.start_gen, item.expires_at, item.desired_state) == (
        12,
        2,
        None,
        schema.STARTED,
    )


def test_seq_gen_moves_only_when_the_router_resets_the_checkpoint(store, control, read):
    control.start("c", URL, T0)
    first = won(store.acquire("c", "w1", GEN, T0))
    assert first.seq_gen == 0
    assert store.release(first, 3, T0 + 1).released
    for step, url in enumerate([URL, URL, "wss://feed.example/b", "wss://feed.example/b"]):
        control.stop("c", T0 + 10 + 2 * step)
        control.start("c", url, T0 + 11 + 2 * step)
    item = item_of(read, "c")
    assert (item.start_gen, item.seq_gen, item.last_seq) == (5, 1, 0)


# --- parking (docs/DESIGN.md §3.7) ------------------------------------------------------

REASON = "HTTP 404 from upstream"


def held(store, control, cid: str = "p") -> Lease:
    control.start(cid, URL, T0)
    return won(store.acquire(cid, "w1", GEN, T0))


def test_park_releases_with_the_final_checkpoint_and_marks_the_item(store, control, read, raw):
    lease = held(store, control)
    assert store.record_failing_since(lease, T0 + 100, T0 + 100)
    parked = store.park(lease, 9, REASON, T0 + 2_000)
    assert parked == Released(released=True, restarted=False, checkpointed=True, parked=True)
    item = item_of(read, "p")
    assert (item.lease_owner, item.owner_session_gen, item.lease_token) == (None, None, None)
    assert item.last_seq == 9
    assert (item.parked_reason, item.parked_at_ms, item.updated_at_ms) == (
        REASON,
        T0 + 2_000,
        T0 + 2_000,
    )
    assert item.failing_since_ms is None
    assert item.desired_state == schema.STARTED  # the router's alone
    assert not {schema.OWNER_KEY, schema.FREE_SHARD} & set(raw("p"))
    # A second park (a retry after a lost answer) finds nothing of ours.
    assert store.park(lease, 9, REASON, T0 + 2_001) == NOT_RELEASED


def test_a_parked_reason_is_kept_short(store, control, read):
    lease = held(store, control)
    store.park(lease, 0, "x" * 1_000, T0 + 1)
    assert item_of(read, "p").parked_reason == "x" * 200


def test_park_after_a_stop_or_a_restart_is_an_ordinary_release(store, control, read, raw):
    lease = held(store, control)
    control.stop("p", T0 + 10)
    released = store.park(lease, 6, REASON, T0 + 20)
    assert (released.released, released.parked, released.restarted) == (True, False, False)
    item = item_of(read, "p")
    assert (item.parked_reason, item.last_seq, item.lease_owner) == (None, 6, None)
    # A restart with another URL while held: the release sees it, the checkpoint is
    # not written over the reset, and the connection is free again.
    control.start("p", URL, T0 + 25)
    lease = won(store.acquire("p", "w1", GEN, T0 + 30))
    control.stop("p", T0 + 40)
    control.start("p", URL + "?v=2", T0 + 41)
    released = store.park(lease, 8, REASON, T0 + 50)
    assert (released.released, released.parked, released.restarted) == (True, False, True)
    item = item_of(read, "p")
    assert (item.parked_reason, item.last_seq) == (None, 0)
    assert raw("p")[schema.FREE_SHARD] == schema.free_shard("p")


@pytest.mark.parametrize(
    ("url", "keeps_checkpoint"), [(URL, True), ("wss://feed.example/other", False)]
)
def test_a_start_re_arms_a_parked_connection(store, control, read, url, keeps_checkpoint):
    lease = held(store, control)
    store.park(lease, 7, REASON, T0 + 10)
    before = item_of(read, "p")
    assert control.start("p", url, T0 + 20).outcome is StartOutcome.RESTARTED
    item = item_of(read, "p")
    assert (item.parked_reason, item.parked_at_ms, item.failing_since_ms) == (None, None, None)
    assert item.start_gen == before.start_gen + 1
    assert item.ws_url == url
    if keeps_checkpoint:
        assert (item.last_seq, item.seq_gen) == (7, before.seq_gen)
    else:
        assert (item.last_seq, item.seq_gen) == (0, before.seq_gen + 1)
    assert eventually(lambda: unowned(store), lambda ids: ids == {"p"}) == {"p"}
    again = won(store.acquire("p", "w2", GEN, T0 + 30))
    assert (again.epoch, again.last_seq) == (lease.epoch + 1, item.last_seq)
    # Re-armed and running: a second start is the usual "already started".
    assert control.start("p", url, T0 + 40).outcome is StartOutcome.ALREADY_STARTED


def test_a_stopped_parked_connection_stays_parked_until_started(store, control, read, raw):
    lease = held(store, control)
    store.park(lease, 3, REASON, T0 + 10)
    assert control.stop("p", T0 + 20) is StopOutcome.STOPPED
    item = item_of(read, "p")
    assert (item.desired_state, item.parked_reason) == (schema.STOPPED, REASON)
    assert store.acquire("p", "w2", GEN, T0 + 30) is AcquireRefusal.STOPPED
    assert control.start("p", URL, T0 + 40).outcome is StartOutcome.RESTARTED
    item = item_of(read, "p")
    assert (item.desired_state, item.parked_reason, item.expires_at) == (schema.STARTED, None, None)
    assert item.last_seq == 3
    assert raw("p")[schema.FREE_SHARD] == schema.free_shard("p")


def test_the_failing_mark_is_written_read_by_the_next_owner_and_cleared(store, control, read):
    lease = held(store, control)
    assert store.record_failing_since(lease, T0 + 100, T0 + 150)
    assert item_of(read, "p").failing_since_ms == T0 + 100
    assert item_of(read, "p").updated_at_ms == T0 + 150
    # The holder's session dies; the taker goes on from the recorded start.
    taken = won(store.take_over(item_of(read, "p"), "w2", GEN, None, T0 + 200))
    assert taken.failing_since_ms == T0 + 100
    # The old holder can no longer touch it.
    assert store.clear_failing_since(lease, T0 + 201) is False
    assert store.record_failing_since(lease, T0 + 201, T0 + 201) is False
    assert item_of(read, "p").failing_since_ms == T0 + 100
    assert store.clear_failing_since(taken, T0 + 202) is True
    assert item_of(read, "p").failing_since_ms is None
    assert store.release(taken, 0, T0 + 203).released
    assert won(store.acquire("p", "w3", GEN, T0 + 204)).failing_since_ms is None


def test_get_reads_the_item_strongly(store, control):
    assert store.get("c") is None
    control.start("c", URL, T0)
    lease = won(store.acquire("c", "w1", GEN, T0))
    got = store.get("c")
    assert got is not None
    assert (got.lease_owner, got.owner_session_gen, got.lease_epoch) == ("w1", GEN, lease.epoch)


@pytest.mark.parametrize("step", ["acquire", "take_over", "release", "release_after_reset"])
def test_every_ownership_write_stamps_updated_at(store, control, read, step):
    control.start("c", URL, T0)
    lease = won(store.acquire("c", "w1", GEN, T0 + 10))
    if step == "take_over":
        won(store.take_over(item_of(read, "c"), "w2", GEN, None, T0 + 20))
    elif step == "release":
        assert store.release(lease, 1, T0 + 20).checkpointed
    elif step == "release_after_reset":
        control.stop("c", T0 + 11)
        control.start("c", "wss://feed.example/b", T0 + 12)
        released = store.release(lease, 1, T0 + 20)
        assert (released.released, released.checkpointed) == (True, False)
    assert item_of(read, "c").updated_at_ms == (T0 + 10 if step == "acquire" else T0 + 20)


# --- sequence generations (docs/DESIGN.md §4.6, "Sequence restarts") -------------------


def test_a_new_sequence_generation_is_fenced_by_the_lease_and_the_start(store, control, read):
    from worker.sequence_restarts import lease_in_generation

    lease = held(store, control)
    assert schema.SEQ_GEN not in lease.absent or lease.seq_gen == 0
    assert store.begin_generation(lease, lease.seq_gen + 1, 1, 200, T0 + 100)
    item = item_of(read, "p")
    assert (item.seq_gen, item.last_seq) == (lease.seq_gen + 1, 0)
    assert (item.seq_reset_at_ms, item.seq_reset_from) == (T0 + 100, 200)
    # The same write again (its answer was lost) lands on the same generation.
    assert store.begin_generation(lease, lease.seq_gen + 1, 3, 200, T0 + 110)
    assert (item_of(read, "p").seq_gen, item_of(read, "p").last_seq) == (lease.seq_gen + 1, 2)
    # The holder goes on in the new generation: its release keeps the checkpoint.
    now = lease_in_generation(lease, lease.seq_gen + 1)
    assert not store.begin_generation(lease, lease.seq_gen + 2, 1, 9, T0 + 120)  # skips one
    released = store.release(now, 7, T0 + 130)
    assert released.released
    assert released.checkpointed
    assert (item_of(read, "p").seq_gen, item_of(read, "p").last_seq) == (lease.seq_gen + 1, 7)
    # Nobody else's: a superseded holder cannot begin one.
    assert not store.begin_generation(now, now.seq_gen + 1, 1, 7, T0 + 140)
    assert item_of(read, "p").seq_gen == now.seq_gen


def test_a_start_of_another_stream_fails_a_late_new_generation(store, control, read):
    from worker.sequence_restarts import lease_in_generation

    lease = held(store, control)
    assert store.begin_generation(lease, lease.seq_gen + 1, 1, 40, T0 + 5)
    lease = lease_in_generation(lease, lease.seq_gen + 1)
    assert control.stop("p", T0 + 10) is StopOutcome.STOPPED
    # The router starts another stream while the holder still has the lease: the
    # old stream's reset means nothing for it.
    assert control.start("p", URL + "?other=1", T0 + 20).outcome is StartOutcome.RESTARTED
    router_gen = item_of(read, "p").seq_gen
    assert router_gen == lease.seq_gen + 1
    assert item_of(read, "p").seq_reset_at_ms is None
    assert not store.begin_generation(lease, lease.seq_gen + 1, 1, 50, T0 + 30)
    item = item_of(read, "p")
    assert (item.seq_gen, item.last_seq, item.seq_reset_at_ms) == (router_gen, 0, None)
