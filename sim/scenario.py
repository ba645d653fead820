"""A seed's run: the fleet's shape, its schedule of faults and router requests, the
quiet tail in which everything must recover, and the graceful end."""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sim import upstreams
from sim.dynamodb import SimDynamoDBClient
from sim.fleet import TABLE, Fleet, Shape, WorkerProcess, watched
from sim.invariants import Violation
from wsfleet import schema
from wsfleet.timing import DRIFT_RATE

START = 1_000.0
"""Virtual time at which a run starts (its wall clock: :data:`sim.fleet.EPOCH` + it)."""
NEW_STREAMS_IN_FAILOVER = 0.5
"""How often a crash brings a burst of restarts on new streams during its failover."""
TAIL = 30.0
"""Quiet seconds after the last fault heals: every STARTED connection streams again
within the crash failover bound of that."""


@dataclass(frozen=True)
class Result:
    seed: int
    shape: Shape
    violations: list[Violation]
    simulated_seconds: float
    deliveries: int
    zombie_overlaps: int
    faults: list[str]
    trace_hash: str


_ROUTER_REQUESTS = frozenset(
    {
        "start",
        "stop",
        "restart",
        "new stream",
        "burst stop",
        "burst start",
        "burst new streams",
        "stop a worker's connections",
    }
)


@dataclass
class Fault:
    at: float
    name: str
    act: Callable[[], None]


EXTRA_FAULTS = "SIM_EXTRA_FAULTS"
"""``1``: also draw the faults added since the draws were last fixed (a live worker's
session damaged by hand, then its crash, and a feed restarting its numbering, each in a
quarter of the seeds; a worker slow but alive, in half: ``python -m sim
--extra-faults``)."""


class Schedule:
    """Draws the faults of one run from its seed."""

    def __init__(self, fleet: Fleet, rng: random.Random) -> None:
        self.fleet = fleet
        self.rng = rng
        self.faults: list[Fault] = []
        self.spans: list[tuple[float, float]] = []
        """When each fault but the router's requests acts, and until it heals."""

    def add(
        self,
        at: float,
        name: str,
        act: Callable[[], None],
        *,
        heals: float = 0.0,
        excuse: float | None = None,
        connection_id: str | None = None,
    ) -> None:
        """``act`` at ``at``; the fault lasts ``heals`` seconds; darkness (of
        ``connection_id``, or of every connection) is excused until ``excuse`` seconds
        after ``at`` (None: not at all)."""
        self.faults.append(Fault(at, name, act))
        self.fleet.last_fault_end = max(self.fleet.last_fault_end, at + heals)
        if name not in _ROUTER_REQUESTS:
            self.fleet.monitor.disturbance(at, at + heals)
            self.spans.append((at, at + heals))
        if excuse is not None:
            self.fleet.monitor.excuse(at, at + excuse, connection_id)

    def draw(self, start: float, end: float, count: int) -> None:
        kinds = [
            (self.crash, 3),
            (self.sigterm, 2),
            (self.drain_while_partitioned, 1),
            (self.pause_in_shutdown, 1),
            (self.scale_out, 1),
            (self.scale_in, 1),
            (self.pause, 3),
            (self.pause_after_writes, 2),
            (self.brownout, 2),
            (self.slow_then_cut, 1),
            (self.partition, 2),
            (self.throttle, 1),
            (self.lost_replies, 2),
            (self.errors_after_apply, 1),
            (self.index_lag, 1),
            (self.stale_reads, 1),
            (self.feed_drop, 2),
            (self.feed_silence, 1),
            (self.feed_refusal, 1),
            (self.feed_http10, 1),
            (self.feed_slow, 1),
            (self.router_stop, 2),
            (self.router_restart, 2),
            (self.hot_release, 1),
            (self.router_new_stream, 1),
            (self.router_burst, 1),
            (self.router_stop_a_worker, 1),
            (self.handler_trouble, 2),
            (self.clock_step, 1),
            (self.clock_drift, 1),
            (self.malformed_items, 1),
        ]
        choices = [kind for kind, _ in kinds]
        weights = [weight for _, weight in kinds]
        for _ in range(count):
            at = self.rng.uniform(start, end)
            self.rng.choices(choices, weights)[0](at)
        # Drawn only when asked (``--extra-faults``), from a generator of their own:
        # the draws above stay what they were (the seeds already run, the regression
        # seeds included, keep their scenarios), and a quarter of the seeds get each of
        # these too.
        if os.environ.get(EXTRA_FAULTS) == "1":
            extra = random.Random(self.fleet.seed * 7919 + 17)
            if extra.random() < 0.25:
                self.damaged_session_then_crash(extra.uniform(start, end), extra)
            if extra.random() < 0.25:
                self.feed_restart(extra.uniform(start, end), extra)
            if extra.random() < 0.5:
                self.slow_but_alive(extra.uniform(start, end), extra)
        self.quiet_crash(start, end)
        self.faults.sort(key=lambda f: f.at)

    # Helpers

    def _worker(self) -> WorkerProcess | None:
        alive = self.fleet.alive()
        return self.rng.choice(alive) if alive else None

    def _on_worker(
        self,
        at: float,
        name: str,
        act: Callable[[WorkerProcess], None],
        heals: float = 0.0,
        excuse: float | None = None,
    ) -> None:
        def run() -> None:
            process = self._worker()
            if process is None:
                return
            monitor = self.fleet.monitor
            monitor.event(f"fault: {name} {process.name}")
            monitor.worker_disturbed(process.name, monitor.now(), monitor.now() + heals)
            act(process)

        self.add(at, name, run, heals=heals, excuse=excuse)

    def _connection(self) -> str:
        return f"c{self.rng.randrange(self.fleet.shape.connections)}"

    def _replace_later(self, at: float) -> None:
        delay = self.rng.uniform(3.0, 15.0)
        self.add(at + delay, "replacement", self._start_worker)

    # Workers

    def crash(self, at: float) -> None:
        burst = self.rng.random() < NEW_STREAMS_IN_FAILOVER
        later, share = self.rng.uniform(2.0, 3.5), self.rng.uniform(0.2, 1.0)
        fleet = self.fleet

        def act(process: WorkerProcess) -> None:
            process.crash()
            if not burst:
                return
            # Restarts on new streams of the crashed worker's connections while they
            # are being taken over (the reap comes about a lease later), and takers
            # that stop for a moment after a takeover's transaction leaves: a restart
            # may land between a takeover's write and its read of the items.
            now = fleet.world.now
            fleet.world.at(now + later, lambda: self._restart_theirs(process.name, share))
            for taker in fleet.alive():
                self._pause_after(taker, {"transact_write_items"}, 0.5, now, now + 8.0)

        self._on_worker(at, "crash", act, excuse=0.0)
        self._replace_later(at)

    def damaged_session_then_crash(self, at: float, rng: random.Random) -> None:
        """A hand edit damages a live worker's session item (``started_at_ms`` and
        ``beat`` as strings: its renews then fail) and the worker dies: its
        connections must be taken over as after any crash (docs/DESIGN.md §2.2)."""
        fleet = self.fleet
        client = SimDynamoDBClient(fleet.engine, lambda: fleet.world.now)

        def act(process: WorkerProcess) -> None:
            answer = client.query(
                TableName=TABLE,
                KeyConditionExpression="#pk = :pk",
                ExpressionAttributeNames={"#pk": schema.PARTITION_KEY},
                ExpressionAttributeValues={":pk": {"S": schema.session_partition(process.name)}},
            )
            for item in answer.get("Items", []):
                if item.get(schema.SESSION_STATE) != {"S": schema.ALIVE}:
                    continue
                if not item[schema.SORT_KEY]["S"].startswith(f"{process.name}#"):
                    continue
                client.update_item(
                    TableName=TABLE,
                    Key={k: item[k] for k in (schema.PARTITION_KEY, schema.SORT_KEY)},
                    UpdateExpression="SET #started = :bad, #beat = :bad",
                    ExpressionAttributeNames={
                        "#started": schema.SESSION_STARTED_AT_MS,
                        "#beat": schema.SESSION_BEAT,
                    },
                    ExpressionAttributeValues={":bad": {"S": "damaged"}},
                )
            process.crash()

        def run() -> None:
            alive = fleet.alive()
            if not alive:
                return
            process = rng.choice(alive)
            monitor = fleet.monitor
            monitor.event(f"fault: damaged session, then a crash {process.name}")
            monitor.worker_disturbed(process.name, monitor.now(), monitor.now())
            act(process)

        self.add(at, "damaged session, then a crash", run, excuse=0.0)
        self.add(at + rng.uniform(3.0, 15.0), "replacement", self._start_worker)

    def slow_but_alive(self, at: float, rng: random.Random) -> None:
        """One worker's DynamoDB round trips lie between the shared client's short
        attempt and the renew window (docs/DESIGN.md §3.11): its renews land and its
        session lives, while each other call is answered late. Meanwhile the router
        stops some of the connections it runs and starts one again on a new stream,
        and, in half the draws, the slow worker is a newcomer the others move a share
        of their connections to. Nothing is excused: what it runs, what is moved to it
        and what it is told are judged by the bounds of the undisturbed fleet."""
        fleet = self.fleet
        seconds = rng.uniform(5.0, 25.0)
        # One way, on top of the link's 2-12 ms: round trips of 0.6 to 1.75 s.
        extra = rng.uniform(0.3, 0.85)
        newcomer = rng.random() < 0.5
        stops = rng.randint(1, 3)
        stop_after, start_after = rng.uniform(0.5, 3.0), rng.uniform(3.0, 8.0)

        def slow(process: WorkerProcess) -> None:
            now = fleet.world.now
            fleet.monitor.event(
                f"fault: slow but alive +{extra:.2f}s for {seconds:.1f}s {process.name}"
            )
            process.link.brownouts.append((now, now + seconds, extra))
            fleet.world.at(now + stop_after, lambda: stop_some(process))

        def stop_some(process: WorkerProcess) -> None:
            if not process.alive:
                return
            ids = sorted(fleet.monitor.run_by(process.name))[:stops]
            for connection_id in ids:
                fleet.router.stop(connection_id)
            if ids:
                again = ids[0]
                fleet.world.at(
                    fleet.world.now + start_after,
                    lambda: fleet.router.start(again, new_stream=True),
                )

        def run() -> None:
            if newcomer:
                process = fleet.start_worker()
                # Once its session is open (a few round trips), before the moves come.
                fleet.world.at(fleet.world.now + 0.5, lambda: slow(process))
                return
            alive = fleet.alive()
            if alive:
                slow(rng.choice(alive))

        self.add(at, "slow but alive", run)
        fleet.last_fault_end = max(fleet.last_fault_end, at + 0.5 + seconds + start_after)

    def quiet_crash(self, start: float, end: float) -> None:
        """A crash in the longest stretch the other faults leave quiet, when it holds
        the failover's window: invariant 7 judges a crash only when nothing else
        happens in that window, which two dozen faults in three minutes seldom leave.
        Its replacement comes after the window."""
        window = self.fleet.timing.crash_failover_bound() + 1.0
        quiet_until, longest = start, 0.0
        edge = start
        for span_start, span_end in sorted(self.spans):
            if span_start - edge > longest:
                quiet_until, longest = span_start, span_start - edge
            edge = max(edge, span_end)
        if end - edge > longest:
            quiet_until, longest = end, end - edge
        if longest < window + 1.0:
            return
        # As far from the fault before as the window allows: what a fault sets going
        # (a drain, a takeover) outlasts the instant it is recorded at.
        at = quiet_until - window - 0.5
        self._on_worker(at, "quiet crash", lambda process: process.crash(), excuse=0.0)
        self.add(at + self.rng.uniform(window, window + 10.0), "replacement", self._start_worker)

    def _restart_theirs(self, worker: str, share: float) -> None:
        fleet = self.fleet
        ids = [c for c in fleet.monitor.run_by(worker) if fleet.rng.random() < share]
        fleet.monitor.event(f"fault: {len(ids)} of {worker}'s connections restarted on new streams")
        for connection_id in ids:
            fleet.router.start(connection_id, new_stream=True)

    def _pause_after(
        self, process: WorkerProcess, writes: set[str], p: float, start: float, end: float
    ) -> None:
        """From ``start`` to ``end``, now and then, the process stops just after one of
        ``writes`` leaves: the write lands while it is stopped, its answer waits."""
        fleet, rng = self.fleet, self.fleet.rng
        if process.link.after_send is not None:
            return

        def after_send(operation: str) -> None:
            if operation in writes and fleet.world.now < end and rng.random() < p:
                stop_for = rng.uniform(1.0, 6.0)
                monitor, now = fleet.monitor, fleet.world.now
                monitor.note(f"{process.name} paused {stop_for:.2f}s after {operation}")
                # As a drawn pause: excused, and a disturbance.
                monitor.excuse(now, now + stop_for)
                monitor.disturbance(now, now + stop_for)
                monitor.worker_disturbed(process.name, now, now + stop_for)
                fleet.pause(process, stop_for)

        process.link.after_send = after_send

        def undo() -> None:
            if process.link.after_send is after_send:
                process.link.after_send = None

        fleet.world.at(max(start, end), undo)

    def sigterm(self, at: float) -> None:
        self._on_worker(at, "sigterm", lambda p: p.terminate(), excuse=0.0)
        self._replace_later(at)

    def drain_while_partitioned(self, at: float) -> None:
        """A worker cut off from DynamoDB is told to stop: its drain, releases and
        retire cannot land, its shutdown budget runs out, and what is still ending
        then is cancelled (every slot must still come back)."""
        seconds, after = self.rng.uniform(2, 15), self.rng.uniform(0.0, 1.5)
        fleet = self.fleet

        def act(process: WorkerProcess) -> None:
            now = fleet.world.now
            process.link.partitions.append((now, now + seconds))
            fleet.world.at(now + after, process.terminate)

        name = f"SIGTERM {after:.1f}s into a partition of {seconds:.1f}s"
        self._on_worker(at, name, act, seconds, seconds)
        self._replace_later(at)

    def pause_in_shutdown(self, at: float) -> None:
        """Half the fleet is told to stop (a deployment replacing half its tasks), and
        a moment later one more worker, which the rest has no room for: its drain
        hands over what it can and releases the rest itself. Meanwhile it is stopped
        (starved of CPU, a long collector pause) for longer than its shutdown budget:
        when it runs again the budget has run out while its connections were still
        being released, and the shutdown cancels them (each must still be released,
        its slot given back and its hint sent)."""
        fleet = self.fleet
        seconds = fleet.timing.shutdown_budget * self.rng.uniform(1.0, 1.3)
        later = self.rng.uniform(1.5, 3.0)
        rng = random.Random(self.rng.getrandbits(64))

        def stop(process: WorkerProcess) -> None:
            process.terminate()
            # Each replaced a few seconds later, as a deployment would.
            fleet.world.at(fleet.world.now + rng.uniform(3.0, 15.0), self._start_worker)

        def run() -> None:
            alive = fleet.alive()
            if len(alive) < 2:
                return
            stopping = rng.sample(alive, (len(alive) + 1) // 2)
            rest = [p for p in alive if p not in stopping]
            last = rng.choice(rest) if rest else stopping.pop()
            monitor = fleet.monitor
            names = ", ".join(p.name for p in stopping)
            monitor.event(
                f"fault: {names} stopped at once, {last.name} {later:.1f}s later and"
                f" paused {seconds:.1f}s in its shutdown"
            )
            now = monitor.now()
            for process in (*stopping, last):
                monitor.worker_disturbed(process.name, now, now + later + seconds)
            fleet.log_triggers.append(
                (last.name, "not handed over", lambda: fleet.pause(last, seconds))
            )
            for process in stopping:
                stop(process)
            fleet.world.at(now + later, lambda: stop(last))

        heals = later + seconds
        self.add(at, "half the fleet stopped, then one more", run, heals=heals, excuse=heals)

    def scale_out(self, at: float) -> None:
        self.add(at, "scale-out", self._start_worker)

    def _start_worker(self) -> None:
        self.fleet.start_worker()

    def scale_in(self, at: float) -> None:
        def act(process: WorkerProcess) -> None:
            if len(self.fleet.alive()) > max(3, self.fleet.shape.workers - 2):
                process.terminate()

        self._on_worker(at, "scale-in", act, excuse=0.0)

    def pause(self, at: float) -> None:
        seconds = self.rng.choice((0.3, 1.0, 2.0, 3.0, 6.0))
        self._on_worker(at, f"pause {seconds}s", lambda p: self.fleet.pause(p, seconds), seconds)

    def pause_after_writes(self, at: float) -> None:
        """For a while, now and then, the process stops just after a write leaves: the
        write lands while it is stopped, its answer waits for it (at any await)."""
        seconds, p = self.rng.uniform(3, 15), self.rng.uniform(0.05, 0.3)
        fleet, rng = self.fleet, self.rng
        writes = {"update_item", "put_item", "transact_write_items", "delete_item"}

        def apply(process: WorkerProcess) -> Callable[[], None]:
            def after_send(operation: str) -> None:
                if operation in writes and rng.random() < p:
                    stop_for = rng.uniform(1.0, 6.0)
                    fleet.monitor.note(f"{process.name} paused {stop_for:.2f}s after {operation}")
                    fleet.pause(process, stop_for)

            process.link.after_send = after_send

            def undo() -> None:
                process.link.after_send = None

            return undo

        name = f"pauses after writes p={p:.2f} for {seconds:.1f}s"
        self._window(at, name, seconds, apply, seconds + 6.0)

    def clock_step(self, at: float) -> None:
        """A worker's wall clock is set off (NTP lost, a bad host), by seconds or by
        half a minute either way, or jumps back and forth by 10 s for a while: no wall
        time decides anything (docs/DESIGN.md §3.6), so nothing may change."""
        rng = self.rng
        fleet = self.fleet
        if rng.random() < 0.7:
            offset = rng.choice((-30.0, -2.0, 2.0, 30.0)) * rng.uniform(0.5, 1.0)

            def act(process: WorkerProcess) -> None:
                process.wall_offset = offset

            self._on_worker(at, f"wall clock {offset:+.1f}s", act)
            return
        jumps, every = rng.randint(2, 6), rng.uniform(1.0, 5.0)

        def jump(process: WorkerProcess) -> None:
            def step(by: float) -> Callable[[], None]:
                def move() -> None:
                    process.wall_offset += by

                return move

            for n in range(jumps):
                fleet.world.at(fleet.world.now + n * every, step(10.0 if n % 2 == 0 else -10.0))

        self._on_worker(at, f"wall clock jumps 10s back and forth {jumps}x", jump)

    def clock_drift(self, at: float) -> None:
        """A worker's monotonic clock runs fast or slow, within the drift the design
        allows for (:data:`~wsfleet.timing.DRIFT_RATE`), from now on."""
        rate = 1.0 + self.rng.uniform(-1.0, 1.0) * DRIFT_RATE

        def act(process: WorkerProcess) -> None:
            process.loop.set_rate(rate)

        self._on_worker(at, f"monotonic clock at {rate:.5f}x", act)

    # DynamoDB, one worker

    def _window(
        self,
        at: float,
        name: str,
        seconds: float,
        apply: Callable[[WorkerProcess], Callable[[], None]],
        excuse: float | None,
    ) -> None:
        def act(process: WorkerProcess) -> None:
            undo = apply(process)
            self.fleet.world.at(self.fleet.world.now + seconds, undo)

        self._on_worker(at, name, act, seconds, excuse)

    def brownout(self, at: float) -> None:
        seconds, extra = self.rng.uniform(3, 20), self.rng.uniform(0.3, 2.0)

        def apply(process: WorkerProcess) -> Callable[[], None]:
            now = self.fleet.world.now
            process.link.brownouts.append((now, now + seconds, extra))
            # One worker's slow DynamoDB excuses no darkness of the connections it
            # runs (docs/DESIGN.md §3.11), only of the others': unless the others have
            # no room for them, now or after a later crash (``capacity_changed``).
            # What it holds but does not run (a stop whose release it could not
            # write, started again) needs its DynamoDB to run again: excused too.
            fleet = self.fleet
            running = frozenset(fleet.monitor.run_by(process.name))
            fleet.monitor.excuse(now, now + seconds, but=running, slow=process.name)
            fleet.impair(process, now + seconds)  # the others may have no room for it
            return lambda: None

        self._window(at, f"brownout +{extra:.2f}s for {seconds:.1f}s", seconds, apply, None)

    def slow_then_cut(self, at: float) -> None:
        """A worker's DynamoDB slows, then stops answering at all (a path that degrades
        before it fails): its last renew to land is slow both ways, so its answer comes
        well after it landed, and then nothing lands. The holder's fence must count
        from that renew's send, never from its answer, or it outlives the reap
        (docs/DESIGN.md §3.6). The slowness keeps a renew's round trip inside the
        fence window, so the renews still count while they land."""
        slow_for, extra = self.rng.uniform(1.0, 4.0), self.rng.uniform(0.4, 0.95)
        cut_for = self.rng.uniform(4.0, 10.0)
        seconds = slow_for + cut_for

        def apply(process: WorkerProcess) -> Callable[[], None]:
            now = self.fleet.world.now
            process.link.brownouts.append((now, now + seconds, extra))
            process.link.partitions.append((now + slow_for, now + seconds))
            self.fleet.impair(process, now + seconds)
            return lambda: None

        name = f"brownout +{extra:.2f}s for {slow_for:.1f}s, then a partition for {cut_for:.1f}s"
        self._window(at, name, seconds, apply, seconds)

    def partition(self, at: float) -> None:
        seconds = self.rng.uniform(1, 10)

        def apply(process: WorkerProcess) -> Callable[[], None]:
            now = self.fleet.world.now
            process.link.partitions.append((now, now + seconds))
            self.fleet.impair(process, now + seconds)
            return lambda: None

        self._window(at, f"partition for {seconds:.1f}s", seconds, apply, seconds)

    def _probability(self, at: float, name: str, attribute: str) -> None:
        seconds, p = self.rng.uniform(2, 15), self.rng.uniform(0.1, 0.5)

        def apply(process: WorkerProcess) -> Callable[[], None]:
            setattr(process.link, attribute, p)
            return lambda: setattr(process.link, attribute, 0.0)

        self._window(at, f"{name} p={p:.2f} for {seconds:.1f}s", seconds, apply, seconds)

    def throttle(self, at: float) -> None:
        self._probability(at, "throttling", "throttle")

    def lost_replies(self, at: float) -> None:
        self._probability(at, "lost replies", "lost_reply")

    def errors_after_apply(self, at: float) -> None:
        self._probability(at, "500 after apply", "error_after_apply")

    # DynamoDB, everyone

    def _weather(self, at: float, name: str, attribute: str, value: float, seconds: float) -> None:
        fleet = self.fleet

        def set_to(v: float) -> Callable[[], None]:
            def act() -> None:
                setattr(fleet.weather, attribute, v)
                for link in fleet.links:
                    setattr(link, attribute, v)

            return act

        def start() -> None:
            fleet.monitor.event(f"fault: {name}")
            fleet.monitor.worker_disturbed(None, fleet.world.now, fleet.world.now + seconds)
            set_to(value)()
            fleet.world.at(fleet.world.now + seconds, set_to(0.0))

        self.add(at, name, start, heals=seconds, excuse=seconds)

    def index_lag(self, at: float) -> None:
        lag, seconds = self.rng.uniform(0.5, 4.0), self.rng.uniform(5, 20)
        self._weather(at, f"index lag {lag:.2f}s for {seconds:.1f}s", "index_lag", lag, seconds)

    def stale_reads(self, at: float) -> None:
        stale, seconds = self.rng.uniform(0.2, 3.0), self.rng.uniform(5, 20)
        self._weather(
            at, f"stale reads {stale:.2f}s for {seconds:.1f}s", "stale_by", stale, seconds
        )

    # Bad data

    def malformed_items(self, at: float) -> None:
        """Items this version cannot use, as a newer version or a hand edit may leave
        them: session items that do not decode and STARTED connection items that
        cannot be run. Each must cost only itself (docs/DESIGN.md §2.2): every other
        connection keeps streaming, and the bad connections end up parked."""
        fleet = self.fleet
        index = len(fleet.malformed)
        partitions = schema.session_partitions()
        sessions: list[dict[str, Any]] = [
            {"Sk": {"S": "no-generation"}},
            {"Sk": {"S": "w#x"}, "state": {"S": schema.ALIVE}},
            {"Sk": {"S": f"bad{index}#3"}, "state": {"N": "1"}},
        ]
        problems = {
            schema.PROTOCOL: {"N": "5"},
            schema.LAST_SEQ: {"S": "seventeen"},
            schema.LEASE_EPOCH: {"S": "1"},
        }
        choice = self.rng.choice(sorted(problems))
        connection_id = f"malformed-{index}"
        fleet.malformed.append(connection_id)
        client = SimDynamoDBClient(fleet.engine, lambda: fleet.world.now)

        def act() -> None:
            fleet.monitor.event(f"fault: malformed items ({choice} of {connection_id})")
            for number, session in enumerate(sessions):
                partition = partitions[(index + number) % len(partitions)]
                item = {schema.PARTITION_KEY: {"S": partition}, **session}
                client.put_item(TableName=TABLE, Item=item)
            item = {
                schema.PARTITION_KEY: {"S": schema.partition_key(connection_id)},
                schema.SORT_KEY: {"S": schema.CONNECTION_SORT_KEY},
                schema.DESIRED_STATE: {"S": schema.STARTED},
                schema.WS_URL: {"S": upstreams.url(f"{connection_id}-s0", fleet.shape.rate)},
                schema.FREE_SHARD: {"S": schema.free_shard(connection_id)},
                schema.LEASE_EPOCH: {"N": "0"},
                schema.LAST_SEQ: {"N": "0"},
                schema.START_GEN: {"N": "1"},
                schema.SEQ_GEN: {"N": "0"},
                choice: problems[choice],
            }
            client.put_item(TableName=TABLE, Item=item)

        self.add(at, "malformed items", act)

    # Upstreams

    def _stream_of(self, connection_id: str) -> str:
        return f"{connection_id}-s{self.fleet.router.streams.get(connection_id, 0)}"

    def feed_drop(self, at: float) -> None:
        connection_id = self._connection()

        def act() -> None:
            self.fleet.monitor.event(f"fault: feed drops {connection_id}")
            self.fleet.feeds.drop(self._stream_of(connection_id))

        self.add(at, "feed drop", act, excuse=1.0, connection_id=connection_id)

    def feed_restart(self, at: float, rng: random.Random) -> None:
        connection_id = f"c{rng.randrange(self.fleet.shape.connections)}"

        def act() -> None:
            self.fleet.monitor.event(f"fault: feed restarts its numbering {connection_id}")
            self.fleet.feeds.restart_numbering(self._stream_of(connection_id))

        # A reconnect, as for a drop, and the write of the new generation.
        self.add(at, "feed restart", act, excuse=2.0, connection_id=connection_id)

    def feed_silence(self, at: float) -> None:
        connection_id, seconds = self._connection(), self.rng.uniform(2, 20)

        def act() -> None:
            self.fleet.monitor.event(f"fault: feed silent {connection_id} {seconds:.1f}s")
            self.fleet.feeds.silence(self._stream_of(connection_id), seconds)

        # The keepalive notices silence within a ping interval and timeout.
        fleet = self.fleet
        excuse = seconds + fleet.shape.silence_noticed_within(fleet.timing) + 6.0
        self.add(at, "feed silence", act, heals=seconds, excuse=excuse, connection_id=connection_id)

    def feed_refusal(self, at: float) -> None:
        connection_id, seconds = self._connection(), self.rng.uniform(2, 20)
        status = self.rng.choice((500, 502, 503))

        def act() -> None:
            self.fleet.monitor.event(f"fault: feed refuses {connection_id} {status} {seconds:.1f}s")
            self.fleet.feeds.refuse(self._stream_of(connection_id), status, seconds)

        # Reconnects back off up to 30 s.
        excuse = seconds + 30.0
        self.add(at, "feed refusal", act, heals=seconds, excuse=excuse, connection_id=connection_id)

    def feed_http10(self, at: float) -> None:
        connection_id, seconds = self._connection(), self.rng.uniform(2, 20)

        def act() -> None:
            self.fleet.monitor.event(f"fault: feed answers HTTP/1.0 {connection_id} {seconds:.1f}s")
            self.fleet.feeds.answer_http10(self._stream_of(connection_id), seconds)

        excuse = seconds + 30.0
        self.add(
            at, "feed http/1.0", act, heals=seconds, excuse=excuse, connection_id=connection_id
        )

    def feed_slow(self, at: float) -> None:
        connection_id, seconds = self._connection(), self.rng.uniform(2, 20)
        by = self.rng.uniform(0.5, 12.0)  # beyond the open timeout (10 s): attempts fail

        def act() -> None:
            self.fleet.monitor.event(
                f"fault: feed handshakes {by:.1f}s slow {connection_id} {seconds:.1f}s"
            )
            self.fleet.feeds.slow_handshakes(self._stream_of(connection_id), seconds, by)
            self.fleet.feeds.drop(self._stream_of(connection_id))

        excuse = seconds + by + 30.0
        self.add(at, "feed slow", act, heals=seconds, excuse=excuse, connection_id=connection_id)

    # The router

    def router_stop(self, at: float) -> None:
        connection_id = self._connection()
        self.add(at, "stop", lambda: self.fleet.router.stop(connection_id))
        # Started again later (or never: then it stays stopped to the end).
        if self.rng.random() < 0.7:
            self.add(
                at + self.rng.uniform(0.1, 20),
                "start",
                lambda: self.fleet.router.start(connection_id),
            )

    def hot_release(self, at: float) -> None:
        """A few connections of one worker are stopped, and their items' partition
        then refuses writes for longer than the release budget: the holder's releases
        get no answer, and the items stay its own until its own-check releases them.
        They are started again later, on the same streams: what the holder handled
        must not be delivered again (its final checkpoints are kept, invariant 6)."""
        fleet, rng = self.fleet, self.rng
        timing = fleet.timing
        hot_for = timing.release_budget + rng.uniform(0.5, 3.0)
        again = hot_for + rng.uniform(0.5, 5.0)
        count = rng.randint(1, 4)

        def act() -> None:
            alive = [p for p in fleet.alive() if fleet.monitor.run_by(p.name)]
            if not alive:
                return
            process = rng.choice(alive)
            ids = rng.sample(fleet.monitor.run_by(process.name), 1)
            ids += [c for c in fleet.monitor.run_by(process.name) if c not in ids][: count - 1]
            now = fleet.world.now
            fleet.monitor.event(f"fault: {', '.join(ids)} of {process.name} stopped, then hot")
            for cid in ids:
                fleet.router.stop(cid)
                fleet.monitor.excuse(now, now + again + timing.own_check_bound() + 2.0, cid)
            fleet.world.at(now + 0.05, lambda: self._hot(ids, hot_for))

            def start_again() -> None:
                for cid in ids:
                    fleet.router.start(cid)

            fleet.world.at(now + again, start_again)

        self.add(at, f"stop, then writes refused for {hot_for:.1f}s", act, heals=again)

    def _hot(self, ids: list[str], seconds: float) -> None:
        until = self.fleet.world.now + seconds
        for cid in ids:
            self.fleet.hot.until[schema.partition_key(cid)] = until

    def router_restart(self, at: float) -> None:
        connection_id = self._connection()

        def act() -> None:
            self.fleet.router.stop(connection_id)
            self.fleet.router.start(connection_id)

        self.add(at, "restart", act)

    def router_new_stream(self, at: float) -> None:
        connection_id = self._connection()
        self.add(at, "new stream", lambda: self.fleet.router.start(connection_id, new_stream=True))

    def router_burst(self, at: float, *, new_stream: bool = False) -> None:
        ids = sorted({self._connection() for _ in range(self.rng.randint(5, 40))})
        router = self.fleet.router
        if new_stream:

            def restart_all() -> None:
                self.fleet.monitor.event(f"fault: burst of {len(ids)} restarts on new streams")
                for connection_id in ids:
                    router.start(connection_id, new_stream=True)

            self.add(at, "burst new streams", restart_all)
            return

        def stop_all() -> None:
            self.fleet.monitor.event(f"fault: burst of {len(ids)} stops")
            for connection_id in ids:
                router.stop(connection_id)

        def start_all() -> None:
            for connection_id in ids:
                router.start(connection_id)

        self.add(at, "burst stop", stop_all)
        self.add(at + self.rng.uniform(0.5, 10), "burst start", start_all)

    def router_stop_a_worker(self, at: float) -> None:
        """Every connection one worker runs is stopped at once (a tenant's connections,
        which the rendezvous spread put together), and started again later: a burst
        of notices to one worker, each stop bound by the stop bound."""
        fleet, router = self.fleet, self.fleet.router
        later = self.rng.uniform(1.0, 10.0)

        def act() -> None:
            # The busiest worker: the longest burst.
            loads = [
                (len(p.worker.owned()), p.name, sorted(p.worker.owned()))
                for p in fleet.alive()
                if p.worker is not None
            ]
            if not loads:
                return
            _, name, ids = max(loads)
            fleet.monitor.event(f"fault: stop all {len(ids)} of {name}")
            for connection_id in ids:
                router.stop(connection_id)

            def start_all() -> None:
                for connection_id in ids:
                    router.start(connection_id)

            fleet.world.at(fleet.world.now + later, start_all)

        self.add(at, "stop a worker's connections", act)

    # Handlers

    def handler_trouble(self, at: float) -> None:
        seconds = self.rng.uniform(2, 15)
        kind = self.rng.choice(("slow", "raise", "cancelled", "pause", "crash", "stuck"))
        fleet = self.fleet
        if kind == "crash":
            self._crash_in_a_call(at, seconds)
            return
        if kind == "stuck":
            self._stuck_then_sigterm(at, seconds)
            return

        async def slow(rng: random.Random) -> None:
            await asyncio.sleep(rng.uniform(0.05, 3.0))

        async def fail(rng: random.Random) -> None:
            raise RuntimeError("handler failed")

        async def cancelled(rng: random.Random) -> None:
            raise asyncio.CancelledError

        def pauser(process: WorkerProcess) -> Callable[[random.Random], object]:
            async def pause(rng: random.Random) -> None:
                fleet.pause(process, rng.uniform(0.1, 4.0))
                await asyncio.sleep(0)

            return pause

        def apply(process: WorkerProcess) -> Callable[[], None]:
            behaviours = {"slow": slow, "raise": fail, "cancelled": cancelled}
            process.misbehaviour = behaviours.get(kind) or pauser(process)

            def undo() -> None:
                process.misbehaviour = None

            return undo

        # A failing handler is retried with backoff up to 10 s.
        self._window(at, f"handler {kind} for {seconds:.1f}s", seconds, apply, seconds + 10.0)

    def _stuck_then_sigterm(self, at: float, seconds: float) -> None:
        """Handler calls that ignore cancellation for up to half a minute (a broad
        ``except``), and a SIGTERM soon after the first: the shutdown budget runs out
        and the runners still ending are cancelled, which must still end them in order
        and give their slots back."""
        fleet = self.fleet

        def apply(process: WorkerProcess) -> Callable[[], None]:
            told = False

            async def stuck(rng: random.Random) -> None:
                nonlocal told
                if not told:
                    told = True
                    fleet.world.at(fleet.world.now + rng.uniform(0.5, 3.0), process.terminate)
                loop = asyncio.get_running_loop()
                end = loop.time() + rng.uniform(5.0, 30.0)
                while (left := end - loop.time()) > 0:
                    # What the fault is: a handler that will not be cancelled.
                    with contextlib.suppress(asyncio.CancelledError):
                        await asyncio.sleep(left)

            stuck.ignores_cancellation = True  # type: ignore[attr-defined]
            process.misbehaviour = stuck

            def undo() -> None:
                process.misbehaviour = None

            return undo

        # A stuck call holds its connection dark for up to 30 s past the window.
        self._window(at, f"handler stuck for {seconds:.1f}s", seconds, apply, seconds + 45.0)
        self._replace_later(at + seconds)

    def _crash_in_a_call(self, at: float, seconds: float) -> None:
        """Handler calls turn slow (seconds each), and the process dies in the middle
        of one: what its checkpoint says of the calls in flight is what the next owner
        resumes from."""
        fleet = self.fleet

        def apply(process: WorkerProcess) -> Callable[[], None]:
            crashing = False

            async def slow_then_crash(rng: random.Random) -> None:
                nonlocal crashing
                if not crashing:
                    crashing = True
                    fleet.world.at(fleet.world.now + rng.uniform(1.0, 8.0), crash)
                await asyncio.sleep(rng.uniform(2.0, 6.0))

            def crash() -> None:
                if process.loop.crashed:
                    return
                monitor, now = fleet.monitor, fleet.world.now
                monitor.event(f"fault: {process.name} crashes in a handler call")
                # As a drawn crash: the failover bound counts from it.
                monitor.excuse(now, now)
                monitor.disturbance(now, now)
                process.crash()
                fleet.world.at(fleet.world.now + fleet.rng.uniform(3.0, 15.0), self._start_worker)

            process.misbehaviour = slow_then_crash

            def undo() -> None:
                process.misbehaviour = None

            return undo

        # The crash comes within the window and 8 s; the slow calls hold their
        # connections up to 6 s more.
        name = f"handler crash within {seconds:.1f}s"
        self._window(at, name, seconds + 8.0, apply, seconds + 14.0)


def run_seed(seed: int, *, duration: float = 180.0, faults: int = 24) -> Result:
    rng = random.Random(seed)
    shape = Shape.draw(rng, duration=duration, faults=faults)
    fleet = Fleet(seed, shape)
    with watched(fleet):
        return _run(fleet, rng, shape)


def _run(fleet: Fleet, rng: random.Random, shape: Shape) -> Result:
    world = fleet.world
    world.now = START
    for _ in range(shape.workers):
        fleet.start_worker()
    schedule = Schedule(fleet, rng)
    # The connections start in the first seconds, in a few bursts.
    for index in range(shape.connections):
        schedule.add(START + rng.uniform(0.5, 8.0), "start", _starter(fleet, f"c{index}"))
    schedule.draw(START + 10.0, START + shape.duration - TAIL, shape.faults)
    for fault in sorted(schedule.faults, key=lambda f: f.at):
        world.at(fault.at, fault.act)
    healed = max(fleet.last_fault_end, START + 10.0)
    end = max(START + shape.duration, healed + TAIL)
    world.run_until(end)
    fleet.monitor.check_streaming(fleet.short_since)
    fleet.monitor.check_failovers()
    _check_parked(fleet)
    for body in fleet.queue.dead_letters:
        # The router and the workers send only valid hints: none is poison.
        fleet.monitor.violated(5, f"a valid start queue message went to the DLQ: {body}")
    _shut_down(fleet)
    for error in world.errors:
        fleet.monitor.violated(5, f"unhandled: {error}")
    return Result(
        seed=fleet.seed,
        shape=shape,
        violations=fleet.monitor.violations,
        simulated_seconds=world.now - START,
        deliveries=fleet.monitor.deliveries,
        zombie_overlaps=fleet.monitor.zombie_overlaps,
        faults=[f.name for f in schedule.faults],
        trace_hash=fleet.monitor.trace_hash(),
    )


def _starter(fleet: Fleet, connection_id: str) -> Callable[[], None]:
    return lambda: fleet.router.start(connection_id)


def _check_parked(fleet: Fleet) -> None:
    """Every malformed connection item ends up parked with its problem, never held."""
    client = SimDynamoDBClient(fleet.engine, lambda: fleet.world.now)
    for connection_id in fleet.malformed:
        key = {
            schema.PARTITION_KEY: {"S": schema.partition_key(connection_id)},
            schema.SORT_KEY: {"S": schema.CONNECTION_SORT_KEY},
        }
        item = client.get_item(TableName=TABLE, Key=key, ConsistentRead=True).get("Item", {})
        reason = item.get(schema.PARKED_REASON, {}).get("S", "")
        if not reason.startswith("malformed item") or schema.LEASE_OWNER in item:
            fleet.monitor.violated(
                3, f"{connection_id}: a malformed item not parked: {sorted(item)}"
            )


def _shut_down(fleet: Fleet) -> None:
    """SIGTERM every worker left; each must exit in its shutdown budget (with every slot
    given back, as at every exit: WorkerProcess)."""
    world = fleet.world
    running = [p for p in fleet.processes if p.alive]
    for process in running:
        process.terminate()
    deadline = world.now + fleet.timing.shutdown_budget + 10.0
    while world.now < deadline and not all(p.exited for p in running):
        world.run_until(min(world.now + 1.0, deadline))
    for process in running:
        if not process.exited:
            fleet.monitor.violated(5, f"{process.name} did not exit after SIGTERM")
