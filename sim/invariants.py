"""The promises, checked as the simulated fleet runs.

1. Never two workers handling one connection at overlapping times, and no delivery
   by an epoch older than one that has delivered. A call that was in flight when its
   process was paused is the one exception no lease can prevent: the process cannot
   cut it while it is stopped, and the handler may go on for a moment when it resumes
   (what the epoch on each delivery is for, docs/DESIGN.md §3.8). Such overlaps are
   counted as ``zombie_overlaps``, not violations; a call *started* by a superseded
   holder, paused or not, is one.
2. For a resumable stream, no seq is skipped: a handler call may start at a seq only
   when every seq before it was handled (a call that returned) by someone.
3. No STARTED connection goes dark (no handler call) for longer than the crash
   failover bound (plus the feed's interval between messages), counted from the later
   of its last delivery and the heal of the last fault that excuses darkness: a crash,
   pause, partition or drain of a worker, errors or throttling of DynamoDB, index lag
   and stale reads, trouble with that connection's upstream or handler, or its stop.
   One worker's slow DynamoDB excuses nothing for the connections that worker runs
   (docs/DESIGN.md §3.11); it excuses the others' (a slow worker the reap's plan
   names as a taker leaves its part to the fallback, §3.2).
4. A stop ends delivery within the stop bound, unless a fault (any, slow DynamoDB
   included) disturbed the fleet in between.
5. No unhandled exception, no capacity slot leaked, no worker exits with an error.
6. A new hold redelivers only what its predecessor could not checkpoint: a seq handled
   under one epoch and delivered again under another was handled at most a checkpoint
   interval (and a margin) before its handler's process was disturbed (a fault aimed
   at it, a pause, a crash, or stale reads everywhere). An undisturbed holder's
   checkpoint page covers it, and a release writes the final checkpoint, answered or
   not (docs/DESIGN.md §3.3).

Each violation carries the simulated time and the trail of events before it.
"""

from __future__ import annotations

import hashlib
from collections import deque
from collections.abc import Collection
from dataclasses import dataclass, field

from sim.failover import FailoverWatch


@dataclass(frozen=True)
class Violation:
    invariant: int
    at: float
    what: str
    trail: tuple[str, ...]

    def render(self, seed: int) -> str:
        lines = [f"seed {seed}: invariant {self.invariant} at t={self.at:.3f}: {self.what}"]
        lines += [f"    {line}" for line in self.trail]
        return "\n".join(lines)


@dataclass
class _Call:
    worker: str
    epoch: int
    stream: str
    first: int
    seq: int
    started: float
    uncancellable: bool = False
    """The handler ignores cancellation: no fence can end this call."""


@dataclass
class _Connection:
    max_epoch: int = 0
    handled: dict[str, int] = field(default_factory=dict)
    """By stream, the highest seq up to which every seq was handled."""
    calls: dict[str, _Call] = field(default_factory=dict)
    """Handler calls in flight, by worker."""
    started: bool = False
    dark_since: float | None = None
    """While STARTED: its last delivery, or its start."""
    stopped_at: float | None = None
    asked_at: float = float("-inf")
    """When the router last started or stopped it."""
    last_delivery: float | None = None
    last_worker: str | None = None
    streamed_by: str | None = None
    """The worker that last opened its upstream stream."""
    stuck_in: set[str] = field(default_factory=set)
    """Workers that had a call of it that ignored cancellation: their runner cannot
    end (nor close its socket) before the handler returns, which no fence can force."""
    deliveries: int = 0
    first_handled: dict[str, dict[int, tuple[float, str, int]]] = field(default_factory=dict)
    """By stream and seq: when its first handling call started, the worker, the epoch."""


class Monitor:
    TRAIL = 40

    def __init__(
        self,
        clock: object,
        *,
        stop_bound: float,
        dark_bound: float,
        checkpoint_bound: float,
        failover_bound: float,
    ) -> None:
        self._clock = clock
        self.failovers = FailoverWatch(failover_bound)
        self._stop_bound = stop_bound
        self._dark_bound = dark_bound
        self._checkpoint_bound = checkpoint_bound
        self._worker_faults: dict[str | None, list[tuple[float, float]]] = {}
        self._crashed_at: dict[str, float] = {}
        self._excuses: list[tuple[float, float, str | None, frozenset[str], str | None]] = []
        self.short_since: float | None = None
        """Since when the fleet has had no room for every connection (None: it has):
        an excuse still open."""
        self._disturbances: list[tuple[float, float]] = []
        self._pauses: dict[str, list[tuple[float, float]]] = {}
        self.zombie_overlaps = 0
        self._connections: dict[str, _Connection] = {}
        self._trail: deque[str] = deque(maxlen=self.TRAIL)
        self._trails: dict[str, deque[str]] = {}
        self._hash = hashlib.sha256()
        self.violations: list[Violation] = []
        self.deliveries = 0

    def now(self) -> float:
        return self._clock.now  # type: ignore[attr-defined,no-any-return]

    def event(self, text: str, connection_id: str | None = None) -> None:
        """An event of the run: of one connection, or of the fleet."""
        line = f"{self.now():10.3f} {text}"
        self._hash.update(line.encode())
        self._keep(line, connection_id)

    def _keep(self, line: str, connection_id: str | None) -> None:
        if connection_id is None:
            self._trail.append(line)
            return
        trail = self._trails.get(connection_id)
        if trail is None:
            trail = self._trails[connection_id] = deque(maxlen=self.TRAIL)
        trail.append(line)

    def trail(self, connection_id: str | None) -> tuple[str, ...]:
        """The fleet's last events and the connection's, in order of time."""
        lines = list(self._trail) + list(self._trails.get(connection_id or "", ()))
        return tuple(sorted(lines, key=lambda line: float(line.split(None, 1)[0]))[-self.TRAIL :])

    def note(self, text: str, connection_id: str | None = None) -> None:
        """A line for the trail only (log lines: kept out of the trace hash)."""
        self._keep(f"{self.now():10.3f} {text}", connection_id)

    def trace_hash(self) -> str:
        return self._hash.hexdigest()[:16]

    def violated(self, invariant: int, what: str, connection_id: str | None = None) -> None:
        self.event(f"VIOLATION {invariant}: {what}")
        trail = self.trail(connection_id)
        self.violations.append(Violation(invariant, self.now(), what, trail))

    def _violated(self, connection_id: str, invariant: int, what: str) -> None:
        self.violated(invariant, what, connection_id)

    def _connection(self, connection_id: str) -> _Connection:
        found = self._connections.get(connection_id)
        if found is None:
            found = self._connections[connection_id] = _Connection()
        return found

    # The router's view.

    def excuse(
        self,
        start: float,
        end: float,
        connection_id: str | None = None,
        *,
        but: frozenset[str] = frozenset(),
        slow: str | None = None,
    ) -> None:
        """Darkness from ``start`` to ``end`` (of one connection, or of every one but
        those named in ``but``) is the fault's, not the fleet's. ``slow``: the worker
        whose slowness the excuse is for; a gap that worker ends with its own delivery
        is not excused (a connection handed to a slow worker must run there in time)."""
        self._excuses.append((start, end, connection_id, but, slow))

    def streamed_by(self, worker: str) -> list[str]:
        """The started connections whose stream ``worker`` opened last."""
        return sorted(
            cid for cid, c in self._connections.items() if c.started and c.streamed_by == worker
        )

    def crashed(self, worker: str, room: int = 0, given_back: Collection[str] = ()) -> None:
        """A dead process handles nothing: its calls in flight end with it. What it
        ran must run elsewhere within the failover bound (invariant 7), when the
        survivors had ``room`` free slots for it. ``given_back``: connections it still
        streamed but no longer held in the table (a release landed, a hand-off's
        notice not yet written): no reap moves them, so the crash bound is not theirs;
        a hint or the sweep of free connections is (invariant 3 watches them)."""
        running = [cid for cid in self.streamed_by(worker) if cid not in given_back]
        self.failovers.crashed(worker, self.now(), running, room)
        self._crashed_at.setdefault(worker, self.now())
        for connection in self._connections.values():
            connection.calls.pop(worker, None)
        self.event(f"{worker} crashed")

    def paused(self, worker: str, start: float, end: float) -> None:
        self._pauses.setdefault(worker, []).append((start, end))

    def _paused_since(self, worker: str, since: float) -> bool:
        return any(end > since for _, end in self._pauses.get(worker, ()))

    def worker_disturbed(self, worker: str | None, start: float, end: float) -> None:
        """A fault aimed at one process (None: at every one) from ``start`` to ``end``:
        its checkpoints may lag (invariant 6)."""
        self._worker_faults.setdefault(worker, []).append((start, end))

    def _undisturbed(self, worker: str, start: float, end: float) -> bool:
        crashed = self._crashed_at.get(worker)
        if crashed is not None and crashed <= end:
            return False
        windows = [
            *self._worker_faults.get(worker, ()),
            *self._worker_faults.get(None, ()),
            *self._pauses.get(worker, ()),
        ]
        return not any(a <= end and b >= start for a, b in windows)

    def disturbance(self, start: float, end: float) -> None:
        """A fault from ``start`` to ``end``: the stop bound does not hold across it."""
        self._disturbances.append((start, end))

    def starting(self, connection_id: str) -> None:
        """A start is on its way: from now on the connection may run again."""
        connection = self._connection(connection_id)
        connection.stopped_at, connection.asked_at = None, self.now()

    def started(self, connection_id: str) -> None:
        connection = self._connection(connection_id)
        if not connection.started:
            connection.dark_since = self.now()
        connection.started, connection.stopped_at = True, None
        self.event(f"start {connection_id}", connection_id)

    def stopped(self, connection_id: str) -> None:
        connection = self._connection(connection_id)
        if connection.started and connection.dark_since is not None:
            # Dark until its stop: it should have been running all the while.
            self._check_dark(connection_id, connection.dark_since, self.now())
        connection.started, connection.stopped_at = False, self.now()
        connection.asked_at = self.now()
        connection.dark_since = None
        self.event(f"stop {connection_id}", connection_id)

    # The handlers' view.

    def call_started(
        self, worker: str, connection_id: str, epoch: int, stream: str, first: int, seq: int
    ) -> None:
        """A handler call of seqs ``first`` to ``seq`` (one message: both the same)."""
        now = self.now()
        connection = self._connection(connection_id)
        self.deliveries += seq - first + 1
        connection.deliveries += seq - first + 1
        connection.last_delivery = now
        if connection.started and connection.dark_since is not None:
            self._check_dark(connection_id, connection.dark_since, now, worker)
            connection.dark_since = now
        connection.last_worker = worker
        line = f"{now:10.3f} {worker} calls epoch {epoch} seq {first}..{seq}"
        self._hash.update(line.encode())
        self._keep(line, connection_id)
        for other, call in connection.calls.items():
            if other != worker and self._paused_since(other, call.started):
                self.zombie_overlaps += 1
                self._keep(f"{now:10.3f} zombie: {other} paused in a call", connection_id)
            elif other != worker and call.uncancellable:
                self.zombie_overlaps += 1
                self._keep(
                    f"{now:10.3f} zombie: {other} in a call that ignores cancellation",
                    connection_id,
                )
            elif other != worker:
                self._violated(
                    connection_id,
                    1,
                    f"{connection_id}: {worker} (epoch {epoch}, seq {seq}) while {other}"
                    f" (epoch {call.epoch}, seq {call.seq}) is in a call since"
                    f" t={call.started:.3f}",
                )
        if epoch < connection.max_epoch:
            self._violated(
                connection_id,
                1,
                f"{connection_id}: {worker} delivered seq {seq} under epoch {epoch} after"
                f" epoch {connection.max_epoch} delivered",
            )
        connection.max_epoch = max(connection.max_epoch, epoch)
        if stream:
            handled = connection.handled.get(stream, 0)
            if first > handled + 1:
                self._violated(
                    connection_id,
                    2,
                    f"{connection_id} ({stream}): {worker} called with seq {first} when"
                    f" only seqs up to {handled} were handled",
                )
            elif first <= handled:
                self._check_redelivery(connection_id, worker, epoch, stream, first, handled)
        stopped = connection.stopped_at
        if (
            stopped is not None
            and now > stopped + self._stop_bound
            and not any(start <= now and end >= stopped for start, end in self._disturbances)
        ):
            self._violated(
                connection_id,
                4,
                f"{connection_id}: {worker} delivered seq {seq} {now - stopped:.3f} s"
                " after its stop",
            )
        connection.calls[worker] = _Call(worker, epoch, stream, first, seq, now)

    def ignores_cancellation(self, worker: str, connection_id: str) -> None:
        """The call in flight will not end when cancelled (a handler's bug the fleet
        cannot fence: only the epoch on each delivery can, docs/DESIGN.md §3.8)."""
        connection = self._connection(connection_id)
        call = connection.calls.get(worker)
        if call is not None:
            call.uncancellable = True
            connection.stuck_in.add(worker)

    def run_by(self, worker: str) -> list[str]:
        """The STARTED connections ``worker`` delivered last, sorted."""
        return sorted(
            cid for cid, c in self._connections.items() if c.started and c.last_worker == worker
        )

    def calls_in_flight(self, worker: str) -> int:
        return sum(1 for c in self._connections.values() if worker in c.calls)

    def _check_redelivery(
        self, connection_id: str, worker: str, epoch: int, stream: str, first: int, handled: int
    ) -> None:
        seen = self._connection(connection_id).first_handled.get(stream, {}).get(first)
        if seen is None:
            return
        handled_at, by, by_epoch = seen
        covered_by = handled_at + self._checkpoint_bound
        if by_epoch == epoch or self.now() <= covered_by:
            return  # the same hold retrying, or too recent for any checkpoint
        if self._undisturbed(by, handled_at, covered_by):
            self._violated(
                connection_id,
                6,
                f"{connection_id} ({stream}): {worker} (epoch {epoch}) redelivers seqs"
                f" {first}..{handled}; {by} (epoch {by_epoch}) handled seq {first} at"
                f" t={handled_at:.3f} and was undisturbed for a checkpoint interval after",
            )

    def call_ended(self, worker: str, connection_id: str, *, returned: bool) -> None:
        connection = self._connection(connection_id)
        call = connection.calls.pop(worker, None)
        if call is None or not returned or not call.stream:
            return
        seen = connection.first_handled.setdefault(call.stream, {})
        for seq in range(call.first, call.seq + 1):
            seen.setdefault(seq, (call.started, worker, call.epoch))
        if call.first <= connection.handled.get(call.stream, 0) + 1:
            connection.handled[call.stream] = max(connection.handled.get(call.stream, 0), call.seq)

    # At the end.

    def _check_dark(
        self, connection_id: str, since: float, until: float, ended_by: str | None = None
    ) -> None:
        """``ended_by``: the worker whose delivery ends the gap (None: not ended)."""
        healed = since
        if self.short_since is not None and self.short_since <= until:
            healed = until  # the fleet is still short of room: the excuse is open
        for start, end, about, but, slow in self._excuses:
            if (
                start <= until
                and end >= since
                and about in (None, connection_id)
                and connection_id not in but
                and (slow is None or slow != ended_by)
            ):
                healed = max(healed, end)
        if until - healed > self._dark_bound:
            self._violated(
                connection_id,
                3,
                f"{connection_id}: STARTED and dark from t={since:.3f} to t={until:.3f}"
                f" ({until - healed:.3f} s after the last excusing fault healed;"
                f" bound {self._dark_bound:.3f} s)",
            )

    def streaming(self, connection_id: str, worker: str) -> None:
        """``worker``'s runner has the connection's upstream stream open."""
        self._connection(connection_id).streamed_by = worker
        self.failovers.streaming(connection_id, worker, self.now())

    def stream_closed(self, connection_id: str, worker: str) -> None:
        """``worker``'s upstream stream of the connection ended: a stop must have
        closed it within the stop bound (invariant 4, judged by the socket itself, so
        that a slow stop is seen however rarely the feed sends, and excused only by
        what disturbed that worker)."""
        now = self.now()
        connection = self._connection(connection_id)
        stopped = connection.stopped_at
        if worker in connection.stuck_in:
            connection.stuck_in.discard(worker)
            return
        # Only what touched that worker (or every worker) excuses a late close: a fault
        # elsewhere in the fleet does not slow this worker's reading of its notices.
        if (
            stopped is not None
            and now > stopped + self._stop_bound
            and self._undisturbed(worker, stopped, now)
        ):
            self._violated(
                connection_id,
                4,
                f"{connection_id}: {worker} closed its upstream {now - stopped:.3f} s after"
                " its stop",
            )

    def _window_disturbed(self, connection_id: str, start: float, end: float) -> bool:
        """Whether anything but the crash at ``start`` touched the fleet, or this
        connection, from ``start`` to ``end`` (invariant 7's conditions)."""

        def other(s: float, e: float) -> bool:
            return s <= end and e >= start and not (s == e == start)

        if self._connection(connection_id).asked_at >= start - 1.0:
            return True
        if any(other(s, e) for s, e in self._disturbances):
            return True
        if any(other(s, e) for spans in self._pauses.values() for s, e in spans):
            return True
        return any(
            other(s, e) for s, e, about, *_ in self._excuses if about in (None, connection_id)
        )

    def check_failovers(self) -> None:
        """Invariant 7 for every crash whose window has passed."""
        for cid, worker, at, took in self.failovers.late(self.now(), self._window_disturbed):
            self._violated(
                cid,
                7,
                f"{cid}: {worker} crashed at t={at:.3f}; run again {took:.3f} s later"
                f" (bound {self.failovers.bound:.3f} s)",
            )

    def check_streaming(self, short_since: float | None = None) -> None:
        """Invariant 3 at the end of the run, for connections dark until now (an
        excuse from ``short_since`` on: the fleet is still short of room)."""
        if short_since is not None:
            self.excuse(short_since, self.now())
        for connection_id, connection in sorted(self._connections.items()):
            if connection.started and connection.dark_since is not None:
                self._check_dark(connection_id, connection.dark_since, self.now())
