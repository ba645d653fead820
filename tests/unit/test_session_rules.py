"""The session protocol as tables: opening, renewing (with the notices acted on),
reaping at the skew boundary, retiring, notices, sweeping and forgetting a dead
session. Writes are checked exactly and run against items by tests/unit/expressions.py.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.unit.expressions import Item, attempt, holds
from wsfleet import schema, session_rules
from wsfleet.item import MalformedItemError, to_attribute
from wsfleet.lease_rules import fence_deadline
from wsfleet.session_rules import (
    RenewRefusal,
    SessionItem,
    forget_condition,
    is_lapsed,
    may_forget,
    may_sweep,
    new_session_item,
    next_reap_ms,
    notice_connection_id,
    notice_token,
    notice_update,
    offer_update,
    planned_share,
    planned_taker,
    reap_cutoff_ms,
    reap_update,
    reaper_fallback_ms,
    reaper_of,
    reaper_room,
    renew_failure,
    renew_update,
    retire_update,
    sweep_share,
    takeover_latency_ms,
    takeover_plan,
    takeover_share,
)
from wsfleet.timing import LeaseTiming
from wsfleet.version import VERSION

TIMING = LeaseTiming.from_lease()  # lease 2500 ms, skew 250 ms, margin 250 ms
ME = "worker-a"  # crc32 % 4 == 0: partition SESSIONS#0
GEN = 7
REAPER = "worker-b"
NOW = 1_000_000
GRACE = 1_000


def N(n: int) -> dict[str, str]:  # noqa: N802 - the attribute type's own letter
    return {"N": str(n)}


def S(s: str) -> dict[str, str]:  # noqa: N802
    return {"S": s}


def session_raw(worker: str = ME, gen: int = GEN, **fields: Any) -> Item:
    """A typed session item; a field given as None is left out."""
    base: dict[str, Any] = {
        "Pk": schema.session_partition(worker),
        "Sk": f"{worker}#{gen}",
        "worker_id": worker,
        "session_gen": gen,
        "state": schema.ALIVE,
        "expires_at_ms": NOW + 100,
        "started_at_ms": NOW - 60_000,
        "connections": 3,
        "capacity": 500,
    }
    return {k: to_attribute(v) for k, v in (base | fields).items() if v is not None}


def session(**fields: Any) -> SessionItem:
    return SessionItem.from_dynamodb(session_raw(**fields))


# --- opening ---------------------------------------------------------------------------


def test_new_session_item_exactly():
    assert new_session_item(ME, GEN, NOW, TIMING, 500) == {
        "Pk": S("SESSIONS#0"),
        "Sk": S("worker-a#7"),
        "worker_id": S(ME),
        "session_gen": N(GEN),
        "state": S("ALIVE"),
        "expires_at_ms": N(NOW + 2500),
        "started_at_ms": N(NOW),
        "connections": N(0),
        "capacity": N(500),
        "version": S(VERSION),
    }


def test_a_new_session_reads_back_as_alive_and_empty():
    opened = SessionItem.from_dynamodb(new_session_item(ME, GEN, NOW, TIMING, 12))
    assert opened == SessionItem(
        worker_id=ME,
        session_gen=GEN,
        state=schema.ALIVE,
        expires_at_ms=NOW + 2500,
        started_at_ms=NOW,
        reaped_at_ms=None,
        reaped_by=None,
        notices=frozenset(),
        connections=0,
        capacity=12,
        version=VERSION,
    )
    assert opened.alive
    assert opened.key == (ME, GEN)


# --- renewing ----------------------------------------------------------------------------


def test_renew_update_exactly():
    update = renew_update(NOW, TIMING, connections=3)
    assert update.update_expression == "SET #expires = :expires, #conns = :conns"
    assert update.condition_expression == "#state = :alive AND NOT #expires > :expires"
    assert update.names == {
        "#state": "state",
        "#expires": "expires_at_ms",
        "#conns": "connections",
    }
    assert update.values == {":alive": S("ALIVE"), ":expires": N(NOW + 2500), ":conns": N(3)}


@pytest.mark.parametrize(
    "acted",
    [
        ["c2 stop 5", "c1 start 4"],
        ["c1 start 4", "c2 stop 5", "c2 stop 5"],  # the same notice twice: once
        ("c2 stop 5", "c1 start 4"),
    ],
)
def test_the_notices_acted_on_are_removed_in_the_renew(acted):
    update = renew_update(NOW, TIMING, connections=0, acted_on=iter(acted))
    assert update.update_expression == (
        "SET #expires = :expires, #conns = :conns DELETE #notices :acted"
    )
    assert update.condition_expression == "#state = :alive AND NOT #expires > :expires"
    assert update.names == {
        "#state": "state",
        "#expires": "expires_at_ms",
        "#conns": "connections",
        "#notices": "notices",
    }
    assert update.values == {
        ":alive": S("ALIVE"),
        ":expires": N(NOW + 2500),
        ":conns": N(0),
        ":acted": {"SS": ["c1 start 4", "c2 stop 5"]},
    }


@pytest.mark.parametrize("capacity", [0, 500])
def test_a_renew_publishes_the_capacity_when_given(capacity):
    """Capacity 0 is a draining worker: it must be written, not left out."""
    update = renew_update(NOW, TIMING, connections=3, acted_on=["c1 stop 4"], capacity=capacity)
    assert update.update_expression == (
        "SET #expires = :expires, #conns = :conns, #cap = :cap DELETE #notices :acted"
    )
    assert update.names == {
        "#state": "state",
        "#expires": "expires_at_ms",
        "#conns": "connections",
        "#cap": "capacity",
        "#notices": "notices",
    }
    assert update.values == {
        ":alive": S("ALIVE"),
        ":expires": N(NOW + 2500),
        ":conns": N(3),
        ":cap": N(capacity),
        ":acted": {"SS": ["c1 stop 4"]},
    }


def test_no_notice_acted_on_deletes_nothing():
    """DynamoDB refuses an empty set, so no notices means no DELETE at all."""
    assert renew_update(NOW, TIMING, connections=1, acted_on=[]) == renew_update(
        NOW, TIMING, connections=1
    )


@pytest.mark.parametrize(
    ("fields", "passes"),
    [
        ({"expires_at_ms": NOW + 2500 - 600}, True),  # the renew of a heartbeat ago
        ({"expires_at_ms": NOW + 2499}, True),
        ({"expires_at_ms": NOW + 2500}, True),  # a retry of this very renew
        ({"expires_at_ms": NOW + 2501}, False),  # a later renew landed first
        ({"expires_at_ms": NOW - 5000}, True),  # lapsed but not reaped: still ours
        ({"state": schema.DEAD, "expires_at_ms": NOW}, False),  # reaped: never again
        ({"state": schema.DEAD, "expires_at_ms": NOW + 5000}, False),
    ],
)
def test_a_renew_passes_while_alive_and_never_moves_the_expiry_back(fields, passes):
    new = attempt(renew_update(NOW, TIMING, connections=4), session_raw(**fields))
    assert (new is not None) is passes
    if new is not None:
        assert new == session_raw(**(fields | {"expires_at_ms": NOW + 2500, "connections": 4}))


def test_a_renew_of_a_forgotten_session_fails():
    assert attempt(renew_update(NOW, TIMING, connections=0), None) is None


@pytest.mark.parametrize(
    ("notices", "acted", "left"),
    [
        ({"c1 stop 4", "c2 start 5", "c3 stop 9"}, ["c1 stop 4", "c2 start 5"], {"c3 stop 9"}),
        ({"c1 stop 4"}, ["c1 stop 4"], None),  # the last one: the attribute goes
        ({"c1 stop 4", "c1 stop 8"}, ["c1 stop 4"], {"c1 stop 8"}),  # a newer one stays
        ({"c1 stop 8"}, ["c1 stop 4"], {"c1 stop 8"}),
        (None, ["c1 stop 4"], None),  # already gone (a retry of the renew)
    ],
)
def test_removing_acted_notices_keeps_every_other_one(notices, acted, left):
    new = attempt(
        renew_update(NOW, TIMING, connections=3, acted_on=acted), session_raw(notices=notices)
    )
    assert new is not None
    assert SessionItem.from_dynamodb(new).notices == frozenset(left or ())
    assert ("notices" in new) is (left is not None)


@pytest.mark.parametrize(
    ("old", "refusal", "keeps"),
    [
        (None, RenewRefusal.REAPED, False),  # forgotten
        (session(state=schema.DEAD), RenewRefusal.REAPED, False),
        (session(state=schema.DEAD, expires_at_ms=NOW + 10_000), RenewRefusal.REAPED, False),
        (session(state=None), RenewRefusal.REAPED, False),  # no state reads as DEAD
        (session(state=schema.ALIVE), RenewRefusal.SUPERSEDED, True),
    ],
)
def test_what_a_refused_renew_means(old, refusal, keeps):
    assert renew_failure(old) is refusal
    assert refusal.keeps_session is keeps


# --- reaping -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("timing", "cutoff"),
    [
        (TIMING, NOW - 250),
        (LeaseTiming.from_lease(2, heartbeat=0.5, reconcile=0.5, skew=0.2), NOW - 200),
        (LeaseTiming.from_lease(20, skew=0), NOW),
    ],
)
def test_the_reap_cutoff_is_now_minus_skew(timing, cutoff):
    assert reap_cutoff_ms(NOW, timing) == cutoff


@pytest.mark.parametrize(
    ("fields", "lapsed"),
    [
        ({"expires_at_ms": NOW + 1}, False),
        ({"expires_at_ms": NOW}, False),  # expired, but within the skew
        ({"expires_at_ms": NOW - 250}, False),  # exactly now - skew: NOT lapsed
        ({"expires_at_ms": NOW - 251}, True),  # one ms earlier
        ({"expires_at_ms": 0}, True),
        ({"expires_at_ms": NOW - 251, "state": schema.DEAD}, False),  # reaped already
    ],
)
def test_a_session_lapses_one_ms_past_its_expiry_plus_the_skew(fields, lapsed):
    assert is_lapsed(session(**fields), NOW, TIMING) is lapsed
    # The reap's own condition draws the same line.
    assert (attempt(reap_update(REAPER, NOW, TIMING), session_raw(**fields)) is not None) is lapsed


def test_reap_update_exactly():
    update = reap_update(REAPER, NOW, TIMING)
    assert update.update_expression == "SET #state = :dead, #reapedat = :now, #reapedby = :me"
    assert update.condition_expression == "#state = :alive AND #expires < :cutoff"
    assert update.names == {
        "#state": "state",
        "#reapedat": "reaped_at_ms",
        "#reapedby": "reaped_by",
        "#expires": "expires_at_ms",
    }
    assert update.values == {
        ":dead": S("DEAD"),
        ":alive": S("ALIVE"),
        ":now": N(NOW),
        ":me": S(REAPER),
        ":cutoff": N(NOW - 250),
    }
    assert reap_update(REAPER, NOW, TIMING, ()) == update  # an empty plan is no plan


def test_a_reap_records_its_plan_in_the_same_write():
    plan = (("worker-b", "c149"), ("worker-c", None))
    update = reap_update(REAPER, NOW, TIMING, plan)
    assert update.update_expression == (
        "SET #state = :dead, #reapedat = :now, #reapedby = :me, #takers = :takers"
    )
    assert update.condition_expression == "#state = :alive AND #expires < :cutoff"
    assert update.names["#takers"] == "takers"
    assert update.values[":takers"] == {
        "L": [{"L": [S("worker-b"), S("c149")]}, {"L": [S("worker-c"), {"NULL": True}]}]
    }
    lapsed = session_raw(expires_at_ms=NOW - 1_000)
    reaped = attempt(update, lapsed)
    assert reaped is not None
    dead = SessionItem.from_dynamodb(reaped)
    assert (dead.state, dead.reaped_by, dead.takers) == (schema.DEAD, REAPER, plan)
    # The same line as a reap without one: not within the skew, never twice.
    assert attempt(update, session_raw(expires_at_ms=NOW - 250)) is None
    assert attempt(reap_update("worker-c", NOW, TIMING, plan), reaped) is None


def test_a_reaped_session_is_dead_for_good():
    lapsed = session_raw(expires_at_ms=NOW - 1_000)
    reaped = attempt(reap_update(REAPER, NOW, TIMING), lapsed)
    assert reaped == lapsed | {
        "state": S("DEAD"),
        "reaped_at_ms": N(NOW),
        "reaped_by": S(REAPER),
    }
    dead = SessionItem.from_dynamodb(reaped)
    assert (dead.alive, dead.reaped_at_ms, dead.reaped_by) == (False, NOW, REAPER)
    # Its owner's late renew fails, and says so; nobody reaps it twice.
    assert attempt(renew_update(NOW, TIMING, connections=3), reaped) is None
    assert renew_failure(dead) is RenewRefusal.REAPED
    assert attempt(reap_update("worker-c", NOW + 5_000, TIMING), reaped) is None


def test_retire_update_exactly():
    update = retire_update(ME, NOW)
    assert update.update_expression == "SET #state = :dead, #reapedat = :now, #reapedby = :me"
    assert update.condition_expression == "#state = :alive"
    assert update.names == {
        "#state": "state",
        "#reapedat": "reaped_at_ms",
        "#reapedby": "reaped_by",
    }
    assert update.values == {
        ":dead": S("DEAD"),
        ":alive": S("ALIVE"),
        ":now": N(NOW),
        ":me": S(ME),
    }


@pytest.mark.parametrize(
    ("fields", "retired"),
    [
        ({"expires_at_ms": NOW + 2500}, True),
        ({"expires_at_ms": NOW - 10_000}, True),  # lapsed, not yet reaped: retire anyway
        ({"state": schema.DEAD, "reaped_by": REAPER, "reaped_at_ms": NOW - 5}, False),
    ],
)
def test_a_worker_retires_its_own_live_session(fields, retired):
    new = attempt(retire_update(ME, NOW), session_raw(**fields))
    assert (new is not None) is retired
    if new is not None:
        assert SessionItem.from_dynamodb(new).state == schema.DEAD
        assert (new["reaped_at_ms"], new["reaped_by"]) == (N(NOW), S(ME))


def test_the_fence_deadline_falls_before_any_reap():
    """With clocks within the skew of each other, no worker can reap a session (and
    so take its connections) before the owner's fence deadline of the same renew, and
    the margin is left on top."""
    renew_sent_ms = NOW
    expires = renew_sent_ms + TIMING.lease_ms
    fence_ms = fence_deadline(renew_sent_ms / 1000, TIMING) * 1000
    renewed = session(expires_at_ms=expires)
    for offset_ms in range(-TIMING.skew_ms, TIMING.skew_ms + 1, 50):
        # earliest reap, on the owner's clock: the reaper's clock reads owner + offset
        first = next(
            t
            for t in range(expires - 1_000, expires + 1_000)
            if is_lapsed(renewed, t + offset_ms, TIMING)
        )
        assert first - fence_ms > TIMING.margin * 1000, offset_ms


# --- notices -------------------------------------------------------------------------------


def test_notice_update_exactly():
    update = notice_update("c1 stop 123")
    assert update.update_expression == "ADD #notices :token"
    assert update.condition_expression == "attribute_exists(#pk)"
    assert update.names == {"#notices": "notices", "#pk": "Pk"}
    assert update.values == {":token": {"SS": ["c1 stop 123"]}}


@pytest.mark.parametrize(
    ("item", "notices"),
    [
        (session_raw(), {"c1 stop 123"}),
        (session_raw(notices={"c2 start 100"}), {"c1 stop 123", "c2 start 100"}),
        (session_raw(notices={"c1 stop 123"}), {"c1 stop 123"}),
        (session_raw(state=schema.DEAD), {"c1 stop 123"}),  # dead but not forgotten: fine
        (None, None),  # forgotten: nobody left to tell
    ],
)
def test_a_notice_is_added_to_an_existing_session_only(item, notices):
    new = attempt(notice_update("c1 stop 123"), item)
    if notices is None:
        assert new is None
    else:
        assert new is not None
        assert SessionItem.from_dynamodb(new).notices == frozenset(notices)


@pytest.mark.parametrize(
    ("connection_id", "what", "now", "token"),
    [
        ("c1", "stop", 123, "c1 stop 123 n0"),
        ("c1", "start", 0, "c1 start 0 n0"),
        ("a.b:c-d_e", "start", NOW, f"a.b:c-d_e start {NOW} n0"),
        ("x" * 128, "stop", 1, "x" * 128 + " stop 1 n0"),
    ],
)
def test_notice_tokens_round_trip(connection_id, what, now, token):
    assert notice_token(connection_id, what, now, "n0") == token
    assert notice_connection_id(token) == connection_id


def test_notice_tokens_of_two_router_writes_differ():
    assert notice_token("c1", "stop", 5, "n") != notice_token("c1", "stop", 6, "n")
    assert notice_token("c1", "stop", 5, "n") != notice_token("c1", "start", 5, "n")
    # Two writes of the same millisecond differ by their nonce.
    assert notice_token("c1", "stop", 5, "a1") != notice_token("c1", "stop", 5, "b2")


# --- sweeping and forgetting a dead session -------------------------------------------------

REAPED_AT = NOW - 500
PLAN = [[REAPER, "c1"], ["w-c", None]]


@pytest.mark.parametrize(
    ("fields", "me", "now", "sweeps"),
    [
        ({}, REAPER, NOW, False),  # alive: nothing to sweep
        ({"reaped_by": REAPER, "reaped_at_ms": REAPED_AT}, REAPER, NOW, False),  # alive still
        ({"state": schema.DEAD}, REAPER, NOW, False),  # no reap time: not swept
        ({"state": schema.DEAD, "reaped_by": REAPER}, REAPER, NOW, False),
        # the reaper goes at once
        (
            {"state": schema.DEAD, "reaped_by": REAPER, "reaped_at_ms": REAPED_AT},
            REAPER,
            REAPED_AT,
            True,
        ),
        # the others only after the grace
        (
            {"state": schema.DEAD, "reaped_by": REAPER, "reaped_at_ms": REAPED_AT},
            "w-c",
            REAPED_AT,
            False,
        ),
        (
            {"state": schema.DEAD, "reaped_by": REAPER, "reaped_at_ms": REAPED_AT},
            "w-c",
            REAPED_AT + GRACE - 1,
            False,
        ),
        (
            {"state": schema.DEAD, "reaped_by": REAPER, "reaped_at_ms": REAPED_AT},
            "w-c",
            REAPED_AT + GRACE,
            True,
        ),
        # retired by its own worker (given up): nobody is its reaper, everyone goes at once
        (
            {"state": schema.DEAD, "reaped_by": ME, "reaped_at_ms": REAPED_AT},
            REAPER,
            REAPED_AT,
            True,
        ),
        ({"state": schema.DEAD, "reaped_by": ME, "reaped_at_ms": REAPED_AT}, ME, REAPED_AT, True),
        ({"state": schema.DEAD, "reaped_at_ms": REAPED_AT}, REAPER, REAPED_AT + GRACE, True),
        ({"state": schema.DEAD, "reaped_at_ms": 0}, REAPER, 0, False),  # 0 is a reap time
        # a reap that recorded who takes what: everyone at once
        (
            {"state": schema.DEAD, "reaped_by": REAPER, "reaped_at_ms": REAPED_AT, "takers": PLAN},
            "w-c",
            REAPED_AT,
            True,
        ),
        ({"state": schema.DEAD, "reaped_at_ms": REAPED_AT, "takers": PLAN}, ME, REAPED_AT, True),
        ({"reaped_by": REAPER, "reaped_at_ms": REAPED_AT, "takers": PLAN}, "w-c", NOW, False),
        ({"state": schema.DEAD, "takers": PLAN}, "w-c", NOW, False),  # no reap time
    ],
)
def test_who_sweeps_a_dead_session_and_when(fields, me, now, sweeps):
    assert may_sweep(session(**fields), me, now, GRACE) is sweeps


@pytest.mark.parametrize(
    ("last_seen", "forget"),
    [
        (NOW, False),
        (NOW - 2499, False),
        (NOW - 2500, True),  # a full lease with nothing seen under it
        (NOW - 2501, True),
        (NOW + 10, False),
    ],
)
def test_a_dead_session_is_forgotten_after_a_full_lease_of_nothing(last_seen, forget):
    assert may_forget(last_seen, NOW, TIMING) is forget


def test_forget_condition_exactly():
    condition = forget_condition()
    assert condition == {
        "ConditionExpression": "#state = :dead",
        "ExpressionAttributeNames": {"#state": "state"},
        "ExpressionAttributeValues": {":dead": S("DEAD")},
    }
    names, values = condition["ExpressionAttributeNames"], condition["ExpressionAttributeValues"]
    assert holds(condition["ConditionExpression"], session_raw(state=schema.DEAD), names, values)
    assert not holds(condition["ConditionExpression"], session_raw(), names, values)


@pytest.mark.parametrize(
    ("expires", "latency"),
    [
        (NOW - 3_000, 3_000),
        (NOW - 1, 1),
        (NOW, 0),
        (NOW + 10, 0),  # within the skew: clamped, never negative
    ],
)
def test_takeover_latency_from_the_dead_sessions_expiry(expires, latency):
    dead = session(state=schema.DEAD, expires_at_ms=expires, reaped_at_ms=NOW - 1)
    assert takeover_latency_ms(dead, NOW) == latency


# --- reading a session -------------------------------------------------------------------


def test_a_session_item_reads_every_attribute():
    raw = session_raw(
        state=schema.DEAD,
        expires_at_ms=NOW - 1_000,
        started_at_ms=NOW - 60_000,
        reaped_at_ms=NOW - 200,
        reaped_by=REAPER,
        notices={"c1 stop 4", "c2 start 5"},
        connections=17,
        capacity=250,
        takers=[["worker-b", "c7"], ["worker-c", None]],
    )
    assert SessionItem.from_dynamodb(raw) == SessionItem(
        worker_id=ME,
        session_gen=GEN,
        state=schema.DEAD,
        expires_at_ms=NOW - 1_000,
        started_at_ms=NOW - 60_000,
        reaped_at_ms=NOW - 200,
        reaped_by=REAPER,
        notices=frozenset({"c1 stop 4", "c2 start 5"}),
        connections=17,
        capacity=250,
        takers=(("worker-b", "c7"), ("worker-c", None)),
    )


@pytest.mark.parametrize(
    "takers",
    [[], "worker-b", [["worker-b"]], [[1, None]], [["worker-b", 7]], [{"w": "x"}]],
)
def test_a_plan_that_cannot_be_read_is_no_plan(takers):
    assert SessionItem.from_dynamodb(session_raw(takers=takers)).takers is None


def test_a_session_item_with_only_its_key_is_malformed_never_alive():
    """The key alone (a torn or foreign item) must never look alive: without an expiry
    nothing says when it lapses, so it is left out of the listings."""
    with pytest.raises(MalformedItemError, match="expires_at_ms"):
        SessionItem.from_dynamodb({"Pk": S("SESSIONS#0"), "Sk": S("host-1#0")})


def test_the_worker_id_is_everything_before_the_last_hash_of_the_sort_key():
    item = SessionItem.from_dynamodb(
        {"Pk": S("SESSIONS#2"), "Sk": S("pod#a#b#12"), "expires_at_ms": N(NOW)}
    )
    assert item.key == ("pod#a#b", 12)


# --- who takes what of a dead session ------------------------------------------------------

IDS = ["a", "b", "c", "d", "e"]


@pytest.mark.parametrize(
    ("reaper", "room", "free", "share"),
    [
        # The reaper: from the front, up to its free capacity.
        (True, None, 10, IDS),
        (True, 3, 2, ["a", "b"]),
        (True, 0, 5, IDS),  # its own room is its free capacity, not the listed one
        (True, None, 0, []),
        # Another worker: only what the reaper has no room for, from the back.
        (False, 5, 10, []),
        (False, 9, 10, []),
        (False, 3, 10, ["e", "d"]),
        (False, 4, 10, ["e"]),
        (False, 0, 10, ["e", "d", "c", "b", "a"]),
        (False, 3, 1, ["e"]),  # and no more than it has room for
        (False, -2, 10, ["e", "d", "c", "b", "a"]),
        # No reaper to leave them to (gone, or past the fallback): anything, from the back.
        (False, None, 3, ["e", "d", "c"]),
        (False, None, 0, []),
    ],
)
def test_the_takers_of_a_dead_session_share_without_racing(reaper, room, free, share):
    assert takeover_share(IDS, reaper=reaper, reaper_room=room, free=free) == share


def test_the_reapers_share_and_the_others_never_overlap_while_it_has_room():
    for room in range(len(IDS) + 1):
        mine = set(takeover_share(IDS, reaper=True, reaper_room=None, free=room))
        theirs = set(takeover_share(IDS, reaper=False, reaper_room=room, free=10))
        assert not mine & theirs
        assert mine | theirs == set(IDS)


def _live(worker: str, connections: int, capacity: int, state: str = schema.ALIVE) -> SessionItem:
    return SessionItem(
        worker_id=worker,
        session_gen=1,
        state=state,
        expires_at_ms=NOW + 2_000,
        connections=connections,
        capacity=capacity,
    )


@pytest.mark.parametrize(
    ("sessions", "reaper", "room"),
    [
        ([_live("r", 200, 500), _live("x", 10, 500)], "r", 300),
        ([_live("r", 500, 500)], "r", 0),
        ([_live("r", 10, 0)], "r", 0),  # draining: no room
        ([_live("r", 600, 500)], "r", 0),
        ([_live("r", 1, 5, schema.DEAD)], "r", None),  # the reaper died since
        ([_live("x", 1, 5)], "r", None),
        ([], None, None),
    ],
)
def test_the_room_of_the_reaper_comes_from_its_live_session(sessions, reaper, room):
    assert reaper_room(sessions, reaper) == room


@pytest.mark.parametrize(
    ("fields", "reaper"),
    [
        ({"state": schema.DEAD, "reaped_by": REAPER, "reaped_at_ms": REAPED_AT}, REAPER),
        ({"state": schema.DEAD, "reaped_by": ME, "reaped_at_ms": REAPED_AT}, None),
        ({"state": schema.DEAD, "reaped_at_ms": REAPED_AT}, None),
    ],
)
def test_a_session_retired_by_its_own_worker_has_no_reaper_to_leave_anything_to(fields, reaper):
    """A session given up is retired with its connections: its worker's next session,
    however much room it publishes, is not waited for."""
    assert reaper_of(session(**fields)) == reaper
    if reaper is None:  # so the others take anything, at once
        assert reaper_room([_live(ME, 0, 500)], reaper) is None


@pytest.mark.parametrize(
    ("reaped_at", "fallback"),
    [(NOW, NOW + 4 * TIMING.lease_ms), (None, 4 * TIMING.lease_ms)],
)
def test_anyone_takes_anything_four_leases_after_the_reap(reaped_at, fallback):
    dead = SessionItem(
        worker_id="w", session_gen=1, state=schema.DEAD, expires_at_ms=0, reaped_at_ms=reaped_at
    )
    assert reaper_fallback_ms(dead, TIMING) == fallback


@pytest.mark.parametrize(
    ("token", "kind"),
    [
        (session_rules.notice_token("c1", "stop", 5, "n"), "stop"),
        (session_rules.notice_token("c1", "start", 5, "n"), "start"),
        (session_rules.notice_token("c-2", session_rules.OFFER, 5, "n"), "offer"),
        (session_rules.notice_token("c.3", session_rules.DRAIN, 5, "n"), "drain"),
        ("c1 offer", "offer"),  # the kind is the second field, however many follow
        ("c1", ""),  # not a token of ours: no kind, never an offer
        ("", ""),
    ],
)
def test_the_kind_of_a_notice(token, kind):
    assert session_rules.notice_kind(token) == kind
    assert (kind in session_rules.HANDOFFS) is (kind in ("offer", "drain"))


@pytest.mark.parametrize(
    ("item", "notices"),
    [
        (session_raw(), {"a offer 1 n", "b offer 1 n"}),
        (session_raw(notices={"c stop 5 n"}), {"a offer 1 n", "b offer 1 n", "c stop 5 n"}),
        (session_raw(notices={"a offer 1 n"}), {"a offer 1 n", "b offer 1 n"}),  # a retry
        (session_raw(state=schema.DEAD), None),  # retired or reaped: it cannot act on them
        (None, None),  # never opened, or forgotten
    ],
)
def test_an_offer_adds_every_token_to_a_live_session_only(item, notices):
    # A token given twice (a chunk retried within one call) is written once: DynamoDB
    # refuses a string set with duplicates.
    new = attempt(offer_update(["b offer 1 n", "a offer 1 n", "b offer 1 n"]), item)
    if notices is None:
        assert new is None
    else:
        assert new is not None
        assert set(new["notices"]["SS"]) == notices
        assert len(new["notices"]["SS"]) == len(notices)


def _listed(*keys: tuple[str, int]) -> set[tuple[str, int]]:
    return set(keys)


@pytest.mark.parametrize(
    ("gen", "listed", "expected"),
    [
        (1, _listed(), []),  # a first session has no predecessor
        (2, _listed(), [1]),
        (2, _listed(("w", 1)), []),  # still listed: swept as itself, if DEAD
        (5, _listed(("w", 3)), [2, 4]),  # up to three back
        (5, _listed(("other", 4)), [2, 3, 4]),  # another worker's generation
    ],
)
def test_the_sweep_of_a_dead_session_lists_the_workers_forgotten_predecessors(
    gen, listed, expected
):
    dead = SessionItem("w", gen, schema.DEAD, expires_at_ms=0, reaped_at_ms=1, reaped_by="x")
    assert session_rules.unlisted_predecessors(dead, listed) == expected


# --- the reap's plan -------------------------------------------------------------------

DEAD_IDS = [f"c{n:03}" for n in range(350)]


def _peers(*loads: tuple[str, int, int]) -> list[SessionItem]:
    return [_live(worker, connections, capacity) for worker, connections, capacity in loads]


def _parts(plan, ids=DEAD_IDS):
    parts: dict[str, list[str]] = {}
    for cid in ids:
        parts.setdefault(planned_taker(cid, plan), []).append(cid)
    return parts


def _dead(plan, reaped_at=NOW) -> SessionItem:
    return SessionItem(
        worker_id="dead",
        session_gen=1,
        state=schema.DEAD,
        expires_at_ms=reaped_at - 300,
        reaped_at_ms=reaped_at,
        reaped_by="r",
        takers=plan,
    )


def test_after_a_reap_that_recorded_room_150_the_others_share_the_excess_at_once():
    """Four workers at 350 of 500, one dies holding 350: the reaper has room for 150.
    Right at the reap (no grace), each of the two others has a part of its own; the
    parts and the reaper's are disjoint and together they cover every connection, and
    each brings its taker to its fair share (466.7 of 500). (The rules before: nothing
    for the others before a heartbeat, then the same list for both, from the back.)"""
    listing = _peers(("r", 350, 500), ("x", 350, 500), ("y", 350, 500))
    plan = takeover_plan(DEAD_IDS, reaper="r", room=150, sessions=listing, now_ms=NOW)
    assert plan == (("r", "c116"), ("x", "c233"), ("y", None))
    dead = _dead(plan)
    assert may_sweep(dead, "x", NOW, GRACE)
    assert may_sweep(dead, "y", NOW, GRACE)
    shares = {
        w: sweep_share(dead, DEAD_IDS, me=w, sessions=listing, free=150, now_ms=NOW, timing=TIMING)
        for w in ("r", "x", "y")
    }
    assert shares == {"r": DEAD_IDS[:117], "x": DEAD_IDS[117:234], "y": DEAD_IDS[234:]}
    assert sum(len(share) for share in shares.values()) == len(set(DEAD_IDS)) == 350
    # Stable while the listing shrinks (takeovers landing) and loads move (renews): the
    # same ids for the same worker, nothing of anyone else's.
    later = _peers(("r", 420, 500), ("x", 380, 500), ("y", 350, 500))
    left = DEAD_IDS[100:117] + DEAD_IDS[200:234] + DEAD_IDS[300:]
    again = {
        w: sweep_share(dead, left, me=w, sessions=later, free=150, now_ms=NOW + 300, timing=TIMING)
        for w in ("r", "x", "y")
    }
    assert again == {"r": DEAD_IDS[100:117], "x": DEAD_IDS[200:234], "y": DEAD_IDS[300:]}


@pytest.mark.parametrize(
    ("room", "listing", "plan"),
    [
        # Nobody else can take: the reaper's alone, whatever its room.
        (350, _peers(("r", 150, 500), ("x", 500, 500)), (("r", None),)),
        (500, [], (("r", None),)),
        # Towards the fair share after the takeover (483.3 each here), each part in
        # proportion to how far below it its taker is (134, 34 and 184), worker-id order.
        (
            150,
            _peers(("r", 350, 500), ("y", 300, 500), ("x", 450, 500)),
            (("r", "c132"), ("x", "c166"), ("y", None)),
        ),
        # A reaper above the share takes only what brings it there (325 each).
        (200, _peers(("r", 300, 500), ("x", 0, 500)), (("r", "c024"), ("x", None))),
        # Never beyond a room; what nobody has room for stays in the last part.
        (
            100,
            _peers(("r", 400, 500), ("x", 450, 500), ("y", 480, 500)),
            (("r", "c099"), ("x", "c149"), ("y", None)),
        ),
        # The reaper counts its free slots now, not the load it published.
        (0, _peers(("r", 100, 500), ("x", 0, 500)), (("x", None),)),
        # Not takers: dead, expired, full, draining.
        (
            150,
            [
                _live("r", 350, 500),
                _live("d", 0, 500, schema.DEAD),
                SessionItem(
                    worker_id="e",
                    session_gen=1,
                    state=schema.ALIVE,
                    expires_at_ms=NOW,
                    capacity=500,
                ),
                _live("f", 500, 500),
                _live("g", 10, 0),
                _live("x", 400, 500),
            ],
            (("r", "c149"), ("x", None)),
        ),
    ],
)
def test_the_plan_of_a_reap(room, listing, plan):
    assert takeover_plan(DEAD_IDS, reaper="r", room=room, sessions=listing, now_ms=NOW) == plan


def test_a_plan_gives_every_id_exactly_one_taker_even_one_the_listing_missed():
    plan = takeover_plan(
        DEAD_IDS, reaper="r", room=150, sessions=_peers(("x", 350, 500)), now_ms=NOW
    )
    assert plan == (("r", "c149"), ("x", None))
    assert planned_taker("a-missed", plan) == "r"  # below every id
    assert planned_taker("c149", plan) == "r"
    assert planned_taker("c1495", plan) == "x"
    assert planned_taker("zzz", plan) == "x"
    assert planned_taker("c2", (("r", "c1"), ("x", "c5"))) == "x"
    assert planned_taker("c9", (("r", "c1"), ("x", "c5"))) == "x"  # a plan without an open end
    assert takeover_plan([], reaper="r", room=0, sessions=[], now_ms=NOW) == (("r", None),)


@given(
    st.integers(min_value=0, max_value=400),
    st.integers(min_value=0, max_value=500),
    st.lists(st.integers(min_value=0, max_value=200), max_size=6),
)
def test_a_plan_keeps_every_taker_within_its_room_and_its_fair_share(count, room, rooms):
    ids = [f"c{n:03}" for n in range(count)]
    listing = [_live("r", 500 - room, 500)] + [
        _live(f"w{n}", 500 - r, 500) for n, r in enumerate(rooms)
    ]
    plan = takeover_plan(ids, reaper="r", room=room, sessions=listing, now_ms=NOW)
    parts = _parts(plan, ids)
    assert sum(len(p) for p in parts.values()) == count
    assert len({w for w, _ in plan}) == len(plan)
    limits = {"r": room} | {f"w{n}": r for n, r in enumerate(rooms)}
    assert all(len(parts.get(w, [])) <= limits[w] for w, _ in plan[:-1])
    if count <= sum(limits.values()):
        fleet = 500 * len(limits)
        total = sum(500 - r for r in limits.values()) + count
        for worker, part in parts.items():
            share = Fraction(500 * total, fleet)
            assert len(part) <= limits[worker]
            assert 500 - limits[worker] + len(part) <= math.ceil(share)


def test_a_part_whose_taker_cannot_take_it_goes_to_one_other_by_rendezvous():
    plan = (("r", "c149"), ("x", "c249"), ("y", None))
    gone = [_live("r", 500, 500), _live("x", 350, 500), _live("y", 1, 5, schema.DEAD)]
    shares = {
        w: planned_share(DEAD_IDS, me=w, takers=plan, sessions=gone, free=500, now_ms=NOW)
        for w in ("r", "x", "y")
    }
    # r is full as published and y is gone: their parts go to x, the one left with room;
    # r, which knows its own free slots, still tries its own.
    assert shares["x"] == DEAD_IDS
    assert shares["r"] == DEAD_IDS[:150]
    assert shares["y"] == DEAD_IDS[250:]
    # With two takers left, y's part is split between them, each id to exactly one.
    two = [_live("r", 200, 500), _live("x", 350, 500), _live("z", 0, 500)]
    split = {
        w: set(planned_share(DEAD_IDS, me=w, takers=plan, sessions=two, free=500, now_ms=NOW))
        for w in ("r", "x", "z")
    }
    assert split["r"] - set(DEAD_IDS[250:]) == set(DEAD_IDS[:150])
    assert split["x"] - set(DEAD_IDS[250:]) == set(DEAD_IDS[150:250])
    assert split["r"] | split["x"] | split["z"] == set(DEAD_IDS)
    assert sum(len(part) for part in split.values()) == 350
    assert all(split[w] & set(DEAD_IDS[250:]) for w in ("r", "x", "z"))
    # No more than there is room for, from the front of the share.
    assert (
        planned_share(DEAD_IDS, me="x", takers=plan, sessions=gone, free=3, now_ms=NOW)
        == (DEAD_IDS[:3])
    )
    assert planned_share(DEAD_IDS, me="x", takers=plan, sessions=gone, free=0, now_ms=NOW) == []


def test_four_leases_after_the_reap_anyone_takes_anything_even_with_a_plan():
    plan = (("r", "c149"), ("x", None))
    listing = _peers(("r", 350, 500), ("x", 350, 500))
    fallback = NOW + 4 * TIMING.lease_ms
    share = sweep_share(
        _dead(plan), DEAD_IDS, me="y", sessions=listing, free=5, now_ms=fallback, timing=TIMING
    )
    assert share == DEAD_IDS[::-1][:5]
    before = sweep_share(
        _dead(plan), DEAD_IDS, me="y", sessions=listing, free=5, now_ms=fallback - 1, timing=TIMING
    )
    assert before == []


def test_without_a_plan_the_rules_before_it_apply():
    """A reap by an older worker during a rolling deploy records no plan: the reaper
    from the front, the others only the excess beyond its published room, from the
    back (and :func:`may_sweep` holds them back for the grace)."""
    listing = _peers(("r", 350, 500))
    old = _dead(None)
    assert (
        sweep_share(old, DEAD_IDS, me="r", sessions=listing, free=150, now_ms=NOW, timing=TIMING)
        == (DEAD_IDS[:150])
    )
    assert (
        sweep_share(old, DEAD_IDS, me="x", sessions=listing, free=500, now_ms=NOW, timing=TIMING)
        == (DEAD_IDS[150:][::-1])
    )
    assert (
        sweep_share(old, DEAD_IDS, me="x", sessions=[], free=3, now_ms=NOW, timing=TIMING)
        == (DEAD_IDS[::-1][:3])
    )


def test_the_next_pass_comes_when_a_listed_session_lapses_if_not_renewed():
    mine = ("me", 1)
    listed = [
        _live("healthy", 0, 500),  # expires NOW + 2000
        SessionItem(worker_id="quiet", session_gen=1, state=schema.ALIVE, expires_at_ms=NOW + 300),
        SessionItem(worker_id="me", session_gen=1, state=schema.ALIVE, expires_at_ms=NOW + 100),
        SessionItem(worker_id="gone", session_gen=1, state=schema.DEAD, expires_at_ms=NOW + 50),
        # lapsed already: this pass reaps it (or failed to): no instant in the past
        SessionItem(worker_id="lapsed", session_gen=1, state=schema.ALIVE, expires_at_ms=NOW - 260),
    ]
    margin = session_rules.REAP_WAKE_MARGIN_MS
    assert next_reap_ms(listed, mine, NOW, TIMING) == NOW + 300 + 250 + margin
    # The instant itself is not after now: the next one counts.
    assert next_reap_ms(listed, mine, NOW + 560, TIMING) == NOW + 2_000 + 250 + margin
    assert next_reap_ms(listed[2:], mine, NOW, TIMING) is None
    assert next_reap_ms([], mine, NOW, TIMING) is None
    # Once lapsed by that instant, a reap at it passes.
    quiet = listed[1]
    assert is_lapsed(quiet, NOW + 300 + 250 + margin, TIMING)
    assert not is_lapsed(quiet, NOW + 300 + 250, TIMING)
