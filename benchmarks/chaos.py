"""Chaos run: a fleet of real workers under a seeded schedule of faults, then an audit of
every delivery. Exits 0 when the fleet kept its promises, 1 on a violation, 2 when the
run itself could not be carried out, 130 when interrupted.

``python -m benchmarks.chaos`` (120 s, 4 workers, 60 connections, seed 7) or the short
version of the test suite, ``python -m benchmarks.chaos --duration 25 --workers 3
--connections 12``.

Everything runs on loopback with its own DynamoDB Local, moto and feed on free ports,
and scaled timings (lease 2 s: heartbeat 0.5 s, reconcile 0.5 s). Each
worker reaches DynamoDB through its own :class:`~benchmarks.tcp_proxy.TcpProxy`, so one
worker can be cut off. Every worker records each delivery (worker, connection, epoch,
seq, time) with :mod:`benchmarks.handlers`.

Faults, drawn from a deck of all kinds shuffled by the seed (so even a short run applies
each kind), at seeded intervals of 0.5-1.5 leases:

- ``sigkill`` a worker (a replacement starts 0.5-1.5 s later);
- ``sigterm`` a worker (a rolling deploy: a replacement starts likewise);
- ``sigstop`` a worker, ``SIGCONT`` 1.5-2.5 leases later (its leases lapse meanwhile);
- ``blackhole`` a worker's DynamoDB traffic for 0.3-2.5 leases, then heal (held
  requests are delivered late, as TCP would);
- ``delay`` a worker's DynamoDB traffic by 1.5-3 heartbeats for 1-2.5 leases, then
  heal (renews sent during the delay land after newer ones);
- ``scale_out`` (one more worker) and ``scale_in`` (SIGTERM one, not replaced).

A fault targets a worker that is running, started and not already under a fault, and
only while at least one other such worker remains. A third of the connections also
carry an upstream fault that fires every 20-60 messages, on every reconnect: an abrupt
close (``drop_after``), a normal close (``close_after``), a garbage frame, a 2 MiB
frame, or a peer that stops reading and answering pings (``mute_after``). The feed's
``gap_after`` (a deliberate upstream gap) is not used: it would be reported as loss.
Every second connection speaks a registered plug-in protocol (``demo-seq``,
:mod:`benchmarks.seq_plugin`) beside the built-in ``json-seq`` of the others: one fleet,
both kinds, each connection the protocol its start names.

After the fault phase every fault is undone, the fleet is brought back to its size, and
the run waits until every connection is handled again; then every worker is stopped
with SIGTERM. Checks (a failed one is a violation):

- no delivery under a superseded epoch after the newer epoch began;
- no lost seq (every seq from 1 to the highest handled was handled);
- every connection handled again after the faults (nothing stuck);
- no worker exited on its own, and every SIGTERM ended with status 0;
- no lease left held after the final graceful shutdown;
- the connections spread over the live workers within 60 s of the last fault's end:
  the busiest at most ``ceil(1.10 x mean)`` (the balance target in whole connections).

Reported: duplicates (allowed: messages handled after the last checkpoint that reached
DynamoDB before a crash, pause or partition; each blamed on the fault that caused it),
the longest time any started connection went unhandled, faults applied, how
connections ended on the workers.
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import json
import random
import shutil
import signal
import sys
import tempfile
import time
import traceback
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from benchmarks import seq_plugin
from benchmarks.chaos_audit import (
    BALANCE_WITHIN_S,
    Balance,
    Fault,
    Outcome,
    audit,
    is_balanced,
    render,
)
from benchmarks.chaos_plan import (
    DEFAULTS,
    TARGETED,
    Options,
    PlannedConnection,
    PlannedFault,
    plan_connections,
    plan_faults,
)
from benchmarks.profiles import ours
from benchmarks.report import machine
from benchmarks.tcp_proxy import ProxyHandle, ProxyThread
from local_stack.audit import Record, load_records
from local_stack.clock import wait_until
from local_stack.fleet import Deployment
from local_stack.recording import DeliveryTracker
from local_stack.server_group import LocalServers
from local_stack.stop_requests import sigterm_as_interrupt
from local_stack.workers import WORKER_READY_TIMEOUT_S, WorkerProcess, wait_ready

WARMUP_S = 2.0
FIRST_DELIVERY_TIMEOUT_S = 30.0
POLL_S = 0.05

EXIT_OK, EXIT_VIOLATION, EXIT_ERROR, EXIT_INTERRUPTED = 0, 1, 2, 130


@dataclass
class ChaosWorker:
    process: WorkerProcess
    proxy: ProxyHandle
    paused: bool = False
    partitioned: bool = False
    ending: str | None = None
    """Why the run expects this worker to exit (the fault that ends it), if it does."""
    exit_code: int | None = None
    started: bool = False

    @property
    def worker_id(self) -> str:
        return self.process.worker_id

    def healthy(self) -> bool:
        """Running, started, and under no fault."""
        if not self.started and self.process.logged("worker started"):
            self.started = True
        return (
            self.started
            and self.process.alive()
            and not (self.paused or self.partitioned)
            and self.ending is None
        )


class ChaosRun:
    """Applies the plan to a fleet of workers, each behind its own DynamoDB proxy, and
    follows the delivery records to know who handles what."""

    def __init__(
        self,
        options: Options,
        deployment: Deployment,
        proxies: ProxyThread,
        dynamodb_port: int,
        rng: random.Random,
        log: Callable[[str], None],
    ) -> None:
        self.options = options
        self.deployment = deployment
        self.proxies = proxies
        self.dynamodb_port = dynamodb_port
        self.rng = rng
        self.log = log
        self.workers: dict[str, ChaosWorker] = {}
        self.desired = options.workers
        self.outcome = Outcome()
        self.deliveries = DeliveryTracker(deployment.record_dir)
        self._ids = itertools.count(1)
        self._timers: list[tuple[float, int, Callable[[], None]]] = []
        self._timer_ids = itertools.count()

    # --- observing ---------------------------------------------------------------------

    def observe(self) -> list[Record]:
        """Delivery records written since the last call."""
        return self.deliveries.poll()

    def owned(self, worker: ChaosWorker) -> int:
        """How many connections ``worker`` handled last."""
        return len(self.deliveries.handled_by(worker.worker_id))

    # --- workers -----------------------------------------------------------------------

    def launch(self) -> ChaosWorker:
        worker_id = f"w{next(self._ids)}"
        proxy = self.proxies.add(self.dynamodb_port)
        env = self.deployment.worker_env(
            worker_id, ours(self.options.lease_seconds).env, dynamodb_endpoint=proxy.endpoint
        )
        worker = ChaosWorker(self.start_process(worker_id, env), proxy)
        self.workers[worker_id] = worker
        return worker

    def start_process(self, worker_id: str, env: dict[str, str]) -> WorkerProcess:
        """Start one worker process with ``env`` (``python -m worker``; a subclass may
        start another command, as :mod:`benchmarks.wall_clock` does)."""
        return self.deployment.launch_worker(worker_id, env)

    def running(self) -> list[ChaosWorker]:
        """Workers that are alive and not on their way out."""
        return [w for w in self.workers.values() if w.process.alive() and w.ending is None]

    def all_started(self) -> bool:
        """Whether every running worker has started (so a SIGTERM reaches its handler;
        one that arrives while it still imports would just kill it)."""
        for worker in self.running():
            if not worker.started and worker.process.logged("worker started"):
                worker.started = True
        return all(w.started for w in self.running())

    def _replace(self) -> None:
        while len(self.running()) < self.desired:
            worker = self.launch()
            self.log(f"start {worker.worker_id} (replacement)")

    def check_exits(self) -> None:
        """Record every exit; one the run did not cause, or a SIGTERM that did not end
        with status 0, goes into the outcome."""
        for worker in self.workers.values():
            if worker.exit_code is not None:
                continue
            code = worker.process.poll()
            if code is None:
                continue
            worker.exit_code = code
            if worker.ending is None:
                self.outcome.unexpected_exits.append(f"{worker.worker_id} exited with {code}")
                self.log(f"UNEXPECTED: {worker.worker_id} exited with {code}")
            elif worker.ending in ("sigterm", "scale_in", "final") and code != 0:
                self.outcome.unclean_exits.append(
                    f"{worker.worker_id} exited with {code} after SIGTERM"
                )

    # --- faults ------------------------------------------------------------------------

    def _at(self, delay: float, action: Callable[[], None]) -> None:
        heapq.heappush(self._timers, (time.monotonic() + delay, next(self._timer_ids), action))

    def _record(self, kind: str, worker: ChaosWorker | None, detail: str = "") -> int:
        wid = worker.worker_id if worker else None
        self.outcome.faults.append(Fault(kind, wid, time.time(), None, detail))
        self.log(f"{kind} {wid or ''} {detail}".rstrip())
        return len(self.outcome.faults) - 1

    def _close(self, index: int) -> None:
        fault = self.outcome.faults[index]
        self.outcome.faults[index] = Fault(
            fault.kind, fault.worker, fault.start, time.time(), fault.detail
        )

    def _target(self) -> ChaosWorker | None:
        """A healthy worker that handles connections, chosen by the seeded generator;
        None unless another healthy worker would remain untouched."""
        healthy = sorted(
            (w for w in self.workers.values() if w.healthy()), key=lambda w: w.worker_id
        )
        if len(healthy) < 2:
            return None
        busy = [w for w in healthy if self.owned(w) > 0]
        return self.rng.choice(busy or healthy)

    def apply(self, planned: PlannedFault) -> None:
        """Apply one planned fault now (or count it as skipped)."""
        kind = planned.kind
        running = len(self.running())
        if (kind == "scale_out" and running >= self.options.max_workers) or (
            kind == "scale_in" and running <= self.options.min_workers
        ):
            self.outcome.skipped[kind] += 1
            return
        if kind == "scale_out":
            self.desired += 1
            self._record(kind, self.launch())
            return
        target = self._target() if kind in TARGETED else None
        if target is None:
            self.outcome.skipped[kind] += 1
            return
        owns = f"(handles {self.owned(target)})"
        if kind == "sigkill":
            target.ending = kind
            target.process.signal(signal.SIGKILL)
            self._record(kind, target, owns)
            self._at(planned.hold, self._replace)
        elif kind in ("sigterm", "scale_in"):
            target.ending = kind
            target.process.signal(signal.SIGTERM)
            self._record(kind, target, owns)
            if kind == "scale_in":
                self.desired -= 1
            else:
                self._at(planned.hold, self._replace)
        elif kind == "sigstop":
            target.paused = True
            target.process.signal(signal.SIGSTOP)
            index = self._record(kind, target, f"for {planned.hold:.2f} s {owns}")
            self._at(planned.hold, lambda: self._resume(target, index))
        elif kind == "blackhole":
            target.partitioned = True
            target.proxy.blackhole()
            index = self._record(kind, target, f"for {planned.hold:.2f} s {owns}")
            self._at(planned.hold, lambda: self._heal(target, index))
        elif kind == "delay":
            target.partitioned = True
            target.proxy.delay(planned.delay)
            detail = f"{planned.delay:.2f} s for {planned.hold:.2f} s {owns}"
            index = self._record(kind, target, detail)
            self._at(planned.hold, lambda: self._heal(target, index))

    def _resume(self, worker: ChaosWorker, index: int) -> None:
        worker.process.signal(signal.SIGCONT)
        worker.paused = False
        self._close(index)
        self.log(f"sigcont {worker.worker_id}")

    def _heal(self, worker: ChaosWorker, index: int) -> None:
        worker.proxy.heal()
        worker.partitioned = False
        self._close(index)
        self.log(f"heal {worker.worker_id}")

    def run_faults(self, plan: list[PlannedFault], duration: float) -> None:
        """Apply ``plan`` over ``duration`` seconds, firing timers as they fall due."""
        t0 = time.monotonic()
        pending = list(plan)
        end = t0 + duration
        while True:
            self.observe()
            now = time.monotonic()
            while pending and t0 + pending[0].at <= now:
                self.apply(pending.pop(0))
            while self._timers and self._timers[0][0] <= now:
                heapq.heappop(self._timers)[2]()
            self.check_exits()
            if now >= end:
                return
            due = [end]
            if pending:
                due.append(t0 + pending[0].at)
            if self._timers:
                due.append(self._timers[0][0])
            time.sleep(max(0.0, min(POLL_S, min(due) - time.monotonic())))

    def undo_faults(self) -> None:
        """Fire every pending timer now (SIGCONT, heal, replacements), heal every proxy
        and bring the fleet back to its configured size."""
        while self._timers:
            heapq.heappop(self._timers)[2]()
        for worker in self.workers.values():
            if worker.paused:
                worker.process.signal(signal.SIGCONT)
                worker.paused = False
            if worker.partitioned:
                worker.proxy.heal()
                worker.partitioned = False
        self.desired = self.options.workers
        self._replace()

    def stop_all(self) -> None:
        """SIGTERM every worker (SIGCONT first) and wait; their proxies stay up until
        they are gone, so the final releases reach DynamoDB."""
        for worker in self.workers.values():
            if worker.process.alive() and worker.ending is None:
                worker.ending = "final"
        self.deployment.stop_workers()
        self.check_exits()


def wait_balanced(chaos: ChaosRun, since: float) -> Balance:
    """Poll the owners until the live workers' loads are balanced
    (:func:`~benchmarks.chaos_audit.is_balanced`), for up to
    :data:`~benchmarks.chaos_audit.BALANCE_WITHIN_S` after ``since``."""
    loads: dict[str, int] = {}
    while True:
        live = [w.worker_id for w in chaos.running()]
        owners = Counter(item.lease_owner for item in chaos.deployment.items())
        loads = {worker_id: owners.get(worker_id, 0) for worker_id in live}
        now = time.time()
        if sum(loads.values()) == chaos.options.connections and is_balanced(loads):
            return Balance(now - since, loads)
        if now - since > BALANCE_WITHIN_S:
            return Balance(None, loads)
        time.sleep(0.25)


def held_leases(deployment: Deployment) -> list[str]:
    """Ids whose lease still has an owner (a full scan; the table is small)."""
    return sorted(i.connection_id for i in deployment.items() if i.lease_owner is not None)


def endings(workers: list[WorkerProcess]) -> dict[str, int]:
    """How connections ended on the workers ("connection ended" log lines)."""
    counts: Counter[str] = Counter()
    for worker in workers:
        for event in worker.logged("connection ended"):
            counts[str(event.get("ending"))] += 1
    return dict(counts)


# --- main ------------------------------------------------------------------------------


def run(options: Options) -> int:
    """Set up, apply the faults, audit; returns the exit status. Every child process is
    stopped on the way out, whatever happens: workers first (while their proxies still
    forward their final releases), then the proxies, then the servers."""
    rng = random.Random(options.seed)
    plan = plan_faults(rng, options.duration, options.timing)
    planned = plan_connections(rng, options.connections, options.rate, seq_plugin.NAME)
    work_dir = options.work_dir or Path(tempfile.mkdtemp(prefix="chaos-"))
    began = time.monotonic()

    def log(text: str) -> None:
        print(f"{time.monotonic() - began:7.2f} s  {text}", flush=True)

    log(f"work dir {work_dir}; {len(plan)} faults planned; machine {json.dumps(machine())}")
    status = EXIT_ERROR
    with LocalServers(work_dir, feeds=1, feed_rate=options.rate) as stack:
        deployment = stack.deployment(
            "chaos", upstream_protocols={seq_plugin.NAME: seq_plugin.SPEC}
        )
        dynamodb_port = int(stack.endpoints.dynamodb.rsplit(":", 1)[1])
        with ProxyThread() as proxies:
            chaos = ChaosRun(options, deployment, proxies, dynamodb_port, rng, log)
            try:
                status = _drive(options, chaos, stack, plan, planned, log)
            finally:
                chaos.stop_all()
    if status == EXIT_OK and not options.keep and options.work_dir is None:
        shutil.rmtree(work_dir, ignore_errors=True)
    else:
        log(f"logs and records kept in {work_dir}")
    return status


def _drive(
    options: Options,
    chaos: ChaosRun,
    stack: LocalServers,
    plan: list[PlannedFault],
    planned: list[PlannedConnection],
    log: Callable[[str], None],
) -> int:
    deployment = chaos.deployment
    first = [chaos.launch() for _ in range(options.workers)]
    wait_ready([worker.process for worker in first])
    log(f"{len(first)} workers started")
    started_at: dict[str, float] = {}
    for connection in planned:
        started_at[connection.connection_id] = time.time()
        url = stack.feed_url(connection.connection_id, connection.params)
        protocol = None if connection.protocol is None else {"name": connection.protocol}
        deployment.start_connection(connection.connection_id, url, protocol)

    def all_flowing() -> bool:
        chaos.observe()
        return len(chaos.deliveries.latest) == len(planned)

    wait_until(all_flowing, FIRST_DELIVERY_TIMEOUT_S, "a first delivery on every connection")
    log(f"{len(planned)} connections flowing; warming up {WARMUP_S:g} s")
    time.sleep(WARMUP_S)
    log(f"fault phase: {options.duration:g} s")
    chaos.run_faults(plan, options.duration)
    chaos.undo_faults()
    settle_since = time.time()
    log("faults undone; waiting for every connection to be handled again")
    recent: set[str] = set()

    def all_recovered() -> bool:
        recent.update(r.connection_id for r in chaos.observe() if r.t >= settle_since)
        chaos.check_exits()
        return len(recent) == len(planned)

    settle_timeout = max(20.0, 4 * options.timing.crash_failover_bound())
    try:
        wait_until(all_recovered, settle_timeout, "every connection to be handled again")
    except TimeoutError as error:
        log(str(error))  # the audit reports the stuck connections
    measured_until = time.time()
    wait_until(chaos.all_started, WORKER_READY_TIMEOUT_S, "every replacement worker to start")
    balance = wait_balanced(chaos, settle_since)
    log(
        f"not balanced {BALANCE_WITHIN_S:g} s after the faults: {balance.loads}"
        if balance.seconds is None
        else f"balanced {balance.seconds:.1f} s after the faults: {balance.loads}"
    )
    log("stopping every worker (SIGTERM)")
    chaos.stop_all()
    result = audit(
        options=options,
        records=load_records(deployment.record_dir),
        planned=planned,
        started_at=started_at,
        settle_since=settle_since,
        measured_until=measured_until,
        outcome=chaos.outcome,
        held=held_leases(deployment),
        connection_endings=endings(deployment.workers),
        balance=balance,
    )
    print()
    print(render(result))
    print(json.dumps(result, separators=(",", ":"), sort_keys=True))
    return EXIT_VIOLATION if result["violations"] else EXIT_OK


def parse_args(argv: list[str] | None) -> Options:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.chaos", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--duration",
        type=float,
        default=DEFAULTS.duration,
        help="seconds of faults (default %(default)s)",
    )
    parser.add_argument("--seed", type=int, default=DEFAULTS.seed)
    parser.add_argument("--workers", type=int, default=DEFAULTS.workers)
    parser.add_argument("--connections", type=int, default=DEFAULTS.connections)
    parser.add_argument("--lease-seconds", type=float, default=DEFAULTS.lease_seconds)
    parser.add_argument(
        "--rate",
        type=float,
        default=DEFAULTS.rate,
        help="messages/s per connection (default %(default)s)",
    )
    parser.add_argument(
        "--work-dir",
        type=Path,
        default=None,
        help="keep logs and records here (default: a temporary directory, "
        "removed after a clean run)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = parser.parse_args(argv)
    if args.workers < 2:
        parser.error("--workers must be >= 2 (a fault always leaves one worker untouched)")
    if args.duration <= 0 or args.connections < 1 or args.rate <= 0:
        parser.error("--duration, --connections and --rate must be positive")
    return Options(
        duration=args.duration,
        seed=args.seed,
        workers=args.workers,
        connections=args.connections,
        lease_seconds=args.lease_seconds,
        rate=args.rate,
        work_dir=args.work_dir,
        keep=args.keep,
    )


def main(argv: list[str] | None = None) -> int:
    options = parse_args(argv)
    try:
        with sigterm_as_interrupt():
            return run(options)
    except KeyboardInterrupt:
        print("interrupted; every child process has been stopped", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception:
        traceback.print_exc()
        print("chaos run failed; every child process has been stopped", file=sys.stderr)
        return EXIT_ERROR


if __name__ == "__main__":
    raise SystemExit(main())
