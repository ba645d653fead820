"""Wall-clock skew: what one worker with a wrong wall clock does to a fleet of real
workers, when it is also cut off from DynamoDB, paused and killed.

``python -m benchmarks.wall_clock`` (every scenario, about a minute each) or some of
them, ``python -m benchmarks.wall_clock --scenarios -2 jump``; options ``--scenarios``
(``-2 +2 -30 +30 jump``, or comma-separated: ``--scenarios=-2,+30``), ``--duration``
(seconds of the fault phase, default 45: one turn of the three faults; a shorter one
may leave the kill out), ``--seed``, ``--workers``, ``--connections``, ``--keep`` (keep
the logs and records).

What it measures: safety must not rest on wall clocks (docs/DESIGN.md §3.6: a session
expires by observation on each reaper's own monotonic clock). A design that reaps a
session once its writer's wall-clock expiry has passed by the reaper's wall clock lets
a worker whose clock is behind be reaped while it still delivers, or one whose clock is
ahead reap the others: two workers then deliver the same connection, and the older
epoch's deliveries after the newer epoch began are "stale deliveries". This benchmark
counts them; it asserts nothing (exit status 0 whatever it finds).

Each scenario is a fleet run of its own (fresh table, queue, router, workers and
proxies on the same DynamoDB Local, moto and demo feed, all on loopback; the same seed
for every scenario), set up as :mod:`benchmarks.chaos` sets up its own: scaled timings
(lease 2 s: heartbeat 0.5 s, reconcile 0.5 s), every worker reaching DynamoDB through
its own :class:`~benchmarks.tcp_proxy.TcpProxy`, every delivery recorded
(:mod:`local_stack.recording`). Connections carry no upstream fault. One worker, the
skewed one, runs ``python -m benchmarks.skewed_worker`` with the scenario's clock:

- ``-2``, ``+2``, ``-30``, ``+30``: its wall clock that many seconds off;
- ``jump``: right, then 10 s ahead for 3 s, right again for 3 s, and so on.

During the fault phase the skewed worker is, in turn, cut off from DynamoDB (its proxy
blackholed) for about 8 s, paused (SIGSTOP, then SIGCONT) for about 3 leases, and
killed (SIGKILL); a kill is followed 0.5-1.5 s later by another skewed worker with the
same clock. Each fault comes 2-3 leases after the previous one ended, once the skewed
worker handles half its fair share of the connections again (it loses them all to a
partition or a pause and gets them back only as the others' balancer moves them; at
most 8 leases more); the turn repeats while a fault fits in ``--duration``, and the
fleet runs on unfaulted (the skewed worker with it) until then. Afterwards every fault
is undone, the run waits until every connection is handled again, stops every worker
with SIGTERM and audits every delivery (:func:`benchmarks.chaos_audit.audit`).

Output: progress on stderr; on stdout one line per scenario (its clock, stale
deliveries, lost seqs, duplicates, the longest time a connection went unhandled, the
faults with how many connections the skewed worker handled when each began, and the
skew the table saw: a renew's expiry minus the lease minus the real time, sampled every
0.5 s, within half a second below the worker's offset), then one JSON line:
``{"scenarios": [...], "stale_deliveries": total, "lost_seqs": total}``.

Exit status: 0 when every scenario was measured (stale deliveries or not), 2 when one
could not be carried out (its entry then has an ``error``), 130 when interrupted.
"""

from __future__ import annotations

import argparse
import heapq
import json
import random
import shutil
import sys
import tempfile
import time
import traceback
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from botocore.exceptions import BotoCoreError, ClientError

from benchmarks.chaos import (
    EXIT_ERROR,
    EXIT_INTERRUPTED,
    EXIT_OK,
    FIRST_DELIVERY_TIMEOUT_S,
    POLL_S,
    WARMUP_S,
    ChaosRun,
    ChaosWorker,
    endings,
    held_leases,
)
from benchmarks.chaos_audit import audit
from benchmarks.chaos_plan import Options, PlannedConnection, PlannedFault, plan_connections
from benchmarks.report import machine
from benchmarks.skewed_worker import MESSAGE as SKEW_MESSAGE
from benchmarks.skewed_worker import ClockSkew
from benchmarks.tcp_proxy import ProxyThread
from local_stack import services
from local_stack.audit import Record, load_records
from local_stack.clock import now_ms, wait_until
from local_stack.fleet import Deployment
from local_stack.server_group import LocalServers
from local_stack.stop_requests import sigterm_as_interrupt
from local_stack.workers import WORKER_READY_TIMEOUT_S, WorkerProcess, wait_ready
from wsfleet import schema
from wsfleet.session_rules import SessionItem
from wsfleet.session_store import SessionStore
from wsfleet.timing import LeaseTiming

SCENARIOS: Final[dict[str, ClockSkew]] = {
    "-2": ClockSkew(-2.0),
    "+2": ClockSkew(2.0),
    "-30": ClockSkew(-30.0),
    "+30": ClockSkew(30.0),
    "jump": ClockSkew(0.0, jump=10.0, every=3.0),
}
"""The skewed worker's clock in each scenario, by name."""

LEASE_S: Final = 2.0
RATE: Final = 10.0
"""Messages per second per connection."""
DEFAULT_DURATION_S: Final = 45.0
DEFAULT_SEED: Final = 7
DEFAULT_WORKERS: Final = 3
DEFAULT_CONNECTIONS: Final = 30

PARTITION_S: Final = 8.0
"""About how long the skewed worker is cut off from DynamoDB."""
PAUSE_LEASES: Final = 3.0
"""About how many leases it is paused for."""
RECOVER_LEASES: Final = (2.0, 3.0)
"""Between the end of one fault and the next (it takes connections again meanwhile)."""
SKEW_FAULTS: Final = ("blackhole", "sigstop", "sigkill")
"""The faults aimed at the skewed worker, in turn."""
LOAD_WAIT_LEASES: Final = 8.0
"""After its rest, a fault waits up to this many more leases for the skewed worker to
be healthy and handle :func:`loaded` connections (after a partition or a pause it has
lost them all, and takes connections back only as the balancer moves them)."""
SAMPLE_S: Final = 0.5
"""How often the sessions are read for the skew the table sees."""


# --- the plan (pure) -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SkewFault:
    """One fault aimed at the skewed worker."""

    kind: str
    hold: float
    """How long a blackhole or pause lasts; for a SIGKILL, when the replacement starts."""
    rest: float
    """At least this long after the previous fault ended (or the phase began) before it
    is applied."""


def plan_skew_faults(rng: random.Random, duration: float, timing: LeaseTiming) -> list[SkewFault]:
    """The faults aimed at the skewed worker, in turn: a blackhole of ``PARTITION_S``
    and a pause of ``PAUSE_LEASES`` leases (each +-5 %), then a SIGKILL whose
    replacement starts 0.5-1.5 s later; the first after 0.25-0.75 lease, each next one
    at least 2-3 leases after the previous ended. As many as could fit in ``duration``
    if each came at its earliest (:meth:`SkewedFleet.run_turns` applies them later
    when the skewed worker has yet to take connections, and only while they fit)."""
    plan: list[SkewFault] = []
    rest = rng.uniform(0.25, 0.75) * timing.lease
    spent = 0.0
    while True:
        kind = SKEW_FAULTS[len(plan) % len(SKEW_FAULTS)]
        if kind == "blackhole":
            hold = PARTITION_S * rng.uniform(0.95, 1.05)
        elif kind == "sigstop":
            hold = PAUSE_LEASES * timing.lease * rng.uniform(0.95, 1.05)
        else:
            hold = rng.uniform(0.5, 1.5)
        spent += rest + hold
        if spent > duration:
            return plan
        plan.append(SkewFault(kind, round(hold, 3), round(rest, 3)))
        rest = rng.uniform(*RECOVER_LEASES) * timing.lease


def clean_connections(rng: random.Random, count: int, rate: float) -> list[PlannedConnection]:
    """The chaos run's connections without their upstream faults (a reconnect would
    blur the dark gaps the faults on the skewed worker cause)."""
    return [
        PlannedConnection(p.connection_id, {"rate": rate}, None)
        for p in plan_connections(rng, count, rate)
    ]


def loaded(options: Options) -> int:
    """How many connections the skewed worker should handle before a fault: half its
    fair share, at least 1."""
    return max(1, options.connections // (2 * options.workers))


class SkewSeen:
    """The wall-clock skew the table shows for each worker: at every sample, for each
    ALIVE session whose beat changed since the previous sample (renewed since), its
    expiry minus the lease minus the real time now. The renew read its clock at most
    a sample interval (plus a round trip) earlier, so the figure lies that much below
    the worker's offset."""

    def __init__(self) -> None:
        self._beats: dict[tuple[str, int], int | None] = {}
        self.seen: dict[str, list[float]] = defaultdict(list)
        """Worker id -> skews seen (seconds)."""

    def sample(self, sessions: Iterable[SessionItem], real_now_ms: int, lease_ms: int) -> None:
        for session in sessions:
            key = (session.worker_id, session.session_gen)
            before = self._beats.get(key)
            # The renew's mark: its beat; the design before the beat (run from a
            # worktree of an older commit, for comparison) had only the expiry.
            mark = getattr(session, "beat", None) or session.expires_at_ms
            self._beats[key] = mark
            if session.state != schema.ALIVE or before is None:
                continue
            if mark != before:
                skew = (session.expires_at_ms - lease_ms - real_now_ms) / 1000
                self.seen[session.worker_id].append(skew)

    def span(self, worker_ids: Iterable[str]) -> list[float] | None:
        """[least, most] skew seen over ``worker_ids`` (None: no sample)."""
        values = [v for w in worker_ids for v in self.seen.get(w, [])]
        return [round(min(values), 2), round(max(values), 2)] if values else None


# --- the fleet -------------------------------------------------------------------------


def launch_skewed(
    deployment: Deployment, worker_id: str, env: Mapping[str, str], skew: ClockSkew
) -> WorkerProcess:
    """Start ``python -m benchmarks.skewed_worker`` with ``skew`` as a worker of
    ``deployment`` (as :meth:`~local_stack.fleet.Deployment.launch_worker` starts
    ``python -m worker``): its log ``<work_dir>/<worker_id>.log``, stopped with the
    deployment's other workers."""
    health_file = deployment.health_file(worker_id)
    health_file.parent.mkdir(parents=True, exist_ok=True)
    health_file.unlink(missing_ok=True)  # a stamp left behind would pass for readiness
    log_path = deployment.work_dir / f"{worker_id}.log"
    argv = [deployment.worker_python, "-m", "benchmarks.skewed_worker", *skew.argv()]
    popen = services.spawn(argv, log_path, cwd=services.REPO_ROOT, env=env)
    process = WorkerProcess(worker_id, popen, log_path, health_file)
    deployment.workers.append(process)
    return process


@dataclass(frozen=True, slots=True)
class Aimed:
    """One fault applied to the skewed worker."""

    kind: str
    worker: str
    handled: int
    """Connections it handled last when the fault began."""
    detail: str


class SkewedFleet(ChaosRun):
    """The chaos run's fleet, one worker of which (and each replacement of it) runs
    with a skewed wall clock; every targeted fault is aimed at that worker."""

    def __init__(
        self,
        options: Options,
        deployment: Deployment,
        proxies: ProxyThread,
        dynamodb_port: int,
        log: Callable[[str], None],
        skew: ClockSkew,
    ) -> None:
        rng = random.Random(options.seed)  # unused: every fault has one target
        super().__init__(options, deployment, proxies, dynamodb_port, rng, log)
        self.skew = skew
        self.skewed_ids: list[str] = []
        self.aimed: list[Aimed] = []
        self.skew_seen = SkewSeen()
        self._sessions = SessionStore(deployment.ddb, deployment.table, options.timing)
        self._next_sample = 0.0

    def skewed(self) -> ChaosWorker | None:
        """The skewed worker that is alive and not on its way out, if any."""
        for worker_id in reversed(self.skewed_ids):
            worker = self.workers.get(worker_id)
            if worker is not None and worker.process.alive() and worker.ending is None:
                return worker
        return None

    def start_process(self, worker_id: str, env: dict[str, str]) -> WorkerProcess:
        """A skewed worker when none runs, an ordinary one otherwise."""
        if self.skewed() is not None:
            return super().start_process(worker_id, env)
        self.skewed_ids.append(worker_id)
        self.log(f"{worker_id} runs with its wall clock {self.skew.describe()}")
        return launch_skewed(self.deployment, worker_id, env, self.skew)

    def _target(self) -> ChaosWorker | None:
        """The skewed worker, while healthy and while another healthy worker remains."""
        target = self.skewed()
        if target is None or not target.healthy():
            return None
        others = [w for w in self.workers.values() if w is not target and w.healthy()]
        return target if others else None

    def _record(self, kind: str, worker: ChaosWorker | None, detail: str = "") -> int:
        if worker is not None:
            self.aimed.append(Aimed(kind, worker.worker_id, self.owned(worker), detail))
        return super()._record(kind, worker, detail)

    def observe(self) -> list[Record]:
        found = super().observe()
        if time.monotonic() >= self._next_sample:
            self._next_sample = time.monotonic() + SAMPLE_S
            try:
                sessions = self._sessions.list_sessions()
            except (BotoCoreError, ClientError) as error:
                self.log(f"sessions not read: {error!r}")
            else:
                self.skew_seen.sample(sessions, now_ms(), self.options.timing.lease_ms)
        return found

    def ready_for_fault(self) -> bool:
        """The skewed worker is healthy and handles :func:`loaded` connections."""
        target = self._target()
        return target is not None and self.owned(target) >= loaded(self.options)

    def run_turns(self, plan: list[SkewFault], duration: float) -> None:
        """Apply ``plan`` in order over ``duration`` seconds: each fault once the
        previous one is over (its SIGCONT, heal or replacement done), its rest has
        passed and the skewed worker is :meth:`ready_for_fault` (or
        ``LOAD_WAIT_LEASES`` more have passed), and only while it would end within
        ``duration``; then run unfaulted until ``duration``."""
        t0 = time.monotonic()
        end = t0 + duration
        pending = list(plan)
        ended_at: float | None = t0
        """When the previous fault was over (None: one is under way)."""
        load_wait = LOAD_WAIT_LEASES * self.options.timing.lease
        while True:
            self.observe()
            now = time.monotonic()
            while self._timers and self._timers[0][0] <= now:
                heapq.heappop(self._timers)[2]()
            if ended_at is None and not self._timers:
                ended_at = now
            self.check_exits()
            if now >= end:
                return
            if pending and ended_at is not None:
                fault = pending[0]
                due = ended_at + fault.rest
                if now + fault.hold > end:
                    self.log(f"no time left for {len(pending)} more faults")
                    pending.clear()
                elif now >= due and (self.ready_for_fault() or now >= due + load_wait):
                    pending.pop(0)
                    self.apply(PlannedFault(round(now - t0, 3), fault.kind, fault.hold))
                    ended_at = None if self._timers else now
            time.sleep(POLL_S)

    def signing_offsets(self) -> list[float]:
        """What each skewed worker reported of its signing clock (seconds off)."""
        offsets = []
        for worker_id in self.skewed_ids:
            worker = self.workers.get(worker_id)
            for event in [] if worker is None else worker.process.logged(SKEW_MESSAGE):
                offsets.append(float(event.get("signing_offset_s", 0.0)))
        return offsets


# --- one scenario ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Settings:
    duration: float
    seed: int
    workers: int
    connections: int


def run_scenario(
    stack: LocalServers,
    index: int,
    name: str,
    settings: Settings,
    log: Callable[[str], None],
) -> dict[str, Any]:
    """One fleet run with the skewed clock of scenario ``name``; its figures."""
    skew = SCENARIOS[name]
    options = Options(
        duration=settings.duration,
        seed=settings.seed,
        workers=settings.workers,
        connections=settings.connections,
        lease_seconds=LEASE_S,
        rate=RATE,
    )
    rng = random.Random(options.seed)
    plan = plan_skew_faults(rng, options.duration, options.timing)
    planned = clean_connections(rng, options.connections, options.rate)
    deployment = stack.deployment(f"wallclock{index}")
    dynamodb_port = int(stack.endpoints.dynamodb.rsplit(":", 1)[1])
    log(f"scenario {name}: clock {skew.describe()}; faults {[f.kind for f in plan]}")
    try:
        with ProxyThread() as proxies:
            fleet = SkewedFleet(options, deployment, proxies, dynamodb_port, log, skew)
            try:
                result = _drive(fleet, stack, plan, planned, log)
            finally:
                fleet.stop_all()
    finally:
        deployment.stop_router()
    gap = result["longest_unhandled"]
    skewed = fleet.skewed_ids
    others = [w for w in fleet.workers if w not in skewed]
    return {
        "scenario": name,
        "offset_s": skew.offset,
        "jump_s": skew.jump,
        "every_s": skew.every,
        "stale_deliveries": result["stale_deliveries"],
        "lost_seqs": result["lost_seqs"],
        "duplicates": result["duplicates"],
        "longest_dark_gap_s": None if gap is None else gap["seconds"],
        "longest_dark_gap": gap,
        "stuck_connections": result["stuck_connections"],
        "deliveries": result["deliveries"],
        "takeovers": result["takeovers"],
        "faults": [
            {"kind": a.kind, "worker": a.worker, "handled": a.handled, "detail": a.detail}
            for a in fleet.aimed
        ],
        "faults_skipped": result["faults_skipped"],
        "skewed_workers": skewed,
        "table_skew_s": fleet.skew_seen.span(skewed),
        "table_skew_others_s": fleet.skew_seen.span(others),
        "signing_offset_s": max(fleet.signing_offsets(), key=abs, default=None),
        "unexpected_exits": result["unexpected_exits"],
        "unclean_exits": result["unclean_exits"],
        "leases_held_after_shutdown": result["leases_held_after_shutdown"],
        "violations": result["violations"],
    }


def _drive(
    fleet: SkewedFleet,
    stack: LocalServers,
    plan: list[SkewFault],
    planned: list[PlannedConnection],
    log: Callable[[str], None],
) -> dict[str, Any]:
    """The chaos run's course without its balance wait: start the fleet and the
    connections, apply ``plan``, undo it, wait until every connection is handled again,
    stop every worker, audit."""
    options, deployment = fleet.options, fleet.deployment
    first = [fleet.launch() for _ in range(options.workers)]
    wait_ready([worker.process for worker in first])
    log(f"{len(first)} workers started")
    started_at: dict[str, float] = {}
    for connection in planned:
        started_at[connection.connection_id] = time.time()
        url = stack.feed_url(connection.connection_id, connection.params)
        deployment.start_connection(connection.connection_id, url)

    def all_flowing() -> bool:
        fleet.observe()
        return len(fleet.deliveries.latest) == len(planned)

    wait_until(all_flowing, FIRST_DELIVERY_TIMEOUT_S, "a first delivery on every connection")
    log(f"{len(planned)} connections flowing; warming up {WARMUP_S:g} s")
    time.sleep(WARMUP_S)
    log(f"fault phase: {options.duration:g} s")
    fleet.run_turns(plan, options.duration)
    fleet.undo_faults()
    settle_since = time.time()
    log("faults undone; waiting for every connection to be handled again")
    recent: set[str] = set()

    def all_recovered() -> bool:
        recent.update(r.connection_id for r in fleet.observe() if r.t >= settle_since)
        fleet.check_exits()
        return len(recent) == len(planned)

    settle_timeout = max(20.0, 4 * options.timing.crash_failover_bound())
    try:
        wait_until(all_recovered, settle_timeout, "every connection to be handled again")
    except TimeoutError as error:
        log(str(error))  # the audit counts the stuck connections
    measured_until = time.time()
    wait_until(fleet.all_started, WORKER_READY_TIMEOUT_S, "every replacement worker to start")
    log("stopping every worker (SIGTERM)")
    fleet.stop_all()
    return audit(
        options=options,
        records=load_records(deployment.record_dir),
        planned=planned,
        started_at=started_at,
        settle_since=settle_since,
        measured_until=measured_until,
        outcome=fleet.outcome,
        held=held_leases(deployment),
        connection_endings=endings(deployment.workers),
    )


def scenario_line(entry: Mapping[str, Any]) -> str:
    """One readable line of a scenario's figures."""
    skew = ClockSkew(entry["offset_s"], entry["jump_s"], entry["every_s"])
    head = f"scenario {entry['scenario']:>4}: clock {skew.describe()}"
    if entry.get("error"):
        return f"{head} | not carried out: {entry['error']}"
    gap = entry["longest_dark_gap"]
    gap_text = "n/a" if gap is None else f"{gap['seconds']:.2f} s ({gap['connection_id']})"
    faults = " ".join(f"{f['kind']}:{f['worker']}({f['handled']})" for f in entry["faults"])
    skipped = entry["faults_skipped"]
    seen = entry["table_skew_s"]
    parts = [
        head,
        f"stale deliveries {entry['stale_deliveries']}",
        f"lost seqs {entry['lost_seqs']}",
        f"duplicates {entry['duplicates']}",
        f"longest dark gap {gap_text}",
        f"faults {faults or 'none'}" + (f" skipped {skipped}" if skipped else ""),
        "table saw skew " + ("n/a" if seen is None else f"{seen[0]:+.2f}..{seen[1]:+.2f} s"),
    ]
    if entry["stuck_connections"]:
        parts.append(f"stuck {entry['stuck_connections']}")
    if entry["unexpected_exits"]:
        parts.append(f"unexpected exits {entry['unexpected_exits']}")
    return " | ".join(parts)


# --- main ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Arguments:
    scenarios: list[str]
    settings: Settings
    keep: bool


def parse_scenarios(values: list[str]) -> list[str]:
    """Scenario names, given separately or comma-separated, in the given order
    (repeats dropped); raises ValueError naming an unknown one."""
    names: list[str] = []
    for value in values:
        for name in filter(None, (part.strip() for part in value.split(","))):
            if name not in SCENARIOS:
                raise ValueError(f"unknown scenario {name!r} (known: {', '.join(SCENARIOS)})")
            if name not in names:
                names.append(name)
    return names


def parse_args(argv: list[str] | None) -> Arguments:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.wall_clock", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--scenarios",
        nargs="+",
        default=list(SCENARIOS),
        help=f"a subset of {' '.join(SCENARIOS)} (default: all; --scenarios=-2,+30 works too)",
    )
    parser.add_argument(
        "--duration",
        type=float,
        default=DEFAULT_DURATION_S,
        help="seconds of faults per scenario (default %(default)s)",
    )
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED)
    parser.add_argument("--workers", type=int, default=DEFAULT_WORKERS)
    parser.add_argument("--connections", type=int, default=DEFAULT_CONNECTIONS)
    parser.add_argument("--keep", action="store_true", help="keep the logs and records")
    args = parser.parse_args(argv)
    try:
        scenarios = parse_scenarios(args.scenarios)
    except ValueError as error:
        parser.error(str(error))
    if args.workers < 2:
        parser.error("--workers must be >= 2 (a fault always leaves one worker untouched)")
    if args.duration <= 0 or args.connections < 1:
        parser.error("--duration and --connections must be positive")
    settings = Settings(args.duration, args.seed, args.workers, args.connections)
    return Arguments(scenarios, settings, args.keep)


def run(arguments: Arguments) -> int:
    """Every scenario on one set of local servers; returns the exit status."""
    work_dir = Path(tempfile.mkdtemp(prefix="wall-clock-"))
    began = time.monotonic()

    def log(text: str) -> None:
        print(f"{time.monotonic() - began:7.2f} s  {text}", file=sys.stderr, flush=True)

    log(f"work dir {work_dir}; machine {json.dumps(machine())}")
    entries: list[dict[str, Any]] = []
    status = EXIT_OK
    with LocalServers(work_dir, feeds=1, feed_rate=RATE) as stack:
        for index, name in enumerate(arguments.scenarios, 1):
            try:
                entry = run_scenario(stack, index, name, arguments.settings, log)
            except Exception as error:
                traceback.print_exc()
                skew = SCENARIOS[name]
                entry = {
                    "scenario": name,
                    "offset_s": skew.offset,
                    "jump_s": skew.jump,
                    "every_s": skew.every,
                    "error": repr(error),
                }
                status = EXIT_ERROR
            entries.append(entry)
            print(scenario_line(entry), flush=True)
    measured = [e for e in entries if not e.get("error")]
    print(
        json.dumps(
            {
                "scenarios": entries,
                "stale_deliveries": sum(e["stale_deliveries"] for e in measured),
                "lost_seqs": sum(e["lost_seqs"] for e in measured),
            },
            separators=(",", ":"),
        ),
        flush=True,
    )
    if status == EXIT_OK and not arguments.keep:
        shutil.rmtree(work_dir, ignore_errors=True)
    else:
        log(f"logs and records kept in {work_dir}")
    return status


def main(argv: list[str] | None = None) -> int:
    arguments = parse_args(argv)
    try:
        with sigterm_as_interrupt():
            return run(arguments)
    except KeyboardInterrupt:
        print("interrupted; every child process has been stopped", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception:
        traceback.print_exc()
        print("wall-clock run failed; every child process has been stopped", file=sys.stderr)
        return EXIT_ERROR


if __name__ == "__main__":
    raise SystemExit(main())
