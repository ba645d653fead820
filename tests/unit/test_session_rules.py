"""The session protocol as tables: opening, renewing (a beat, with the notices acted
on), reaping on condition of the beat the reaper saw unchanged, retiring, notices,
sweeping and forgetting a dead session. Writes are checked exactly and run against
items by tests/unit/expressions.py. When a session lapses is
tests/unit/test_session_watch.py's."""

from __future__ import annotations

import math
from dataclasses import replace
from decimal import Decimal
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
    REAPER_FALLBACK_LEASES,
    RenewRefusal,
    SessionItem,
    can_take,
    forget_condition,
    may_forget,
    may_sweep,
    new_session_item,
    notice_connection_id,
    notice_token,
    notice_update,
    offer_update,
    open_taker,
    planned_share,
    planned_taker,
    reap_update,
    reaper_fallback_due,
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
from wsfleet.session_watch import SessionWatch
from wsfleet.timing import DRIFT_RATE, LeaseTiming
from wsfleet.version import VERSION

TIMING = LeaseTiming.from_lease()  # lease 2.2 s (2200 ms), margin 0.22 s: fence after 1.98 s
ME = "worker-a"  # crc32 % 4 == 0: partition SESSIONS#0
GEN = 7
REAPER = "worker-b"
NOW = 1_000_000
BEAT = 5
GRACE = 1.0
NOBODY_OVERDUE: frozenset[tuple[str, int]] = frozenset()


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
        "beat": BEAT,
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
        "expires_at_ms": N(NOW + 2200),
        "started_at_ms": N(NOW),
        "connections": N(0),
        "capacity": N(500),
        "version": S(VERSION),
        "beat": N(0),
        "proto": N(2),
    }
    assert schema.SESSION_PROTOCOL_NOW == 2


def test_a_new_session_reads_back_as_alive_and_empty():
    opened = SessionItem.from_dynamodb(new_session_item(ME, GEN, NOW, TIMING, 12))
    assert opened == SessionItem(
        worker_id=ME,
        session_gen=GEN,
        state=schema.ALIVE,
        expires_at_ms=NOW + 2200,
        started_at_ms=NOW,
        reaped_at_ms=None,
        reaped_by=None,
        notices=frozenset(),
        connections=0,
        capacity=12,
        version=VERSION,
        beat=0,
        protocol=2,
    )
    assert opened.alive
    assert opened.key == (ME, GEN)


# --- renewing ----------------------------------------------------------------------------


def test_renew_update_exactly():
    update = renew_update(NOW, TIMING, connections=3)
    assert update.update_expression == "SET #expires = :expires, #conns = :conns ADD #beat :one"
    assert update.condition_expression == "#state = :alive"
    assert update.names == {
        "#state": "state",
        "#expires": "expires_at_ms",
        "#conns": "connections",
        "#beat": "beat",
    }
    assert update.values == {
        ":alive": S("ALIVE"),
        ":expires": N(NOW + 2200),
        ":conns": N(3),
        ":one": N(1),
    }


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
        "SET #expires = :expires, #conns = :conns ADD #beat :one DELETE #notices :acted"
    )
    assert update.condition_expression == "#state = :alive"
    assert update.names == {
        "#state": "state",
        "#expires": "expires_at_ms",
        "#conns": "connections",
        "#beat": "beat",
        "#notices": "notices",
    }
    assert update.values == {
        ":alive": S("ALIVE"),
        ":expires": N(NOW + 2200),
        ":conns": N(0),
        ":one": N(1),
        ":acted": {"SS": ["c1 start 4", "c2 stop 5"]},
    }


@pytest.mark.parametrize("capacity", [0, 500])
def test_a_renew_publishes_the_capacity_when_given(capacity):
    """Capacity 0 is a draining worker: it must be written, not left out."""
    update = renew_update(NOW, TIMING, connections=3, acted_on=["c1 stop 4"], capacity=capacity)
    assert update.update_expression == (
        "SET #expires = :expires, #conns = :conns, #cap = :cap ADD #beat :one"
        " DELETE #notices :acted"
    )
    assert update.names == {
        "#state": "state",
        "#expires": "expires_at_ms",
        "#conns": "connections",
        "#beat": "beat",
        "#cap": "capacity",
        "#notices": "notices",
    }
    assert update.values == {
        ":alive": S("ALIVE"),
        ":expires": N(NOW + 2200),
        ":conns": N(3),
        ":one": N(1),
        ":cap": N(capacity),
        ":acted": {"SS": ["c1 stop 4"]},
    }
    renewed = attempt(update, session_raw(capacity=500, notices={"c1 stop 4"}))
    assert renewed is not None
    assert SessionItem.from_dynamodb(renewed).capacity == capacity


def test_no_notice_acted_on_deletes_nothing():
    """DynamoDB refuses an empty set, so no notices means no DELETE at all."""
    assert renew_update(NOW, TIMING, connections=1, acted_on=[]) == renew_update(
        NOW, TIMING, connections=1
    )


@pytest.mark.parametrize(
    ("fields", "beat"),
    [
        ({"expires_at_ms": NOW + 2200 - 594}, BEAT + 1),  # the renew of a heartbeat ago
        ({"expires_at_ms": NOW + 2200}, BEAT + 1),  # a retry of this very renew: counted too
        # A later renew landed first: this late one passes all the same (and moves the
        # expiry back: a figure for people, never decided on).
        ({"expires_at_ms": NOW + 2201}, BEAT + 1),
        ({"expires_at_ms": NOW + 60_000}, BEAT + 1),
        ({"expires_at_ms": NOW - 5000}, BEAT + 1),  # lapsed but not reaped: still ours
        ({"expires_at_ms": None}, BEAT + 1),  # no expiry: nothing refuses it
        ({"beat": 0}, 1),  # the first renew of a new session
        ({"beat": None}, 1),  # an item without a beat gets one
        ({"state": schema.DEAD, "expires_at_ms": NOW}, None),  # reaped: never again
        ({"state": schema.DEAD, "expires_at_ms": NOW + 5000}, None),
        ({"state": None}, None),  # no state: reaped as lapsed, never renewed
    ],
)
def test_a_renew_passes_while_alive_and_always_adds_one_to_the_beat(fields, beat):
    new = attempt(renew_update(NOW, TIMING, connections=4), session_raw(**fields))
    assert (new is not None) is (beat is not None)
    if new is not None:
        assert new == session_raw(
            **(fields | {"expires_at_ms": NOW + 2200, "connections": 4, "beat": beat})
        )


def test_renews_landing_in_any_order_each_change_the_beat():
    """Three renews sent a heartbeat apart land in reverse order: each one still
    changes the beat, so each fails a reap whose reaper had not seen it."""
    item: Item | None = session_raw(beat=BEAT)
    beats = []
    for sent_ms in (NOW + 1188, NOW + 594, NOW):
        assert item is not None
        reap = reap_update(REAPER, NOW + 5000, SessionItem.from_dynamodb(item).beat)
        item = attempt(renew_update(sent_ms, TIMING, connections=1), item)
        assert item is not None
        beats.append(SessionItem.from_dynamodb(item).beat)
        assert attempt(reap, item) is None  # the reaper saw the beat before this renew
    assert beats == [BEAT + 1, BEAT + 2, BEAT + 3]


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
    "old",
    [
        None,  # forgotten
        session(state=schema.DEAD),
        session(state=schema.DEAD, expires_at_ms=NOW + 10_000),
        session(state=None),  # no state reads as DEAD
        session(state=schema.ALIVE),  # read back too late: it was refused, so reaped
    ],
)
def test_a_refused_renew_always_means_reaped(old):
    """The renew requires nothing but ALIVE: a late renew is no longer refused as
    superseded, so a refusal means the session is lost, whatever is read back."""
    assert renew_failure(old) is RenewRefusal.REAPED


def test_reaped_is_the_only_refusal():
    assert list(RenewRefusal) == [RenewRefusal.REAPED]


# --- reaping -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("beat", "fields", "reaped"),
    [
        (BEAT, {}, True),  # the beat the reaper saw unchanged: reaped
        (BEAT, {"expires_at_ms": NOW + 60_000}, True),  # the wall-clock expiry is no part
        (BEAT, {"expires_at_ms": None}, True),
        (BEAT, {"beat": BEAT + 1}, False),  # renewed since the reaper saw it
        (BEAT, {"beat": BEAT - 1}, False),  # not the beat it saw either
        (BEAT, {"beat": None}, False),
        (BEAT, {"state": schema.DEAD}, False),  # reaped already
        (BEAT, {"state": None}, False),  # a reap of an ALIVE session needs ALIVE
        (None, {"beat": None}, True),  # an item without a beat, seen so
        (None, {}, False),  # ... that has one now
        (0, {"beat": 0}, True),  # never renewed (its worker died right after the open)
    ],
)
def test_a_reap_passes_only_on_the_beat_the_reaper_saw(beat, fields, reaped):
    new = attempt(reap_update(REAPER, NOW, beat), session_raw(**fields))
    assert (new is not None) is reaped
    if new is not None:
        assert new == session_raw(
            **(fields | {"state": schema.DEAD, "reaped_at_ms": NOW, "reaped_by": REAPER})
        )


@pytest.mark.parametrize(
    ("beat", "fields", "reaped"),
    [
        (BEAT, {"state": None}, True),
        (None, {"state": None, "beat": None}, True),
        (BEAT, {"state": None, "beat": BEAT + 1}, False),
        (BEAT, {}, False),  # ALIVE: not the item that was listed without a state
        (BEAT, {"state": schema.DEAD}, False),
    ],
)
def test_a_session_listed_without_a_state_is_reaped_as_such(beat, fields, reaped):
    update = reap_update(REAPER, NOW, beat, state_absent=True)
    assert (attempt(update, session_raw(**fields)) is not None) is reaped


def test_reap_update_exactly():
    update = reap_update(REAPER, NOW, BEAT)
    assert update.update_expression == "SET #state = :dead, #reapedat = :now, #reapedby = :me"
    assert update.condition_expression == "#state = :alive AND #beat = :beat"
    assert update.names == {
        "#state": "state",
        "#reapedat": "reaped_at_ms",
        "#reapedby": "reaped_by",
        "#beat": "beat",
    }
    assert update.values == {
        ":dead": S("DEAD"),
        ":alive": S("ALIVE"),
        ":now": N(NOW),
        ":me": S(REAPER),
        ":beat": N(BEAT),
    }
    assert reap_update(REAPER, NOW, BEAT, ()) == update  # an empty plan is no plan


def test_reap_update_of_an_item_without_a_beat_or_a_state_exactly():
    update = reap_update(REAPER, NOW, None)
    assert update.condition_expression == "#state = :alive AND attribute_not_exists(#beat)"
    assert ":beat" not in update.values
    assert update.names["#beat"] == "beat"
    stateless = reap_update(REAPER, NOW, BEAT, state_absent=True)
    assert stateless.condition_expression == "attribute_not_exists(#state) AND #beat = :beat"
    assert stateless.values == {
        ":dead": S("DEAD"),
        ":now": N(NOW),
        ":me": S(REAPER),
        ":beat": N(BEAT),
    }
    neither = reap_update(REAPER, NOW, None, state_absent=True)
    assert neither.condition_expression == (
        "attribute_not_exists(#state) AND attribute_not_exists(#beat)"
    )


def test_a_reap_records_its_plan_in_the_same_write():
    plan = (("worker-b", "c149"), ("worker-c", None))
    update = reap_update(REAPER, NOW, BEAT, plan)
    assert update.update_expression == (
        "SET #state = :dead, #reapedat = :now, #reapedby = :me, #takers = :takers"
    )
    assert update.condition_expression == "#state = :alive AND #beat = :beat"
    assert update.names["#takers"] == "takers"
    assert update.values[":takers"] == {
        "L": [{"L": [S("worker-b"), S("c149")]}, {"L": [S("worker-c"), {"NULL": True}]}]
    }
    reaped = attempt(update, session_raw())
    assert reaped is not None
    dead = SessionItem.from_dynamodb(reaped)
    assert (dead.state, dead.reaped_by, dead.takers, dead.beat) == (
        schema.DEAD,
        REAPER,
        plan,
        BEAT,
    )
    # The same condition as a reap without one: not once renewed since, never twice.
    assert attempt(update, session_raw(beat=BEAT + 1)) is None
    assert attempt(reap_update("worker-c", NOW, BEAT, plan), reaped) is None


def test_a_reaped_session_is_dead_for_good():
    listed = session_raw()
    reaped = attempt(reap_update(REAPER, NOW, BEAT), listed)
    assert reaped == listed | {
        "state": S("DEAD"),
        "reaped_at_ms": N(NOW),
        "reaped_by": S(REAPER),
    }
    dead = SessionItem.from_dynamodb(reaped)
    assert (dead.alive, dead.reaped_at_ms, dead.reaped_by) == (False, NOW, REAPER)
    # Its owner's late renew fails, and says so; nobody reaps it twice, on any beat.
    assert attempt(renew_update(NOW, TIMING, connections=3), reaped) is None
    assert renew_failure(dead) is RenewRefusal.REAPED
    for beat in (BEAT, BEAT + 1, None):
        assert attempt(reap_update("worker-c", NOW + 5_000, beat), reaped) is None


def test_a_renew_and_a_reap_race_and_exactly_one_lands():
    """The reaper saw beat 5 unchanged; the holder's renew is in flight. Whichever
    lands first wins: the other's condition fails."""
    listed = session_raw()
    renew = renew_update(NOW, TIMING, connections=3)
    reap = reap_update(REAPER, NOW, BEAT)
    renewed = attempt(renew, listed)
    assert renewed is not None
    assert attempt(reap, renewed) is None  # the renew first: the reap fails
    reaped = attempt(reap, listed)
    assert reaped is not None
    assert attempt(renew, reaped) is None  # the reap first: the renew fails


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
        ({"expires_at_ms": NOW + 2200}, True),
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


@pytest.mark.parametrize("holder_rate", [1 - DRIFT_RATE, 1.0, 1 + DRIFT_RATE])
@pytest.mark.parametrize("reaper_rate", [1 - DRIFT_RATE, 1.0, 1 + DRIFT_RATE])
@pytest.mark.parametrize("seen_after", [0.0, 0.3, 1.0])
def test_the_fence_deadline_falls_before_any_reap(holder_rate, reaper_rate, seen_after):
    """With clocks whose rates are within the drift, no worker can reap a session (and
    so take its connections) before the owner's fence deadline of the same renew: the
    renew is seen after its send, and the reaper then waits ``expire_after`` on its own
    clock; each clock reads ``rate x real time + offset``, offsets far apart. (The
    property for any times and rates is tests/unit/test_session_watch.py's.)"""
    holder_offset, reaper_offset = 700_000.0, -300_000.0
    sent = 10.0  # real time of the renew's send; it lands and is listed at once
    deadline = fence_deadline(holder_rate * sent + holder_offset, TIMING)
    fenced_at = (deadline - holder_offset) / holder_rate  # in real time
    renewed = session(beat=BEAT + 1)
    watch = SessionWatch(TIMING)
    watch.observe([session(beat=BEAT)], reaper_rate * (sent - 5) + reaper_offset)
    watch.observe([renewed], reaper_rate * (sent + seen_after) + reaper_offset)
    first = min(
        real / 1000
        for real in range(10_000, 20_000)
        if watch.lapsed(renewed, reaper_rate * real / 1000 + reaper_offset)
    )
    assert first > fenced_at
    # ``expire_after`` on the reaper's clock after the renew was seen (the first ms of
    # the search at or after it, give or take 1e-9 s of rounding of the clocks' large
    # offsets), and between the deadline and the reap, the margin less the slow
    # holder's drift over a lease, and the time the renew took to be seen.
    exact = sent + seen_after + TIMING.expire_after / reaper_rate
    assert exact - 1e-9 <= first <= exact + 1e-3 + 1e-9
    assert first - fenced_at > seen_after + TIMING.margin - DRIFT_RATE * TIMING.lease


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


DEAD_BY_REAPER = {"state": schema.DEAD, "reaped_by": REAPER, "reaped_at_ms": REAPED_AT}


@pytest.mark.parametrize(
    ("fields", "me", "dead_for", "sweeps"),
    [
        ({}, REAPER, 100.0, False),  # alive: nothing to sweep
        ({"reaped_by": REAPER, "reaped_at_ms": REAPED_AT}, REAPER, 100.0, False),  # alive still
        ({"state": schema.DEAD}, REAPER, 100.0, False),  # no reap time: not swept
        ({"state": schema.DEAD, "reaped_by": REAPER}, REAPER, 100.0, False),
        ({"state": None, "reaped_at_ms": REAPED_AT}, REAPER, 100.0, False),  # reaped first
        # the reaper goes at once
        (DEAD_BY_REAPER, REAPER, 0.0, True),
        # the others only once they have seen it DEAD for the grace, on their own clock
        (DEAD_BY_REAPER, "w-c", 0.0, False),
        (DEAD_BY_REAPER, "w-c", GRACE - 0.001, False),
        (DEAD_BY_REAPER, "w-c", GRACE, True),
        (DEAD_BY_REAPER, "w-c", 100.0, True),
        # retired by its own worker (given up): nobody is its reaper, everyone goes at once
        ({"state": schema.DEAD, "reaped_by": ME, "reaped_at_ms": REAPED_AT}, REAPER, 0.0, True),
        ({"state": schema.DEAD, "reaped_by": ME, "reaped_at_ms": REAPED_AT}, ME, 0.0, True),
        ({"state": schema.DEAD, "reaped_at_ms": REAPED_AT}, REAPER, 0.0, False),
        ({"state": schema.DEAD, "reaped_at_ms": REAPED_AT}, REAPER, GRACE, True),
        ({"state": schema.DEAD, "reaped_at_ms": 0}, REAPER, GRACE, True),  # 0 is a reap time
        # a reap that recorded who takes what: everyone at once
        (DEAD_BY_REAPER | {"takers": PLAN}, "w-c", 0.0, True),
        ({"state": schema.DEAD, "reaped_at_ms": REAPED_AT, "takers": PLAN}, ME, 0.0, True),
        ({"reaped_by": REAPER, "reaped_at_ms": REAPED_AT, "takers": PLAN}, "w-c", 100.0, False),
        ({"state": schema.DEAD, "takers": PLAN}, "w-c", 100.0, False),  # no reap time
    ],
)
def test_who_sweeps_a_dead_session_and_when(fields, me, dead_for, sweeps):
    assert may_sweep(session(**fields), me, dead_for, GRACE) is sweeps


def test_the_wall_clock_reap_time_does_not_decide_when_the_others_sweep():
    """A reap time far in this worker's future or past (the reaper's wall clock is
    off) changes nothing: only how long this worker has seen it DEAD counts."""
    for reaped_at in (0, NOW - 3_600_000, NOW + 3_600_000):
        dead = session(state=schema.DEAD, reaped_by=REAPER, reaped_at_ms=reaped_at)
        assert not may_sweep(dead, "w-c", 0.0, GRACE)
        assert may_sweep(dead, "w-c", GRACE, GRACE)


@pytest.mark.parametrize(
    ("unseen_for", "forget"),
    [
        (0.0, False),
        (2.199, False),
        (2.2, True),  # a full lease with nothing seen under it
        (2.201, True),
        (3600.0, True),
    ],
)
def test_a_dead_session_is_forgotten_after_a_full_lease_of_nothing(unseen_for, forget):
    assert may_forget(unseen_for, TIMING) is forget


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
        (NOW + 10, 0),  # the writer's wall clock ahead of this one: clamped, never negative
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
        version="1.2.3",
        beat=41,
        proto=2,
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
        version="1.2.3",
        beat=41,
        protocol=2,
    )


@pytest.mark.parametrize(
    "takers",
    [[], "worker-b", [["worker-b"]], [[1, None]], [["worker-b", 7]], [{"w": "x"}]],
)
def test_a_plan_that_cannot_be_read_is_no_plan(takers):
    assert SessionItem.from_dynamodb(session_raw(takers=takers)).takers is None


def test_a_session_item_with_only_its_key_is_never_alive_and_is_reaped_as_such():
    """The key alone (a torn or foreign item) must never look alive: it has no state,
    so it takes nothing over; with no beat either, a watcher that sees it so for a
    lease reaps it on exactly that (a missing expiry no longer matters)."""
    raw = {"Pk": S("SESSIONS#0"), "Sk": S("host-1#0")}
    bare = SessionItem.from_dynamodb(raw)
    assert (bare.state, bare.beat, bare.protocol, bare.expires_at_ms) == (None, None, None, 0)
    assert not bare.alive
    assert bare.reapable
    assert not can_take(bare, NOBODY_OVERDUE)
    reaped = attempt(reap_update(REAPER, NOW, bare.beat, state_absent=True), raw)
    assert reaped is not None
    assert SessionItem.from_dynamodb(reaped).state == schema.DEAD


@pytest.mark.parametrize(
    ("fields", "problem"),
    [
        ({"beat": "5"}, "beat is not"),
        ({"beat": True}, "beat is not"),
        ({"expires_at_ms": "soon"}, "expires_at_ms is not"),
        ({"state": "ZOMBIE"}, "state is not"),
    ],
)
def test_a_session_item_with_a_beat_of_the_wrong_type_is_malformed(fields, problem):
    """A beat that is not a number could never be reaped on condition of it: the item
    is left out of the listings (and reported), never reaped as if it had none."""
    with pytest.raises(MalformedItemError, match=problem):
        SessionItem.from_dynamodb(session_raw(**fields))


@pytest.mark.parametrize(
    ("raw", "protocol"),
    [(2, 2), (1, 1), (None, None), ("2", None), (True, None), (Decimal("2.5"), None)],
)
def test_the_session_protocol_is_read_leniently(raw, protocol):
    """Compared, never decided on: anything but an integer reads as absent."""
    assert session(proto=raw).protocol == protocol


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
    ("candidate", "overdue", "takes"),
    [
        (_live("x", 10, 500), NOBODY_OVERDUE, True),
        (_live("x", 499, 500), NOBODY_OVERDUE, True),
        (_live("x", 10, 500), {("x", 1)}, False),  # seen unrenewed for a lease
        (_live("x", 10, 500), {("x", 2), ("y", 1)}, True),  # another generation overdue
        (_live("x", 500, 500), NOBODY_OVERDUE, False),  # full as published
        (_live("x", 600, 500), NOBODY_OVERDUE, False),
        (_live("x", 0, 0), NOBODY_OVERDUE, False),  # draining
        (_live("x", 0, 500, schema.DEAD), NOBODY_OVERDUE, False),
        (replace(_live("x", 0, 500), state=None), NOBODY_OVERDUE, False),
        # The wall-clock expiry is no part of it, whichever way the writer's clock is off.
        (replace(_live("x", 10, 500), expires_at_ms=0), NOBODY_OVERDUE, True),
        (replace(_live("x", 10, 500), expires_at_ms=NOW + 3_600_000), {("x", 1)}, False),
    ],
)
def test_who_can_take_over_connections(candidate, overdue, takes):
    assert can_take(candidate, overdue) is takes


def test_the_open_taker_is_picked_among_those_not_overdue():
    listing = [_live(w, 0, 500) for w in ("x", "y", "z")]
    ids = [f"c{n}" for n in range(60)]
    everyone = {cid: open_taker(cid, listing, NOBODY_OVERDUE) for cid in ids}
    assert set(everyone.values()) == {"x", "y", "z"}  # spread by rendezvous
    without_y = {cid: open_taker(cid, listing, {("y", 1)}) for cid in ids}
    assert "y" not in without_y.values()
    # Only what y had moves; every worker with the same listing picks the same one.
    assert all(without_y[cid] == everyone[cid] for cid in ids if everyone[cid] != "y")
    assert open_taker("c1", listing, {("x", 1), ("y", 1), ("z", 1)}) is None
    assert open_taker("c1", [], NOBODY_OVERDUE) is None


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
    ("dead_for", "due"),
    [(0.0, False), (8.799, False), (8.8, True), (8.801, True), (3600.0, True)],
)
def test_anyone_takes_anything_four_leases_after_the_reap(dead_for, due):
    """Four leases of seeing it DEAD, on this worker's own clock (8.8 s at 2.2 s)."""
    assert REAPER_FALLBACK_LEASES * TIMING.lease == 8.8
    assert reaper_fallback_due(dead_for, TIMING) is due


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
    ("tokens", "stopped"),
    [
        ({"c1 stop 5 n"}, {"c1"}),
        ({"c1 start 5 n"}, set()),
        ({"c1 stop 5 n", "c1 start 6 n"}, set()),  # started again since: the read decides
        ({"c1 start 5 n", "c1 stop 6 n"}, {"c1"}),  # stopped again since
        ({"c1 start 5 n", "c1 stop 5 m"}, set()),  # the same millisecond: the read decides
        ({"c1 stop 5 n", "c2 stop 9 n", "c2 start 10 n"}, {"c1"}),
        ({"c1 stop 10 n", "c1 start 9 n"}, {"c1"}),  # by the time written, not the order
        ({"c1 offer 7 n", "c2 drain 7 n"}, set()),  # another worker's: never a stop
        ({"c1 stop x n", "c1 stop"}, set()),  # not of our shape: no time, no word
        (set(), set()),
    ],
)
def test_the_connections_whose_latest_notice_is_a_stop(tokens, stopped):
    assert session_rules.stopped_by_notice(tokens) == stopped


@pytest.mark.parametrize(
    ("token", "at"),
    [
        ("c1 stop 5 n", 5),
        ("c1 stop 1800000000000 n", 1800000000000),
        ("c1 stop", None),
        ("c1 stop -5 n", None),
        ("", None),
    ],
)
def test_when_a_notice_was_written(token, at):
    assert session_rules.notice_at_ms(token) == at


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


def _parts(plan: session_rules.Takers, ids: list[str] = DEAD_IDS) -> dict[str, list[str]]:
    parts: dict[str, list[str]] = {}
    for cid in ids:
        parts.setdefault(planned_taker(cid, plan), []).append(cid)
    return parts


def _dead(plan: session_rules.Takers | None, reaped_at: int = NOW) -> SessionItem:
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
    plan = takeover_plan(DEAD_IDS, reaper="r", room=150, sessions=listing, overdue=NOBODY_OVERDUE)
    assert plan == (("r", "c116"), ("x", "c233"), ("y", None))
    dead = _dead(plan)
    assert may_sweep(dead, "x", 0.0, GRACE)
    assert may_sweep(dead, "y", 0.0, GRACE)
    shares = {
        w: sweep_share(
            dead,
            DEAD_IDS,
            me=w,
            sessions=listing,
            free=150,
            dead_for=0.0,
            overdue=NOBODY_OVERDUE,
            timing=TIMING,
        )
        for w in ("r", "x", "y")
    }
    assert shares == {"r": DEAD_IDS[:117], "x": DEAD_IDS[117:234], "y": DEAD_IDS[234:]}
    assert sum(len(share) for share in shares.values()) == len(set(DEAD_IDS)) == 350
    # Stable while the listing shrinks (takeovers landing) and loads move (renews): the
    # same ids for the same worker, nothing of anyone else's.
    later = _peers(("r", 420, 500), ("x", 380, 500), ("y", 350, 500))
    left = DEAD_IDS[100:117] + DEAD_IDS[200:234] + DEAD_IDS[300:]
    again = {
        w: sweep_share(
            dead,
            left,
            me=w,
            sessions=later,
            free=150,
            dead_for=0.3,
            overdue=NOBODY_OVERDUE,
            timing=TIMING,
        )
        for w in ("r", "x", "y")
    }
    assert again == {"r": DEAD_IDS[100:117], "x": DEAD_IDS[200:234], "y": DEAD_IDS[300:]}


_EXPIRED_BY_ITS_WALL_CLOCK = SessionItem(
    worker_id="e", session_gen=1, state=schema.ALIVE, expires_at_ms=NOW - 60_000, capacity=500
)


@pytest.mark.parametrize(
    ("room", "listing", "overdue", "plan"),
    [
        # Nobody else can take: the reaper's alone, whatever its room.
        (350, _peers(("r", 150, 500), ("x", 500, 500)), NOBODY_OVERDUE, (("r", None),)),
        (500, [], NOBODY_OVERDUE, (("r", None),)),
        # Towards the fair share after the takeover (483.3 each here), each part in
        # proportion to how far below it its taker is (134, 34 and 184), worker-id order.
        (
            150,
            _peers(("r", 350, 500), ("y", 300, 500), ("x", 450, 500)),
            NOBODY_OVERDUE,
            (("r", "c132"), ("x", "c166"), ("y", None)),
        ),
        # A reaper above the share takes only what brings it there (325 each).
        (
            200,
            _peers(("r", 300, 500), ("x", 0, 500)),
            NOBODY_OVERDUE,
            (("r", "c024"), ("x", None)),
        ),
        # Never beyond a room; what nobody has room for stays in the last part.
        (
            100,
            _peers(("r", 400, 500), ("x", 450, 500), ("y", 480, 500)),
            NOBODY_OVERDUE,
            (("r", "c099"), ("x", "c149"), ("y", None)),
        ),
        # The reaper counts its free slots now, not the load it published.
        (0, _peers(("r", 100, 500), ("x", 0, 500)), NOBODY_OVERDUE, (("x", None),)),
        # Not takers: dead, overdue (seen unrenewed for a lease), full, draining.
        (
            150,
            [
                _live("r", 350, 500),
                _live("d", 0, 500, schema.DEAD),
                _live("o", 0, 500),
                _live("f", 500, 500),
                _live("g", 10, 0),
                _live("x", 400, 500),
            ],
            {("o", 1)},
            (("r", "c149"), ("x", None)),
        ),
        # Expired by its writer's wall clock but renewing as seen: a taker all the same.
        (
            150,
            [_live("r", 350, 500), _EXPIRED_BY_ITS_WALL_CLOCK],
            NOBODY_OVERDUE,
            (("e", None),),
        ),
        (150, [_live("r", 350, 500), _EXPIRED_BY_ITS_WALL_CLOCK], {("e", 1)}, (("r", None),)),
    ],
)
def test_the_plan_of_a_reap(room, listing, overdue, plan):
    assert takeover_plan(DEAD_IDS, reaper="r", room=room, sessions=listing, overdue=overdue) == plan


def test_a_plan_gives_every_id_exactly_one_taker_even_one_the_listing_missed():
    plan = takeover_plan(
        DEAD_IDS, reaper="r", room=150, sessions=_peers(("x", 350, 500)), overdue=NOBODY_OVERDUE
    )
    assert plan == (("r", "c149"), ("x", None))
    assert planned_taker("a-missed", plan) == "r"  # below every id
    assert planned_taker("c149", plan) == "r"
    assert planned_taker("c1495", plan) == "x"
    assert planned_taker("zzz", plan) == "x"
    assert planned_taker("c2", (("r", "c1"), ("x", "c5"))) == "x"
    assert planned_taker("c9", (("r", "c1"), ("x", "c5"))) == "x"  # a plan without an open end
    assert takeover_plan([], reaper="r", room=0, sessions=[], overdue=NOBODY_OVERDUE) == (
        ("r", None),
    )


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
    plan = takeover_plan(ids, reaper="r", room=room, sessions=listing, overdue=NOBODY_OVERDUE)
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
        w: planned_share(
            DEAD_IDS, me=w, takers=plan, sessions=gone, free=500, overdue=NOBODY_OVERDUE
        )
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
        w: set(
            planned_share(
                DEAD_IDS, me=w, takers=plan, sessions=two, free=500, overdue=NOBODY_OVERDUE
            )
        )
        for w in ("r", "x", "z")
    }
    assert split["r"] - set(DEAD_IDS[250:]) == set(DEAD_IDS[:150])
    assert split["x"] - set(DEAD_IDS[250:]) == set(DEAD_IDS[150:250])
    assert split["r"] | split["x"] | split["z"] == set(DEAD_IDS)
    assert sum(len(part) for part in split.values()) == 350
    assert all(split[w] & set(DEAD_IDS[250:]) for w in ("r", "x", "z"))
    # No more than there is room for, from the front of the share.
    assert (
        planned_share(DEAD_IDS, me="x", takers=plan, sessions=gone, free=3, overdue=NOBODY_OVERDUE)
        == (DEAD_IDS[:3])
    )
    assert (
        planned_share(DEAD_IDS, me="x", takers=plan, sessions=gone, free=0, overdue=NOBODY_OVERDUE)
        == []
    )


def test_the_part_of_a_taker_seen_overdue_goes_to_the_others_by_rendezvous():
    """x is ALIVE as listed, with room, but this worker has seen it unrenewed for a
    lease: its part is not left to it, and goes where :func:`open_taker` says."""
    plan = (("r", "c149"), ("x", "c249"), ("y", None))
    listing = [_live("r", 200, 500), _live("x", 0, 500), _live("y", 0, 500)]
    overdue = {("x", 1)}
    shares = {
        w: planned_share(DEAD_IDS, me=w, takers=plan, sessions=listing, free=500, overdue=overdue)
        for w in ("r", "y")
    }
    xs = DEAD_IDS[150:250]
    assert set(shares["r"]) - set(xs) == set(DEAD_IDS[:150])
    assert set(shares["y"]) - set(xs) == set(DEAD_IDS[250:])
    assert set(shares["r"]) | set(shares["y"]) == set(DEAD_IDS)
    assert not set(shares["r"]) & set(shares["y"])
    for cid in xs:
        taker = open_taker(cid, listing, overdue)
        assert cid in shares[taker] if taker in shares else taker is None
    # Not overdue, x keeps its part, and nobody else touches it.
    kept = planned_share(
        DEAD_IDS, me="y", takers=plan, sessions=listing, free=500, overdue=NOBODY_OVERDUE
    )
    assert kept == DEAD_IDS[250:]


def _sweep(
    dead: SessionItem,
    me: str,
    listing: list[SessionItem],
    free: int,
    dead_for: float,
    ids: list[str] = DEAD_IDS,
) -> list[str]:
    return sweep_share(
        dead,
        ids,
        me=me,
        sessions=listing,
        free=free,
        dead_for=dead_for,
        overdue=NOBODY_OVERDUE,
        timing=TIMING,
    )


def test_four_leases_after_the_reap_anyone_takes_anything_even_with_a_plan():
    plan = (("r", "c149"), ("x", None))
    listing = _peers(("r", 350, 500), ("x", 350, 500))
    fallback = REAPER_FALLBACK_LEASES * TIMING.lease
    assert _sweep(_dead(plan), "y", listing, 5, fallback) == DEAD_IDS[::-1][:5]
    assert _sweep(_dead(plan), "y", listing, 5, fallback - 0.001) == []
    # Seen DEAD for four leases by this worker: whatever the reap's wall-clock time says.
    assert (
        _sweep(_dead(plan, reaped_at=NOW + 3_600_000), "y", listing, 5, fallback)
        == (DEAD_IDS[::-1][:5])
    )
    assert _sweep(_dead(plan, reaped_at=0), "y", listing, 5, 0.0) == []


def test_without_a_plan_the_rules_before_it_apply():
    """A reap that found nothing to plan (or a retire) records no plan: the reaper
    from the front, the others only the excess beyond its published room, from the
    back (and :func:`may_sweep` holds them back for the grace)."""
    listing = _peers(("r", 350, 500))
    old = _dead(None)
    assert _sweep(old, "r", listing, 150, 0.0) == DEAD_IDS[:150]
    assert _sweep(old, "x", listing, 500, 0.0) == DEAD_IDS[150:][::-1]
    assert _sweep(old, "x", [], 3, 0.0) == DEAD_IDS[::-1][:3]


@pytest.mark.parametrize(
    ("state", "beat", "protocol", "is_foreign"),
    [
        (schema.ALIVE, None, None, True),  # a protocol-1 worker's live session
        (schema.ALIVE, 4, None, False),  # a beat: ours, its protocol attribute lost
        (schema.ALIVE, 4, 2, False),
        (schema.ALIVE, 4, 3, True),  # a later protocol
        (None, None, None, False),  # damaged (no state either): reaped once lapsed
        (None, None, 1, True),
        (schema.DEAD, None, None, False),  # no longer live: nothing to share
    ],
)
def test_which_sessions_are_of_another_protocol(state, beat, protocol, is_foreign):
    session = SessionItem("w", 1, state, 0, beat=beat, protocol=protocol)
    assert session_rules.foreign([session]) == ([session] if is_foreign else [])
