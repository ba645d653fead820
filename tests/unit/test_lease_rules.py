"""The ownership rules of one connection, as tables of inputs and expected decisions.

Every write is checked twice: its exact expressions, names and values, and what it
does when run against items (tests/unit/expressions.py evaluates the condition and
applies the update as DynamoDB would, refusing unused or undefined placeholders).
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.unit.expressions import Item, attempt
from wsfleet import schema
from wsfleet.checkpoint_page import PageEntry
from wsfleet.item import ConnectionItem, from_attributes, to_attribute
from wsfleet.lease_rules import (
    MAX_REASON_CHARS,
    AcquireRefusal,
    ConditionalUpdate,
    Lease,
    ParkOutcome,
    ReleaseOutcome,
    ReleaseVariant,
    TakeoverStep,
    acquire_failure,
    acquire_update,
    clear_owner_update,
    failing_cleared_update,
    failing_since_update,
    fence_deadline,
    lease_after_takeover,
    lease_won,
    may_handle,
    park_failure,
    park_update,
    release_failure,
    release_retry,
    release_update,
    restarted_since,
    takeover_failure,
    takeover_update,
    unanswered_checkpoint,
)
from wsfleet.timing import LeaseTiming

ME = "worker-a"
GEN = 7
DEAD = "worker-b"
DEAD_GEN = 2
NOW = 1_000_000
TOKEN = "tok"
# crc32("c1") % 4 == 1 and % 8 == 1: the shards of the one connection used here.
MY_OWNER_KEY = "worker-a#7#1"
FREE_SHARD = "FREE#1"
URL = "wss://feed.example/c1"


def N(n: int) -> dict[str, str]:  # noqa: N802 - the attribute type's own letter
    return {"N": str(n)}


def S(s: str) -> dict[str, str]:  # noqa: N802
    return {"S": s}


def raw(**fields: Any) -> Item:
    """A typed connection item; a field given as None is left out."""
    base: dict[str, Any] = {
        schema.PARTITION_KEY: "CONN#c1",
        schema.SORT_KEY: "CONN",
        "desired_state": schema.STARTED,
        "ws_url": URL,
        "lease_epoch": 3,
        "last_seq": 10,
        "start_gen": 1,
        "seq_gen": 0,
    }
    merged = base | fields
    return {k: to_attribute(v) for k, v in merged.items() if v is not None}


def free(**fields: Any) -> Item:
    """STARTED, nobody's, in the unowned index."""
    return raw(**({"free_shard": FREE_SHARD} | fields))


def owned(owner: str = ME, gen: int = GEN, **fields: Any) -> Item:
    base = {
        "lease_owner": owner,
        "owner_session_gen": gen,
        "owner_key": f"{owner}#{gen}#1",
        "lease_token": "t0",
    }
    return raw(**(base | fields))


def fields_of(item: Item) -> dict[str, Any]:
    """The attributes of a typed item other than its key, as plain values."""
    keys = (schema.PARTITION_KEY, schema.SORT_KEY)
    return {k: v for k, v in from_attributes(item).items() if k not in keys}


def conn(item: Item) -> ConnectionItem:
    return ConnectionItem.from_dynamodb(item)


def lease(**fields: Any) -> Lease:
    base: dict[str, Any] = {
        "connection_id": "c1",
        "owner": ME,
        "epoch": 3,
        "start_gen": 1,
        "ws_url": URL,
        "last_seq": 10,
        "session_gen": GEN,
        "seq_gen": 0,
    }
    return Lease(**(base | fields))


def test_a_conditional_update_is_the_keyword_arguments_of_update_item():
    update = ConditionalUpdate("SET #a = :a", "attribute_exists(#a)", {"#a": "a"}, {":a": N(1)})
    assert update.as_kwargs() == {
        "UpdateExpression": "SET #a = :a",
        "ConditionExpression": "attribute_exists(#a)",
        "ExpressionAttributeNames": {"#a": "a"},
        "ExpressionAttributeValues": {":a": N(1)},
    }


# --- acquire ---------------------------------------------------------------------------


def test_acquire_update_exactly():
    update = acquire_update("c1", ME, GEN, NOW, TOKEN)
    assert update.update_expression == (
        "SET #owner = :me, #sgen = :mygen, #okey = :okey, #token = :token, #updated = :now"
        " REMOVE #free ADD #epoch :one"
    )
    assert update.condition_expression == (
        "#state = :started AND attribute_not_exists(#parked) AND attribute_not_exists(#owner)"
    )
    assert update.names == {
        "#state": "desired_state",
        "#parked": "parked_reason",
        "#owner": "lease_owner",
        "#sgen": "owner_session_gen",
        "#okey": "owner_key",
        "#token": "lease_token",
        "#updated": "updated_at_ms",
        "#free": "free_shard",
        "#epoch": "lease_epoch",
    }
    assert update.values == {
        ":me": S(ME),
        ":mygen": N(GEN),
        ":okey": S(MY_OWNER_KEY),
        ":token": S(TOKEN),
        ":now": N(NOW),
        ":one": N(1),
        ":started": S("STARTED"),
    }


@pytest.mark.parametrize(
    ("item", "passes"),
    [
        (free(), True),
        (raw(), True),  # not in the index (a stale read): the condition alone decides
        (free(lease_epoch=None), True),  # never held: the epoch starts from nothing
        (owned(DEAD, DEAD_GEN), False),  # a dead session's: only a takeover moves it
        (owned(ME, GEN), False),  # even this session's own hold
        (owned(ME, GEN - 1), False),
        (raw(desired_state=schema.STOPPED), False),
        (raw(parked_reason="HTTP 404 from upstream"), False),
        (raw(desired_state=schema.STOPPED, parked_reason="x"), False),
        (None, False),  # no item
    ],
)
def test_acquire_takes_only_a_started_unowned_unparked_connection(item, passes):
    assert (attempt(acquire_update("c1", ME, GEN, NOW, TOKEN), item) is not None) is passes


@pytest.mark.parametrize(("epoch", "new_epoch"), [(None, 1), (0, 1), (3, 4), (41, 42)])
def test_acquire_owns_the_item_and_takes_it_out_of_the_unowned_index(epoch, new_epoch):
    new = attempt(acquire_update("c1", ME, GEN, NOW, TOKEN), free(lease_epoch=epoch))
    assert new is not None
    assert new == raw(
        lease_epoch=new_epoch,
        lease_owner=ME,
        owner_session_gen=GEN,
        owner_key=MY_OWNER_KEY,
        lease_token=TOKEN,
        updated_at_ms=NOW,
    )
    assert "free_shard" not in new


def test_acquire_owner_key_follows_the_connection_shard():
    assert acquire_update("c2", ME, 0, NOW, TOKEN).values[":okey"] == S("worker-a#0#3")


# --- what a won lease carries -------------------------------------------------------------

OLD = owned(
    DEAD,
    DEAD_GEN,
    ws_url="wss://feed.example/other",
    lease_epoch=6,
    last_seq=31,
    start_gen=4,
    seq_gen=2,
    failing_since_ms=NOW - 5_000,
)


def test_lease_won_from_the_old_item():
    assert lease_won(conn(OLD), ME, GEN) == Lease(
        connection_id="c1",
        owner=ME,
        epoch=7,  # the write added one
        start_gen=4,
        ws_url="wss://feed.example/other",
        last_seq=31,
        session_gen=GEN,
        takeover_latency_ms=None,
        seq_gen=2,
        failing_since_ms=NOW - 5_000,
    )


@pytest.mark.parametrize(
    ("kwargs", "epoch", "last_seq", "latency"),
    [
        ({"epoch": 6}, 6, 31, None),  # an adopted lease keeps the stored epoch
        ({"epoch": 0}, 0, 31, None),  # a falsy override is still an override
        ({"last_seq": 55}, 7, 55, None),  # a takeover resumes from the page
        ({"last_seq": 0}, 7, 0, None),
        ({"takeover_latency_ms": 1234}, 7, 31, 1234),
        ({"takeover_latency_ms": 0}, 7, 31, 0),
    ],
)
def test_lease_won_overrides(kwargs, epoch, last_seq, latency):
    won = lease_won(conn(OLD), ME, GEN, **kwargs)
    assert (won.epoch, won.last_seq, won.takeover_latency_ms) == (epoch, last_seq, latency)
    assert (won.session_gen, won.seq_gen, won.start_gen) == (GEN, 2, 4)


@pytest.mark.parametrize(
    ("current", "last_seq", "advanced"),
    [
        # The stream the takeover conditioned on: its resume point and advance.
        (owned(ME, GEN, lease_epoch=7, last_seq=31, seq_gen=2), 55, NOW - 9),
        # Restarted on a new stream since the write: the router's reset, no advance.
        (
            owned(ME, GEN, lease_epoch=7, last_seq=0, seq_gen=3, ws_url="wss://feed.example/new"),
            0,
            None,
        ),
    ],
)
def test_a_takeovers_resume_point_counts_only_for_the_stream_it_was_chosen_for(
    current, last_seq, advanced
):
    got = lease_after_takeover(
        conn(OLD),
        conn(current),
        ME,
        GEN,
        resume_seq=55,
        takeover_latency_ms=12,
        advanced_at_ms=NOW - 9,
    )
    assert (got.last_seq, got.advanced_at_ms) == (last_seq, advanced)
    assert (got.epoch, got.ws_url, got.seq_gen) == (7, conn(current).ws_url, conn(current).seq_gen)
    assert got.takeover_latency_ms == 12


def test_a_new_owner_without_a_failing_mark_starts_no_failing_clock():
    assert lease_won(conn(free()), ME, GEN).failing_since_ms is None


@pytest.mark.parametrize(
    ("item", "expected"),
    [
        (None, AcquireRefusal.UNKNOWN_ID),
        (owned(DEAD, DEAD_GEN), AcquireRefusal.HELD),
        (owned(DEAD, DEAD_GEN, lease_token=TOKEN), AcquireRefusal.HELD),  # same token, not me
        (owned(ME, GEN, lease_token="older"), AcquireRefusal.HELD),  # an older hold of mine
        (owned(ME, GEN, lease_token=None), AcquireRefusal.HELD),
        (owned(ME, GEN - 1, lease_token=TOKEN), AcquireRefusal.HELD),  # my earlier session
        (owned(ME, GEN, owner_session_gen=None, lease_token=TOKEN), AcquireRefusal.HELD),
        (free(), AcquireRefusal.HELD),  # taken and given back in between
        (raw(desired_state=schema.STOPPED), AcquireRefusal.STOPPED),
        (owned(DEAD, DEAD_GEN, desired_state=schema.STOPPED), AcquireRefusal.STOPPED),
        (raw(parked_reason="HTTP 404 from upstream"), AcquireRefusal.PARKED),
        # stopped and parked: the stop is the router's newer word
        (raw(desired_state=schema.STOPPED, parked_reason="x"), AcquireRefusal.STOPPED),
    ],
)
def test_acquire_refusals(item, expected):
    old = None if item is None else conn(item)
    assert acquire_failure(old, ME, GEN, TOKEN) is expected


@pytest.mark.parametrize(
    "fields",
    [{}, {"desired_state": schema.STOPPED}],
    ids=["started", "stopped since"],
)
def test_a_retried_acquire_that_had_landed_is_adopted_with_the_stored_epoch(fields):
    """The owner, the session and the token are this attempt's: the write landed and
    its answer was lost. The lease is adopted as stored (the epoch is not raised
    again), even when the router stopped it since: the stop is acted on as a stop."""
    stored = owned(
        ME,
        GEN,
        lease_token=TOKEN,
        lease_epoch=7,
        last_seq=42,
        start_gen=3,
        seq_gen=2,
        ws_url="wss://feed.example/other",
        failing_since_ms=NOW - 5_000,
        **fields,
    )
    assert acquire_failure(conn(stored), ME, GEN, TOKEN) == Lease(
        connection_id="c1",
        owner=ME,
        epoch=7,
        start_gen=3,
        ws_url="wss://feed.example/other",
        last_seq=42,
        session_gen=GEN,
        takeover_latency_ms=None,
        seq_gen=2,
        failing_since_ms=NOW - 5_000,
    )


# --- takeover ------------------------------------------------------------------------------

SEEN = owned(DEAD, DEAD_GEN, lease_epoch=5, last_seq=40, seq_gen=1, start_gen=3)


def takeover(seen: Item = SEEN, resume: int = 55) -> ConditionalUpdate:
    return takeover_update(conn(seen), ME, GEN, resume, NOW, TOKEN)


def test_takeover_update_exactly():
    update = takeover()
    assert update.update_expression == (
        "SET #owner = :me, #sgen = :mygen, #okey = :okey, #token = :token, #updated = :now,"
        " #seq = :resume ADD #epoch :one"
    )
    assert update.condition_expression == (
        "#owner = :dead AND #sgen = :deadgen AND #state = :started AND #gen = :gen"
        " AND #seqgen = :seqgen AND #seq = :seq AND #epoch = :epoch"
        " AND attribute_not_exists(#parked)"
    )
    assert update.names == {
        "#owner": "lease_owner",
        "#sgen": "owner_session_gen",
        "#okey": "owner_key",
        "#token": "lease_token",
        "#updated": "updated_at_ms",
        "#seq": "last_seq",
        "#epoch": "lease_epoch",
        "#state": "desired_state",
        "#gen": "start_gen",
        "#seqgen": "seq_gen",
        "#parked": "parked_reason",
    }
    assert update.values == {
        ":me": S(ME),
        ":mygen": N(GEN),
        ":okey": S(MY_OWNER_KEY),
        ":token": S(TOKEN),
        ":now": N(NOW),
        ":resume": N(55),
        ":one": N(1),
        ":dead": S(DEAD),
        ":deadgen": N(DEAD_GEN),
        ":started": S("STARTED"),
        ":gen": N(3),
        ":seqgen": N(1),
        ":seq": N(40),
        ":epoch": N(5),
    }


def test_a_takeover_moves_the_connection_to_the_new_session_at_the_resume_point():
    new = attempt(takeover(), SEEN)
    assert new == owned(
        ME,
        GEN,
        lease_token=TOKEN,
        lease_epoch=6,
        last_seq=55,
        seq_gen=1,
        start_gen=3,
        updated_at_ms=NOW,
    )


@pytest.mark.parametrize(
    "changed",
    [
        {"lease_owner": ME},
        {"lease_owner": None},
        {"owner_session_gen": DEAD_GEN + 1},  # the dead worker's next session
        {"desired_state": schema.STOPPED},
        {"start_gen": 4},  # restarted since it was read
        {"seq_gen": 2},  # checkpoint reset since
        {"last_seq": 41},  # a final checkpoint landed since
        {"lease_epoch": 6},
        {"parked_reason": "x"},
    ],
)
def test_a_takeover_fails_when_anything_it_decided_on_changed(changed):
    assert attempt(takeover(), raw(**(fields_of(SEEN) | changed))) is None


@pytest.mark.parametrize(
    ("item", "step"),
    [
        (None, TakeoverStep.GONE),
        (owned(ME, GEN, lease_epoch=6), TakeoverStep.GONE),  # another taker won
        (owned(DEAD, DEAD_GEN + 1), TakeoverStep.GONE),  # same worker, another session
        (raw(), TakeoverStep.GONE),  # released (owner gone)
        (raw(parked_reason="x"), TakeoverStep.GONE),
        (owned(DEAD, DEAD_GEN, parked_reason="x"), TakeoverStep.GONE),
        (owned(DEAD, DEAD_GEN, last_seq=41), TakeoverStep.RETRY),  # final checkpoint landed
        (owned(DEAD, DEAD_GEN, start_gen=9), TakeoverStep.RETRY),
        (owned(DEAD, DEAD_GEN, desired_state=schema.STOPPED), TakeoverStep.CLEAR),
    ],
)
def test_what_a_failed_takeover_means(item, step):
    old = None if item is None else conn(item)
    assert takeover_failure(old, conn(SEEN)) is step


def test_clear_owner_update_exactly():
    update = clear_owner_update(conn(SEEN), NOW)
    assert update.update_expression == "REMOVE #owner, #sgen, #okey, #token SET #updated = :now"
    assert update.condition_expression == (
        "#owner = :dead AND #sgen = :deadgen AND #state = :stopped"
    )
    assert update.names == {
        "#owner": "lease_owner",
        "#sgen": "owner_session_gen",
        "#okey": "owner_key",
        "#token": "lease_token",
        "#updated": "updated_at_ms",
        "#state": "desired_state",
    }
    assert update.values == {
        ":now": N(NOW),
        ":dead": S(DEAD),
        ":deadgen": N(DEAD_GEN),
        ":stopped": S("STOPPED"),
    }


def test_clear_owner_update_with_a_checkpoint_ahead_writes_it_on_the_stream_it_was_read_for():
    update = clear_owner_update(conn(SEEN), NOW, resume=55)  # SEEN: last_seq 40
    assert update.update_expression == (
        "REMOVE #owner, #sgen, #okey, #token SET #updated = :now, #seq = :resume"
    )
    assert update.condition_expression == (
        "#owner = :dead AND #sgen = :deadgen AND #state = :stopped"
        " AND #seqgen = :seqgen AND #seq = :seq"
    )
    assert (update.values[":resume"], update.values[":seq"]) == (N(55), N(40))
    # Not ahead of the item's own: nothing more than the plain clear.
    assert clear_owner_update(conn(SEEN), NOW, resume=40) == clear_owner_update(conn(SEEN), NOW)


@pytest.mark.parametrize(
    ("item", "cleared"),
    [
        (owned(DEAD, DEAD_GEN, desired_state=schema.STOPPED), True),
        (owned(DEAD, DEAD_GEN), False),  # started again: taken over instead
        (owned(DEAD, DEAD_GEN + 1, desired_state=schema.STOPPED), False),
        (owned(ME, GEN, desired_state=schema.STOPPED), False),
        (raw(desired_state=schema.STOPPED), False),
    ],
)
def test_clearing_a_dead_owner_from_a_stopped_connection(item, cleared):
    new = attempt(clear_owner_update(conn(SEEN), NOW), item)
    if not cleared:
        assert new is None
        return
    # Out of the by-owner index, and not into the unowned one: it is stopped.
    assert new == raw(desired_state=schema.STOPPED, updated_at_ms=NOW)


# --- release ---------------------------------------------------------------------------

RELEASE_BASE_NAMES = {
    "#owner": "lease_owner",
    "#sgen": "owner_session_gen",
    "#okey": "owner_key",
    "#token": "lease_token",
    "#epoch": "lease_epoch",
    "#updated": "updated_at_ms",
    "#state": "desired_state",
}


@pytest.mark.parametrize(
    ("started", "last_seq", "update", "condition", "names", "values"),
    [
        (
            True,
            None,
            "REMOVE #owner, #sgen, #okey, #token SET #updated = :now, #free = :free",
            "#owner = :me AND #epoch = :epoch AND #state = :started",
            {"#free": "free_shard"},
            {":free": S(FREE_SHARD)},
        ),
        (
            True,
            99,
            "REMOVE #owner, #sgen, #okey, #token SET #updated = :now, #free = :free, #seq = :seq",
            "#owner = :me AND #epoch = :epoch AND #state = :started AND #seqgen = :seqgen",
            {"#free": "free_shard", "#seq": "last_seq", "#seqgen": "seq_gen"},
            {":free": S(FREE_SHARD), ":seq": N(99), ":seqgen": N(4)},
        ),
        (
            False,
            None,
            "REMOVE #owner, #sgen, #okey, #token SET #updated = :now",
            "#owner = :me AND #epoch = :epoch AND #state <> :started",
            {},
            {},
        ),
        (
            False,
            0,
            "REMOVE #owner, #sgen, #okey, #token SET #updated = :now, #seq = :seq",
            "#owner = :me AND #epoch = :epoch AND #state <> :started AND #seqgen = :seqgen",
            {"#seq": "last_seq", "#seqgen": "seq_gen"},
            {":seq": N(0), ":seqgen": N(4)},
        ),
    ],
    ids=["started", "started+checkpoint", "stopped", "stopped+checkpoint(0)"],
)
def test_release_update_exactly(started, last_seq, update, condition, names, values):
    written = release_update(lease(seq_gen=4), last_seq, NOW, started=started)
    assert written.update_expression == update
    assert written.condition_expression == condition
    assert written.names == RELEASE_BASE_NAMES | names
    assert (
        written.values
        == {
            ":me": S(ME),
            ":epoch": N(3),
            ":now": N(NOW),
            ":started": S("STARTED"),
        }
        | values
    )


def test_a_release_expects_a_started_connection_unless_told_otherwise():
    assert release_update(lease(), 5, NOW) == release_update(lease(), 5, NOW, started=True)


@pytest.mark.parametrize("item_started", [True, False])
@pytest.mark.parametrize("variant_started", [True, False])
@pytest.mark.parametrize("last_seq", [None, 99])
@pytest.mark.parametrize("item_seq_gen", [4, 5])
def test_every_release_variant_against_every_item(
    item_started, variant_started, last_seq, item_seq_gen
):
    """It passes exactly when it expected the desired state it finds and, with a
    checkpoint, the stream it belongs to; then the item is free, in the unowned
    index exactly while STARTED, and checkpointed exactly when asked to."""
    state = schema.STARTED if item_started else schema.STOPPED
    item = owned(ME, GEN, desired_state=state, seq_gen=item_seq_gen, failing_since_ms=NOW - 9)
    update = release_update(lease(seq_gen=4), last_seq, NOW, started=variant_started)
    new = attempt(update, item)
    passes = variant_started == item_started and (last_seq is None or item_seq_gen == 4)
    assert (new is not None) is passes
    if new is None:
        return
    expected = raw(
        desired_state=state,
        seq_gen=item_seq_gen,
        last_seq=10 if last_seq is None else last_seq,
        updated_at_ms=NOW,
        failing_since_ms=NOW - 9,  # the failing clock stays for the next owner
        free_shard=FREE_SHARD if item_started else None,
    )
    assert new == expected


@pytest.mark.parametrize(
    "item",
    [
        owned(DEAD, DEAD_GEN),
        owned(ME, GEN, lease_epoch=4),  # a newer hold under the same name
        owned(ME, GEN, lease_epoch=2),
        free(),
        None,
    ],
)
@pytest.mark.parametrize("last_seq", [None, 99])
def test_a_release_never_frees_a_hold_that_is_not_this_one(item, last_seq):
    assert attempt(release_update(lease(), last_seq, NOW), item) is None


def test_a_released_connection_can_be_acquired_again_at_once():
    released = attempt(release_update(lease(), 12, NOW), owned(ME, GEN))
    again = attempt(acquire_update("c1", DEAD, 9, NOW + 1, "t2"), released)
    assert again is not None
    assert (again["lease_owner"], again["lease_epoch"], again["last_seq"]) == (
        S(DEAD),
        N(4),
        N(12),
    )


@pytest.mark.parametrize(
    ("item", "outcome"),
    [
        (None, ReleaseOutcome.NOT_HELD),
        (owned(DEAD, DEAD_GEN), ReleaseOutcome.NOT_HELD),
        (owned(DEAD, DEAD_GEN, lease_epoch=3), ReleaseOutcome.NOT_HELD),  # my epoch, not me
        # Free under this hold's epoch: an earlier try landed, its answer lost.
        (raw(), ReleaseOutcome.LANDED),
        (free(), ReleaseOutcome.LANDED),
        (raw(desired_state=schema.STOPPED), ReleaseOutcome.LANDED),
        (raw(lease_epoch=4), ReleaseOutcome.NOT_HELD),  # taken and released since
        (raw(parked_reason="HTTP 404", parked_at_ms=NOW), ReleaseOutcome.NOT_HELD),
        (owned(ME, GEN, lease_epoch=4), ReleaseOutcome.NOT_HELD),
        (owned(ME, GEN, lease_epoch=2), ReleaseOutcome.NOT_HELD),
        (owned(ME, GEN, desired_state=schema.STOPPED), ReleaseOutcome.RETRY),
        (owned(ME, GEN, seq_gen=1), ReleaseOutcome.RETRY),
        (owned(ME, GEN), ReleaseOutcome.RETRY),
    ],
)
def test_what_a_failed_release_means(item, outcome):
    old = None if item is None else conn(item)
    assert release_failure(old, lease()) is outcome


@pytest.mark.parametrize("state", [schema.STARTED, schema.STOPPED])
@pytest.mark.parametrize("with_checkpoint", [True, False])
@pytest.mark.parametrize("seq_gen", [0, 1])
def test_the_release_to_retry_fits_the_item_returned(state, with_checkpoint, seq_gen):
    old = conn(owned(ME, GEN, desired_state=state, seq_gen=seq_gen))
    assert release_retry(old, lease(seq_gen=0), with_checkpoint) == ReleaseVariant(
        started=state == schema.STARTED,
        with_checkpoint=with_checkpoint and seq_gen == 0,
    )


# --- parking and the failing clock ------------------------------------------------------


def test_park_update_exactly():
    update = park_update(lease(seq_gen=2, start_gen=4), 17, "HTTP 404 from upstream", NOW)
    assert update.update_expression == (
        "REMOVE #owner, #sgen, #okey, #token, #failing SET #seq = :seq,"
        " #parked = :reason, #parkedat = :now, #updated = :now"
    )
    assert update.condition_expression == (
        "#owner = :me AND #epoch = :epoch AND #seqgen = :seqgen"
        " AND #state = :started AND #gen = :gen"
    )
    assert update.names == {
        "#owner": "lease_owner",
        "#sgen": "owner_session_gen",
        "#okey": "owner_key",
        "#token": "lease_token",
        "#failing": "failing_since_ms",
        "#seq": "last_seq",
        "#parked": "parked_reason",
        "#parkedat": "parked_at_ms",
        "#updated": "updated_at_ms",
        "#epoch": "lease_epoch",
        "#seqgen": "seq_gen",
        "#state": "desired_state",
        "#gen": "start_gen",
    }
    assert update.values == {
        ":me": S(ME),
        ":epoch": N(3),
        ":seqgen": N(2),
        ":started": S("STARTED"),
        ":gen": N(4),
        ":seq": N(17),
        ":reason": S("HTTP 404 from upstream"),
        ":now": N(NOW),
    }


def test_a_parked_connection_is_nobodys_and_nobody_acquires_it():
    parked = attempt(
        park_update(lease(), 17, "HTTP 404 from upstream", NOW),
        owned(ME, GEN, failing_since_ms=NOW - 600_000),
    )
    assert parked == raw(
        last_seq=17,
        parked_reason="HTTP 404 from upstream",
        parked_at_ms=NOW,
        updated_at_ms=NOW,
    )
    assert attempt(acquire_update("c1", DEAD, 9, NOW + 1, "t2"), parked) is None


@pytest.mark.parametrize(
    "changed",
    [
        {"desired_state": schema.STOPPED},
        {"start_gen": 2},  # started again since
        {"seq_gen": 1},  # checkpoint reset since
        {"lease_epoch": 4},
        {"lease_owner": DEAD},
    ],
)
def test_a_park_never_overwrites_the_routers_newer_word(changed):
    assert attempt(park_update(lease(), 17, "x", NOW), owned(ME, GEN, **changed)) is None


@pytest.mark.parametrize(("length", "kept"), [(0, 0), (199, 199), (200, 200), (201, 200)])
def test_a_parked_reason_is_kept_short(length, kept):
    reason = "".join(chr(ord("a") + i % 26) for i in range(length))
    assert MAX_REASON_CHARS == 200
    assert park_update(lease(), 0, reason, NOW).values[":reason"] == S(reason[:kept])


@pytest.mark.parametrize(
    ("item", "outcome"),
    [
        (None, ParkOutcome.NOT_HELD),
        (owned(DEAD, DEAD_GEN), ParkOutcome.NOT_HELD),
        (owned(ME, GEN, lease_epoch=4), ParkOutcome.NOT_HELD),
        (raw(), ParkOutcome.NOT_HELD),
        # still ours, but the router spoke since: an ordinary release instead
        (owned(ME, GEN, desired_state=schema.STOPPED), ParkOutcome.RELEASE_INSTEAD),
        (owned(ME, GEN, start_gen=2), ParkOutcome.RELEASE_INSTEAD),
        (owned(ME, GEN, seq_gen=1), ParkOutcome.RELEASE_INSTEAD),
    ],
)
def test_what_a_failed_park_means(item, outcome):
    old = None if item is None else conn(item)
    assert park_failure(old, lease()) is outcome


def test_failing_marks_exactly():
    mark = failing_since_update(lease(), NOW - 250, NOW)
    cleared = failing_cleared_update(lease(), NOW)
    assert mark.update_expression == "SET #failing = :since, #updated = :now"
    assert cleared.update_expression == "REMOVE #failing SET #updated = :now"
    names = {
        "#failing": "failing_since_ms",
        "#updated": "updated_at_ms",
        "#owner": "lease_owner",
        "#epoch": "lease_epoch",
    }
    for update in (mark, cleared):
        assert update.condition_expression == "#owner = :me AND #epoch = :epoch"
        assert update.names == names
    assert mark.values == {":since": N(NOW - 250), ":now": N(NOW), ":me": S(ME), ":epoch": N(3)}
    assert cleared.values == {":now": N(NOW), ":me": S(ME), ":epoch": N(3)}


@pytest.mark.parametrize(
    ("item", "held"),
    [
        (owned(ME, GEN), True),
        (owned(ME, GEN, lease_epoch=4), False),
        (owned(DEAD, DEAD_GEN), False),
        (raw(), False),
    ],
)
def test_only_the_holder_writes_or_removes_the_failing_mark(item, held):
    marked = attempt(failing_since_update(lease(), NOW - 250, NOW), item)
    assert (marked is not None) is held
    if marked is None:
        return
    assert marked == item | {"failing_since_ms": N(NOW - 250), "updated_at_ms": N(NOW)}
    cleared = attempt(failing_cleared_update(lease(), NOW + 5), marked)
    assert cleared == item | {"updated_at_ms": N(NOW + 5)}


@pytest.mark.parametrize(
    ("item", "restarted"),
    [
        (raw(start_gen=1), False),  # the generation it was acquired under
        (raw(start_gen=2), True),  # started again since
        (raw(start_gen=0), True),  # any other generation
        (raw(start_gen=2, desired_state=schema.STOPPED), False),  # and stopped again
        (raw(start_gen=1, desired_state=schema.STOPPED), False),  # only stopped
    ],
)
def test_restarted_since(item, restarted):
    assert restarted_since(conn(item), lease(start_gen=1)) is restarted


# --- fencing ---------------------------------------------------------------------------

TIMING = LeaseTiming.from_lease()  # 2.2 s: margin 0.22 -> fence after 1.98 s


@pytest.mark.parametrize(
    ("now", "allowed"),
    [
        (100.0, True),  # just renewed
        (101.979, True),
        (101.98, False),  # exactly at lease - margin
        (101.981, False),
        (200.0, False),
    ],
)
def test_fence_deadline_boundaries(now, allowed):
    deadline = fence_deadline(100.0, TIMING)
    assert deadline == 101.98
    assert may_handle(now, deadline) is allowed


@pytest.mark.parametrize(
    ("lease_seconds", "sent_at", "deadline"),
    [(2.2, 0.0, 1.98), (2.5, 0.0, 2.25), (4, 10.0, 13.6), (20, 5.0, 23.0)],
)
def test_the_fence_deadline_follows_the_timing(lease_seconds, sent_at, deadline):
    timing = LeaseTiming.from_lease(lease_seconds)
    assert fence_deadline(sent_at, timing) == pytest.approx(deadline)


# --- what a holder needs to run the stream: protocol, secret, last advance ----------------


def test_lease_won_carries_the_items_protocol_and_secret_reference():
    spec = '{"name":"live","options":{}}'
    won = lease_won(conn(free(protocol=spec, auth_secret="websocket-fleet/a")), ME, GEN)
    assert (won.protocol, won.auth_secret) == (spec, "websocket-fleet/a")
    plain = lease_won(conn(free()), ME, GEN)
    assert (plain.protocol, plain.auth_secret) == (None, None)


@pytest.mark.parametrize(
    ("fields", "advanced"),
    [
        ({"advanced_at_ms": NOW - 700, "advanced_start_gen": 1}, NOW - 700),
        ({"advanced_at_ms": NOW - 700, "advanced_start_gen": 0}, None),  # started since
        ({"advanced_at_ms": NOW - 700, "advanced_start_gen": 1, "last_seq": 0}, None),
        ({"advanced_at_ms": NOW - 700, "advanced_start_gen": 1, "last_seq": 1}, NOW - 700),
        ({"advanced_at_ms": NOW - 700}, None),
        ({}, None),
    ],
    ids=["same start", "a start since", "checkpoint reset", "one handled", "no start gen", "never"],
)
def test_the_last_advance_a_release_left_counts_only_under_the_same_start(fields, advanced):
    assert lease_won(conn(free(**fields)), ME, GEN).advanced_at_ms == advanced


def test_a_takeover_takes_the_last_advance_from_the_page_over_the_item():
    item = free(advanced_at_ms=NOW - 9_000, advanced_start_gen=1)
    assert lease_won(conn(item), ME, GEN, advanced_at_ms=NOW - 300).advanced_at_ms == NOW - 300
    assert lease_won(conn(item), ME, GEN).advanced_at_ms == NOW - 9_000


def test_a_release_with_its_checkpoint_leaves_when_it_last_moved_under_its_start():
    update = release_update(lease(start_gen=5), 12, NOW, advanced_at_ms=NOW - 40)
    assert update.update_expression.endswith(", #advat = :advat, #advgen = :advgen")
    new = attempt(update, owned(ME, GEN, start_gen=5))
    assert new is not None
    assert (new["advanced_at_ms"], new["advanced_start_gen"]) == (N(NOW - 40), N(5))
    again = attempt(acquire_update("c1", DEAD, 9, NOW + 1, "t2"), new)
    assert lease_won(conn(new), DEAD, 9).advanced_at_ms == NOW - 40
    assert again is not None


def test_a_release_without_its_checkpoint_leaves_no_advance():
    update = release_update(lease(), None, NOW, advanced_at_ms=NOW - 40)
    assert "#advat" not in update.names
    new = attempt(update, owned(ME, GEN))
    assert new is not None
    assert "advanced_at_ms" not in new


@pytest.mark.parametrize(
    ("kept", "expected"),
    [
        (None, 10),  # no unanswered release: the listed checkpoint
        (PageEntry(epoch=3, seq_gen=0, seq=90, advanced_at_ms=None), 90),  # that hold's
        (PageEntry(epoch=2, seq_gen=0, seq=90, advanced_at_ms=None), 10),  # an older hold
        (PageEntry(epoch=3, seq_gen=1, seq=90, advanced_at_ms=None), 10),  # another stream
        (PageEntry(epoch=3, seq_gen=0, seq=4, advanced_at_ms=None), 10),  # never backwards
    ],
)
def test_a_stray_release_writes_the_final_checkpoint_of_its_unanswered_release(kept, expected):
    assert unanswered_checkpoint(kept, conn(owned())) == expected
