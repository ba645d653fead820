"""DynamoDB requests per connection-hour, counted by the run itself.

``python -m benchmarks.ddb_requests [--connections 50] [--window 120]``

Two workers run in this process, built as ``python -m worker`` builds one (``WorkerConfig``,
``make_clients``, ``LeaseStore``, ``Worker``), each on its own table: one with our defaults
(lease 20 s, heartbeat 5 s, reconcile 5 s), one with the seed's timings (reconcile 60 s,
no ``reassign``). botocore event hooks on each worker's DynamoDB client count every call
(``before-call``), every HTTP attempt (``before-send``), and the capacity DynamoDB Local
reports as consumed (``after-call``; the hooks add ``ReturnConsumedCapacity=INDEXES`` to
each request, which changes nothing else). Each call is classified by the expression
it carries, compared with the expressions of :mod:`wsfleet.lease_rules`:

- renew: the heartbeat, which also writes the checkpoint (``last_seq``);
- acquire, release;
- reconcile query (the orphan query on the GSI);
- checkpoint-only write: any write of ``last_seq`` that is not a renew or a release
  (there is none: checkpoints ride on the renews);
- other.

Figures over a steady window (after every connection was acquired): calls per
connection-hour, write units per connection-hour split into table and index, reconcile
queries per worker-hour; acquisitions and releases per connection (the start and the
graceful stop). Beside them, what :mod:`benchmarks.cost_model` predicts. DynamoDB Local
does not report capacity for a failed conditional write (DynamoDB charges one write
unit); there are none in the steady window.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import json
import logging
import os
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.cost_model import Fleet as ModelFleet
from benchmarks.cost_model import load_of
from benchmarks.report import emit, machine, table
from local_stack.fleet import Deployment
from local_stack.process_env import use_local_aws
from local_stack.server_group import LocalServers
from local_stack.stop_requests import sigterm_as_interrupt
from worker.aws_clients import make_clients
from worker.config import WorkerConfig
from worker.delivery import Delivery
from worker.fleet_worker import Worker, WorkerDeps
from worker.upstream_protocol import JsonSeqProtocol
from wsfleet import lease_rules, schema
from wsfleet.lease_rules import Lease
from wsfleet.lease_store import LeaseStore
from wsfleet.timing import LeaseTiming

LEASE_SECONDS = 20.0
AWS_THREADS = 32
SETTLE_TIMEOUT_S = 60.0

RENEW, ACQUIRE, RELEASE = "renew", "acquire", "release"
RECONCILE, CHECKPOINT_ONLY, OTHER = "reconcile query", "checkpoint-only write", "other"
CLASSES = (RENEW, ACQUIRE, RELEASE, RECONCILE, CHECKPOINT_ONLY, OTHER)


def _expressions() -> dict[str, str]:
    """The update expression of each lease write, from the rules themselves."""
    timing = LeaseTiming.from_lease(LEASE_SECONDS)
    lease = Lease("x", "me", 1, 1, "ws://x", 0, 0)
    return {
        lease_rules.renew_update(lease, 0, 0, timing).update_expression: RENEW,
        lease_rules.acquire_update("me", 0, timing, "token").update_expression: ACQUIRE,
        lease_rules.release_update(lease, 0, 0).update_expression: RELEASE,
        lease_rules.release_update(lease, None, 0).update_expression: RELEASE,
    }


EXPRESSIONS = _expressions()


def classify(operation: str, request: dict[str, Any]) -> str:
    """The class of one DynamoDB call from its operation name and request body."""
    if operation == "UpdateItem":
        expression = str(request.get("UpdateExpression", ""))
        if expression in EXPRESSIONS:
            return EXPRESSIONS[expression]
        names = request.get("ExpressionAttributeNames", {}).values()
        return CHECKPOINT_ONLY if schema.LAST_SEQ in names else OTHER
    if operation == "Query" and request.get("IndexName") == schema.STATE_INDEX_NAME:
        return RECONCILE
    return OTHER


def _units() -> dict[str, float]:
    return dict.fromkeys(CLASSES, 0.0)


@dataclass
class Counts:
    """What the hooks counted, per request class."""

    calls: Counter[str] = field(default_factory=Counter)
    attempts: int = 0
    table_units: dict[str, float] = field(default_factory=_units)
    index_units: dict[str, float] = field(default_factory=_units)
    conditional_failures: Counter[str] = field(default_factory=Counter)
    renews_moving_checkpoint: int = 0

    def copy(self) -> Counts:
        return Counts(
            Counter(self.calls),
            self.attempts,
            dict(self.table_units),
            dict(self.index_units),
            Counter(self.conditional_failures),
            self.renews_moving_checkpoint,
        )

    def minus(self, earlier: Counts) -> Counts:
        """What was counted since ``earlier`` (a snapshot of the same counter)."""
        return Counts(
            self.calls - earlier.calls,
            self.attempts - earlier.attempts,
            {k: self.table_units[k] - earlier.table_units[k] for k in CLASSES},
            {k: self.index_units[k] - earlier.index_units[k] for k in CLASSES},
            self.conditional_failures - earlier.conditional_failures,
            self.renews_moving_checkpoint - earlier.renews_moving_checkpoint,
        )

    def write_units(self, *, index: bool) -> float:
        """Write units of every class but the (read) reconcile queries."""
        units = self.index_units if index else self.table_units
        return sum(v for k, v in units.items() if k != RECONCILE)


class RequestCounter:
    """botocore hooks that count a client's DynamoDB calls (thread-safe enough: the
    counters are only incremented, under the GIL, from the worker's executor threads)."""

    def __init__(self) -> None:
        self.counts = Counts()
        self._checkpoints: dict[str, str] = {}

    def register(self, client: Any) -> None:
        events = client.meta.events
        events.register("before-parameter-build.dynamodb.*", self._ask_for_capacity)
        events.register("before-call.dynamodb.*", self._before_call)
        events.register("before-send.dynamodb.*", self._before_send)
        events.register("after-call.dynamodb.*", self._after_call)

    def snapshot(self) -> Counts:
        return self.counts.copy()

    def _ask_for_capacity(self, params: dict[str, Any], model: Any, **_: Any) -> None:
        if model.name in ("UpdateItem", "Query", "GetItem", "PutItem"):
            params["ReturnConsumedCapacity"] = "INDEXES"

    def _before_call(
        self, model: Any, params: dict[str, Any], context: dict[str, Any], **_: Any
    ) -> None:
        body = params.get("body") or b"{}"
        request = json.loads(body)
        kind = classify(model.name, request)
        context["request_class"] = kind
        self.counts.calls[kind] += 1
        if kind == RENEW:
            key = json.dumps(request.get("Key"), sort_keys=True)
            seq = json.dumps(request.get("ExpressionAttributeValues", {}).get(":seq"))
            if self._checkpoints.get(key) != seq:
                self.counts.renews_moving_checkpoint += 1
            self._checkpoints[key] = seq

    def _before_send(self, **_: Any) -> None:
        self.counts.attempts += 1

    def _after_call(self, parsed: dict[str, Any], context: dict[str, Any], **_: Any) -> None:
        kind = context.get("request_class", OTHER)
        if parsed.get("Error", {}).get("Code") == "ConditionalCheckFailedException":
            self.counts.conditional_failures[kind] += 1
        consumed = parsed.get("ConsumedCapacity") or {}
        self.counts.table_units[kind] += float(consumed.get("Table", {}).get("CapacityUnits", 0))
        for index in (consumed.get("GlobalSecondaryIndexes") or {}).values():
            self.counts.index_units[kind] += float(index.get("CapacityUnits", 0))


class CountingHandler:
    """A no-op handler that counts what it was given."""

    def __init__(self) -> None:
        self.messages = 0

    async def handle(self, delivery: Delivery) -> None:
        self.messages += 1


@dataclass
class InProcessWorker:
    name: str
    config: WorkerConfig
    worker: Worker
    counter: RequestCounter
    handler: CountingHandler
    deployment: Deployment


def build(
    name: str, env: dict[str, str], deployment: Deployment, work_dir: Path
) -> InProcessWorker:
    """A worker built as ``python -m worker`` builds one, with counting hooks."""
    config = WorkerConfig.from_env(
        {
            "TABLE_NAME": deployment.table,
            "QUEUE_URL": deployment.queue_url,
            "WORKER_ID": f"{name}-worker",
            "HEALTH_FILE": str(work_dir / f"{name}.alive"),
            "SQS_WAIT_SECONDS": "10",
            "METRICS_INTERVAL_SECONDS": "60",
            **env,
        }
    )
    clients = make_clients(
        config.timing, sqs_wait_seconds=config.sqs_wait_seconds, pool_size=AWS_THREADS
    )
    counter = RequestCounter()
    counter.register(clients.dynamodb)
    handler = CountingHandler()
    store = LeaseStore(clients.dynamodb, config.table_name, config.timing)
    deps = WorkerDeps(store=store, sqs=clients.sqs, handler=handler, protocol=JsonSeqProtocol())
    return InProcessWorker(name, config, Worker(config, deps), counter, handler, deployment)


async def drive(
    workers: list[InProcessWorker], stack: LocalServers, connections: int, window: float
) -> dict[str, tuple[Counts, Counts, float, int]]:
    """Run the workers; per worker: counts over the steady window, counts of the whole
    run, the window's length, messages handled in the window."""
    loop = asyncio.get_running_loop()
    loop.set_default_executor(ThreadPoolExecutor(AWS_THREADS, thread_name_prefix="aws"))
    stops = {w.name: asyncio.Event() for w in workers}
    tasks = [asyncio.create_task(w.worker.run(stops[w.name])) for w in workers]
    try:
        for w in workers:
            for i in range(connections):
                cid = f"{w.name}-{i}"
                url = stack.feed_url(cid, {"rate": 1})
                await loop.run_in_executor(None, w.deployment.start_connection, cid, url)
        deadline = time.monotonic() + SETTLE_TIMEOUT_S
        while any(len(w.worker.owned()) < connections for w in workers):
            if time.monotonic() > deadline:
                raise TimeoutError("the workers did not acquire every connection")
            await asyncio.sleep(0.1)
        # One heartbeat in, every connection has started its renew cycle.
        await asyncio.sleep(max(w.config.timing.heartbeat for w in workers))
        before = {w.name: (w.counter.snapshot(), w.handler.messages) for w in workers}
        started = time.monotonic()
        await asyncio.sleep(window)
        seconds = time.monotonic() - started
        after = {w.name: (w.counter.snapshot(), w.handler.messages) for w in workers}
    finally:
        for stop in stops.values():
            stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
    return {
        w.name: (
            after[w.name][0].minus(before[w.name][0]),
            w.counter.snapshot(),
            seconds,
            after[w.name][1] - before[w.name][1],
        )
        for w in workers
    }


def figures(
    w: InProcessWorker,
    steady: Counts,
    whole: Counts,
    seconds: float,
    connections: int,
    messages: int,
) -> dict[str, Any]:
    connection_hours = connections * seconds / 3600
    worker_hours = seconds / 3600
    model = load_of(ModelFleet(connections, 1, w.config.timing))
    per_hour = {k: round(steady.calls[k] / connection_hours, 1) for k in CLASSES}
    return {
        "timing": {
            "lease_s": w.config.timing.lease,
            "heartbeat_s": w.config.timing.heartbeat,
            "reconcile_s": w.config.timing.reconcile,
        },
        "window_s": round(seconds, 1),
        "connections": connections,
        "messages_in_window": messages,
        "calls_in_window": dict(steady.calls),
        "calls_per_connection_hour": per_hour,
        "all_calls_per_connection_hour": round(sum(steady.calls.values()) / connection_hours, 1),
        "http_attempts_in_window": steady.attempts,
        "renews_moving_the_checkpoint": steady.renews_moving_checkpoint,
        "checkpoint_only_writes": steady.calls[CHECKPOINT_ONLY],
        "write_units_per_connection_hour": {
            "table": round(steady.write_units(index=False) / connection_hours, 1),
            "index": round(steady.write_units(index=True) / connection_hours, 1),
        },
        "reconcile_queries_per_worker_hour": round(steady.calls[RECONCILE] / worker_hours, 1),
        "read_units_per_worker_hour": round(steady.index_units[RECONCILE] / worker_hours, 1),
        "conditional_failures_in_window": dict(steady.conditional_failures),
        "whole_run": {
            "acquire_per_connection": round(whole.calls[ACQUIRE] / connections, 2),
            "release_per_connection": round(whole.calls[RELEASE] / connections, 2),
            "write_units_per_acquire": round(
                (whole.table_units[ACQUIRE] + whole.index_units[ACQUIRE])
                / max(1, whole.calls[ACQUIRE]),
                2,
            ),
            "write_units_per_release": round(
                (whole.table_units[RELEASE] + whole.index_units[RELEASE])
                / max(1, whole.calls[RELEASE]),
                2,
            ),
        },
        "model": {
            "renews_per_connection_hour": round(model.renews_per_second * 3600 / connections, 1),
            "write_units_per_connection_hour": round(
                model.write_units_per_second * 3600 / connections, 1
            ),
            "reconcile_queries_per_worker_hour": round(3600 / w.config.timing.reconcile, 1),
            "read_units_per_worker_hour": round(model.reads_per_second * 3600, 1),
        },
    }


def run(args: argparse.Namespace, work_dir: Path) -> dict[str, Any]:
    profiles = {
        "ours": {"LEASE_SECONDS": repr(LEASE_SECONDS)},
        "seed": {
            "LEASE_SECONDS": repr(LEASE_SECONDS),
            "RECONCILE_SECONDS": repr(3 * LEASE_SECONDS),
            "REASSIGN_ON_RELEASE": "false",
        },
    }
    with LocalServers(work_dir, feeds=1, feed_rate=1.0) as stack:
        # The workers run in this process: boto3 reads endpoints and credentials from
        # its environment, as in a deployment.
        use_local_aws(os.environ, stack.endpoints)
        workers = [
            build(name, env, stack.deployment(name), work_dir) for name, env in profiles.items()
        ]
        # The workers' EMF lines go to stdout: keep this command's output readable.
        with contextlib.redirect_stdout(io.StringIO()):
            measured = asyncio.run(drive(workers, stack, args.connections, args.window))
    return {
        "benchmark": "ddb_requests",
        "profiles": {
            w.name: figures(w, *measured[w.name][:3], args.connections, measured[w.name][3])
            for w in workers
        },
        "machine": machine(),
    }


def per_lifecycle(profile: dict[str, Any]) -> str:
    whole = profile["whole_run"]
    return f"{whole['write_units_per_acquire']} / {whole['write_units_per_release']}"


def render(result: dict[str, Any]) -> str:
    ours, seed = result["profiles"]["ours"], result["profiles"]["seed"]
    rows: list[list[object]] = []
    for kind in (RENEW, ACQUIRE, RELEASE, CHECKPOINT_ONLY, OTHER):
        rows.append(
            [
                f"{kind} calls / connection-hour",
                ours["calls_per_connection_hour"][kind],
                seed["calls_per_connection_hour"][kind],
                ours["model"]["renews_per_connection_hour"] if kind == RENEW else "",
            ]
        )
    rows += [
        [
            "write units / connection-hour: table",
            ours["write_units_per_connection_hour"]["table"],
            seed["write_units_per_connection_hour"]["table"],
            ours["model"]["renews_per_connection_hour"],
        ],
        [
            "write units / connection-hour: index",
            ours["write_units_per_connection_hour"]["index"],
            seed["write_units_per_connection_hour"]["index"],
            2 * ours["model"]["renews_per_connection_hour"],
        ],
        [
            "renews that moved the checkpoint",
            ours["renews_moving_the_checkpoint"],
            seed["renews_moving_the_checkpoint"],
            "",
        ],
        [
            "reconcile queries / worker-hour",
            ours["reconcile_queries_per_worker_hour"],
            seed["reconcile_queries_per_worker_hour"],
            f"{ours['model']['reconcile_queries_per_worker_hour']} / "
            f"{seed['model']['reconcile_queries_per_worker_hour']}",
        ],
        [
            "read units / worker-hour",
            ours["read_units_per_worker_hour"],
            seed["read_units_per_worker_hour"],
            f"{ours['model']['read_units_per_worker_hour']} / "
            f"{seed['model']['read_units_per_worker_hour']}",
        ],
        [
            "acquisitions / connection (start)",
            ours["whole_run"]["acquire_per_connection"],
            seed["whole_run"]["acquire_per_connection"],
            "",
        ],
        [
            "releases / connection (graceful stop)",
            ours["whole_run"]["release_per_connection"],
            seed["whole_run"]["release_per_connection"],
            "",
        ],
        [
            "write units per acquire / release",
            per_lifecycle(ours),
            per_lifecycle(seed),
            "3 / 3",
        ],
    ]
    return table(["figure (steady window)", "ours", "seed", "cost model"], rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.ddb_requests", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--connections", type=int, default=50, help="per worker")
    parser.add_argument("--window", type=float, default=120.0, help="steady seconds counted")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    try:
        with sigterm_as_interrupt(), tempfile.TemporaryDirectory(prefix="ddb-requests-") as tmp:
            result = run(args, Path(tmp))
    except KeyboardInterrupt:
        print("interrupted; every child process has been stopped", file=sys.stderr)
        return 130
    ours = result["profiles"]["ours"]
    emit(
        f"DynamoDB requests, {args.connections} connections per worker, "
        f"{ours['window_s']:g} s steady window (lease 20 s, heartbeat 5 s)",
        render(result),
        result,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
