"""Who takes over a dead session's connections, and when (worker/reconciler.py,
docs/DESIGN.md §3.2), with several workers' reconcilers on one table held in memory:
the reap is the real rule's write applied to the session item, a takeover moves a
connection only while the dead session still owns it (a conditional write's one
winner), and every attempt that finds it gone is counted as refused."""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass, field, replace
from types import SimpleNamespace
from typing import Any, cast

import pytest

from tests.unit.expressions import Item, attempt
from worker.capacity import Capacity
from worker.reconciler import Reconciler
from wsfleet import schema, session_rules
from wsfleet.item import ConnectionItem, to_attribute
from wsfleet.session_rules import SessionItem
from wsfleet.session_watch import WAKE_MARGIN
from wsfleet.timing import LeaseTiming

pytestmark = pytest.mark.timeout(10)

TIMING = LeaseTiming.from_lease()  # lease 2.5 s, heartbeat and reconcile 0.6 s
T0 = 1_000_000
DEAD = ("dead", 1)
MAX = 500


@dataclass
class Table:
    now_ms: int = T0
    """Every worker's wall clock (recorded in the items, decides nothing)."""
    now: float = 0.0
    """Every worker's monotonic clock, on which the sessions are observed."""
    sessions: dict[tuple[str, int], Item] = field(default_factory=dict)
    owners: dict[str, tuple[str, int]] = field(default_factory=dict)
    silent: set[tuple[str, int]] = field(default_factory=set)
    """Sessions whose worker no longer renews."""
    refused: int = 0

    def add_session(self, worker: str, gen: int, *, connections: int) -> None:
        self.sessions[(worker, gen)] = {
            k: to_attribute(v)
            for k, v in {
                **schema.session_key(worker, gen),
                "state": schema.ALIVE,
                "expires_at_ms": self.now_ms + TIMING.lease_ms,
                "started_at_ms": 0,
                "connections": connections,
                "capacity": MAX,
                "beat": 0,
                "proto": schema.SESSION_PROTOCOL_NOW,
            }.items()
        }

    def renew(self) -> None:
        """Every live session that still renews has renewed since the last listing."""
        for key, raw in self.sessions.items():
            if key not in self.silent and raw["state"] == {"S": schema.ALIVE}:
                raw["beat"] = to_attribute(int(raw["beat"]["N"]) + 1)

    def advance(self, seconds: float) -> None:
        self.now += seconds
        self.now_ms += round(seconds * 1000)

    def session(self, key: tuple[str, int]) -> SessionItem:
        return SessionItem.from_dynamodb(self.sessions[key])

    def owned_by(self, worker: str, gen: int) -> list[ConnectionItem]:
        return [
            ConnectionItem(
                connection_id=cid,
                desired_state=schema.STARTED,
                ws_url="wss://feed",
                lease_owner=worker,
                owner_session_gen=gen,
            )
            for cid, owner in sorted(self.owners.items())
            if owner == (worker, gen)
        ]


class Sessions:
    def __init__(self, table: Table) -> None:
        self._table = table

    def list_sessions(self, report: Any = None) -> list[SessionItem]:
        return [SessionItem.from_dynamodb(raw) for raw in self._table.sessions.values()]

    def reap(self, session: SessionItem, reaper: str, now_ms: int, *plan: Any) -> bool:
        """As SessionStore.reap: the rule's conditional write on the stored item."""
        key = session.key
        after = attempt(
            session_rules.reap_update(reaper, now_ms, session.beat, *plan),
            self._table.sessions[key],
        )
        if after is None:
            return False
        self._table.sessions[key] = after
        return True

    def get_session(self, worker: str, gen: int) -> SessionItem | None:
        raw = self._table.sessions.get((worker, gen))
        return None if raw is None else SessionItem.from_dynamodb(raw)

    def read_page(self, worker: str, gen: int, **_: Any) -> None:
        return None

    def forget(self, session: SessionItem) -> bool:
        return True


class Owner:
    def __init__(self, table: Table, worker_id: str, capacity: Capacity) -> None:
        self._table = table
        self.worker_id = worker_id
        self.session_gen = 1
        self._capacity = capacity
        self.taken: list[str] = []
        self.hinted: list[str] = []

    async def send_reassign(self, connection_id: str) -> None:
        self.hinted.append(connection_id)

    def takeover_room(self, free: int) -> int:
        return free

    async def take_over_many(
        self, seen: list[ConnectionItem], session: SessionItem, page: Any
    ) -> list[str]:
        taken = []
        for item in seen:
            if not self._capacity.try_reserve():
                break
            if self._table.owners.get(item.connection_id) != session.key:
                self._table.refused += 1  # another taker won it: a refused write
                await self._capacity.release()
                continue
            self._table.owners[item.connection_id] = (self.worker_id, 1)
            taken.append(item.connection_id)
        self.taken += taken
        return taken


def worker(table: Table, worker_id: str, used: int) -> tuple[Reconciler, Owner]:
    capacity = Capacity(MAX)
    for _ in range(used):
        capacity.try_reserve()
    owner = Owner(table, worker_id, capacity)
    store = SimpleNamespace(
        timing=TIMING,
        takeover_conflicts=0,
        owned_by=table.owned_by,
        clear_dead_owner=lambda item, page, now: True,
    )
    reconciler = Reconciler(
        store=cast(Any, store),
        sessions=cast(Any, Sessions(table)),
        owner=cast(Any, owner),
        capacity=capacity,
        balancer=cast(Any, SimpleNamespace(enabled=False, observe=lambda *args: None)),
        metrics=cast(Any, SimpleNamespace(count=lambda *args: None)),
        wall_ms=lambda: table.now_ms,
        rng=random.Random(1),
        clock=lambda: table.now,
    )
    return reconciler, owner


def fleet(
    dead_holds: int, loads: dict[str, int]
) -> tuple[Table, dict[str, tuple[Reconciler, Owner]]]:
    """A session holding ``dead_holds`` STARTED connections, and live workers at
    ``loads`` of MAX (published and real), which have all watched the session not
    renew for ``expire_after``: it has just lapsed."""
    table = Table()
    table.add_session(*DEAD, connections=dead_holds)
    table.silent.add(DEAD)
    for n in range(dead_holds):
        table.owners[f"c{n:04}"] = DEAD
    workers = {}
    for name, load in loads.items():
        table.add_session(name, 1, connections=load)
        workers[name] = worker(table, name, load)
    watch(table, workers)
    return table, workers


def watch(table: Table, workers: dict[str, tuple[Reconciler, Owner]]) -> None:
    """Every worker lists the sessions now, then watches them for ``expire_after``."""
    listed = Sessions(table).list_sessions()
    for reconciler, _ in workers.values():
        reconciler.watch.observe(listed, table.now)
    table.advance(TIMING.expire_after)


def sweep(workers: dict[str, tuple[Reconciler, Owner]], name: str) -> list[str]:
    """One pass of ``name``'s session sweep, the live sessions renewed since the last."""
    table = cast(Sessions, workers[name][0]._sessions)._table
    table.renew()
    taken, _ = asyncio.run(workers[name][0].sweep_sessions())
    return taken


def test_the_excess_beyond_the_reapers_room_is_taken_at_once_by_the_others_without_racing():
    """Four workers at 350 of 500, one dies: the reaper has room for 150 of its 350.
    The two others sweep right after the reap, well within a heartbeat: each takes a
    part at once, the parts do not overlap, no write is refused, and the three passes
    together take everything, each worker ending at its fair share (466 or 467)."""
    table, workers = fleet(350, {"a": 350, "b": 350, "c": 350})
    reaper = sweep(workers, "a")
    assert table.session(DEAD).state == schema.DEAD
    assert len(reaper) == 117
    table.advance(0.1)
    b = sweep(workers, "b")
    table.advance(0.1)
    c = sweep(workers, "c")
    assert b, "b took nothing of the excess in its pass right after the reap"
    assert c, "c took nothing of the excess in its pass right after the reap"
    assert table.refused == 0
    assert not set(reaper) & set(b)
    assert not set(reaper) & set(c)
    assert not set(b) & set(c)
    assert set(reaper) | set(b) | set(c) == {f"c{n:04}" for n in range(350)}
    assert sorted(reaper) == [f"c{n:04}" for n in range(117)]  # the front of the sorted ids
    assert sorted(len(taken) for taken in (reaper, b, c)) == [116, 117, 117]


def test_a_worker_that_loses_the_reap_follows_the_winners_plan_in_the_same_pass():
    """Two workers see the session lapsed in the same moment; a's reap lands first, b's
    is refused: b reads the session back and takes its part in that same pass."""
    table, workers = fleet(350, {"a": 350, "b": 300})
    sessions = cast(Sessions, workers["b"][0]._sessions)
    plan = session_rules.takeover_plan(
        [f"c{n:04}" for n in range(350)],
        reaper="a",
        room=150,
        sessions=sessions.list_sessions(),
        overdue=frozenset({DEAD}),
    )
    refused = sessions.reap

    def reap_after_a(session: SessionItem, reaper: str, now_ms: int, *rest: Any) -> bool:
        assert Sessions(table).reap(session, "a", now_ms, plan)  # a's reap lands first
        return refused(session, reaper, now_ms, *rest)

    sessions.reap = reap_after_a  # type: ignore[method-assign]
    b = sweep(workers, "b")
    assert table.session(DEAD).reaped_by == "a"
    assert sorted(b) == [f"c{n:04}" for n in range(150, 350)]  # the excess: b's part
    assert table.refused == 0


def test_a_planned_taker_that_died_leaves_its_part_to_the_others():
    """a reaps and plans 117, 117 and 116 for itself, b and c; c dies right after.
    b takes its own part at once; once b has seen c go unrenewed for a lease, it takes
    what rendezvous hashing gives it of c's part; the rest of c's would be a's, but a
    has filled up meanwhile, and once its renew says so, b takes that too."""
    table, workers = fleet(350, {"a": 250, "b": 250, "c": 250})
    reaper = sweep(workers, "a")
    assert len(reaper) == 117
    table.silent.add(("c", 1))  # c died
    table.advance(0.1)
    b = sweep(workers, "b")
    plan = table.session(DEAD).takers
    assert plan is not None
    planned = {
        w: [cid for cid in sorted(table.owners) if session_rules.planned_taker(cid, plan) == w]
        for w in "abc"
    }
    assert [len(planned[w]) for w in "abc"] == [117, 117, 116]
    assert sorted(b) == planned["b"]  # c not seen unrenewed for a lease yet
    table.advance(TIMING.lease + 0.01)
    b += sweep(workers, "b")
    assert set(planned["b"]) < set(b) < set(planned["b"]) | set(planned["c"])
    a_slots = workers["a"][0]._capacity
    while a_slots.try_reserve():
        pass  # a fills up with new starts
    table.advance(0.05)
    assert sweep(workers, "a") == []  # no free slot
    table.sessions[("a", 1)] |= {"connections": to_attribute(MAX)}  # its next renew
    table.advance(0.55)
    b += sweep(workers, "b")
    assert sorted(b) == sorted(planned["b"] + planned["c"])
    assert not table.owned_by(*DEAD)
    assert table.refused == 0


def test_a_reap_that_recorded_no_plan_keeps_the_others_waiting_a_heartbeat():
    """A reap without a plan in the item: the others wait until they have seen it DEAD
    for the grace (on their own clock: the reap's wall time decides nothing), then
    take only the excess beyond the reaper's published room, from the back."""
    table, workers = fleet(350, {"a": 350, "b": 350})
    old = table.session(DEAD)
    raw = attempt(session_rules.reap_update("old", T0, old.beat), table.sessions[DEAD])
    assert raw is not None
    table.sessions[DEAD] = raw
    table.add_session("old", 1, connections=350)
    assert table.session(DEAD) == replace(old, state=schema.DEAD, reaped_at_ms=T0, reaped_by="old")
    table.now_ms += 3_600_000  # b's wall clock an hour ahead: nothing changes
    table.advance(0.1)
    assert sweep(workers, "b") == []  # first seen DEAD now
    table.advance(TIMING.heartbeat - 0.01)
    assert sweep(workers, "b") == []
    table.advance(0.02)
    b = sweep(workers, "b")
    assert sorted(b) == [f"c{n:04}" for n in range(200, 350)]  # 150 of the 200 beyond its room


def test_a_pass_comes_as_soon_as_a_listed_session_may_be_reaped():
    """Every worker that listed the session before it lapsed passes again as soon as
    the reap may pass, not at its interval: the reaper and the takers of the other
    parts all go within a few milliseconds of the lapse."""
    table = Table()
    table.add_session(*DEAD, connections=10)
    for n in range(10):
        table.owners[f"c{n:04}"] = DEAD
    table.add_session("a", 1, connections=0)
    reconciler, _ = worker(table, "a", 0)
    workers = {"a": (reconciler, None)}
    assert reconciler.next_pass_in(0.6) == 0.6  # nothing listed yet
    sweep(workers, "a")  # its last renew seen now
    table.silent.add(DEAD)
    table.advance(TIMING.expire_after - 0.4)
    sweep(workers, "a")
    wake = 0.4 + WAKE_MARGIN
    assert reconciler.next_pass_in(0.72) == pytest.approx(wake)
    assert reconciler.next_pass_in(0.3) == 0.3  # the interval comes first
    table.advance(wake)
    taken = sweep(workers, "a")
    assert table.session(DEAD).state == schema.DEAD
    assert len(taken) == 10
    # The dead session is no longer ALIVE: the interval again.
    sweep(workers, "a")
    assert reconciler.next_pass_in(0.6) == 0.6


def test_connections_handed_to_a_session_that_died_before_taking_them_are_hinted_once():
    """A balance move (offer) and a drain reach a receiver that crashes before its next
    renew returns them: released, they wait in the unowned index. The sweep of the dead
    receiver hints each on the start queue once (found by the simulator, seed 125: 12 s
    dark until a sweep by a worker below its share took them)."""
    table, workers = fleet(0, {"a": 10})
    key = DEAD
    tokens = [
        session_rules.notice_token("m1", session_rules.OFFER, T0 - 2_000, "aa"),
        session_rules.notice_token("m2", session_rules.DRAIN, T0 - 2_000, "bb"),
        session_rules.notice_token("s1", "stop", T0 - 2_000, "cc"),
    ]
    table.sessions[key]["notices"] = {"SS": tokens}
    reconciler, owner = workers["a"]
    asyncio.run(reconciler.sweep_sessions())
    assert table.session(DEAD).state == schema.DEAD
    table.now_ms = T0 + 700
    asyncio.run(reconciler.sweep_sessions())
    assert owner.hinted == ["m1", "m2"]


def test_a_live_session_of_another_protocol_is_never_reaped():
    """A protocol-1 session (no beat, no protocol) renews by its writer's wall clock:
    its beat never changes, so a protocol-2 worker would reap it while it runs. It is
    left alone, and counted once."""
    table, workers = fleet(3, {"a": 0})
    for attribute in ("beat", "proto"):
        del table.sessions[DEAD][attribute]
    counted: list[str] = []
    reconciler, owner = workers["a"]
    reconciler._metrics = SimpleNamespace(count=lambda name, value=1: counted.append(name))
    reconciler.watch.observe(Sessions(table).list_sessions(), table.now)
    table.advance(10 * TIMING.expire_after)
    assert sweep(workers, "a") == []
    assert sweep(workers, "a") == []
    assert table.session(DEAD).alive
    assert owner.taken == []
    assert counted == ["ForeignSessions"]
