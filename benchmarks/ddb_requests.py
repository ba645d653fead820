"""DynamoDB capacity per connection-hour of one worker, metered on every call.

``python -m benchmarks.ddb_requests [--connections 500] [--window 120] [--rate 1]``

One worker runs in this process, built as ``python -m worker`` builds one
(``WorkerConfig``, ``make_clients``, ``LeaseStore``, a ``SessionStore`` on the shared
client and one on the renew's own client, ``Worker``), at the shipped defaults: no
timing variable is set (lease 2.2 s, heartbeat and reconcile 0.594 s, checkpoint 5 s)
and ``MAX_CONNECTIONS`` is 500. Its connections are started through the router's HTTP
API without an id, so the router makes them (uuid4 hex), each on a stream of the demo
feed at ``--rate`` messages a second.

botocore hooks on both of the worker's DynamoDB clients meter every call:

- ``before-parameter-build`` adds ``ReturnConsumedCapacity=INDEXES`` (nothing else
  changes) and classifies the call by its key and expression (session renew, page,
  acquire, release, session listing, ``by-owner`` query...);
- ``after-call`` computes what DynamoDB bills for it, by the rules of
  :mod:`benchmarks.cost_model`: a write on the larger of the item before and after
  per started KB, plus each index entry it puts, deletes or updates; a failed
  conditional write on the item that is there (at least 1); a Query on the total size
  of the items (index entries) it returns, per started 4 KB, half when eventually
  consistent; a GetItem likewise. The items before and after come from the call
  itself (``ALL_OLD``/``ALL_NEW``, the request's item) or from the meter's own copy of
  what it last saw; when it has none, from a strongly consistent read on a separate,
  unmetered client. Beside it, what DynamoDB Local reports as consumed.

Figures over a steady window that begins once every connection has handled a message
and one checkpoint interval has passed: write and read units per connection-hour, by
kind, the on-demand dollars per connection-month, and what ``benchmarks.cost_model``
predicts for the same worker.
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
import threading
import time
import zlib
from collections import defaultdict
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from botocore.config import Config

from benchmarks import cost_model as cm
from benchmarks.report import emit, machine, table
from fleetctl.client import FleetClient
from local_stack import services
from local_stack.fleet import Deployment
from local_stack.process_env import use_local_aws
from local_stack.server_group import LocalServers
from local_stack.stop_requests import sigterm_as_interrupt
from worker.aws_clients import make_clients
from worker.config import WorkerConfig
from worker.delivery import Delivery
from worker.fleet_worker import Worker, WorkerDeps
from worker.upstream_protocol import JsonSeqProtocol
from wsfleet import lease_rules, schema, session_rules
from wsfleet.item import ConnectionItem
from wsfleet.lease_rules import Lease
from wsfleet.lease_store import LeaseStore
from wsfleet.session_store import SessionStore
from wsfleet.timing import LeaseTiming

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient

AWS_THREADS = 32
START_THREADS = 4
START_TIMEOUT_S = 120.0
SETTLE_TIMEOUT_S = 300.0

# --- what a call is -----------------------------------------------------------------------

RENEW, SESSION_OPEN, SESSION_END, NOTICE = (
    "session renew",
    "session open",
    "session reap/retire/forget",
    "notice",
)
PAGE = "page"
ACQUIRE, TAKEOVER, RELEASE, CONNECTION_OTHER = (
    "acquire",
    "takeover",
    "release",
    "other connection write",
)
OTHER_WRITE = "other write"
SESSION_LIST, OWNER_QUERY, UNOWNED_QUERY, LISTING_QUERY = (
    "session listing",
    "by-owner query",
    "unowned query",
    "by-desired-state query",
)
PAGE_READ, CONNECTION_READ, SESSION_READ, OTHER_READ = (
    "page read",
    "connection read",
    "session read",
    "other read",
)
WRITE_KINDS = (
    RENEW,
    PAGE,
    SESSION_OPEN,
    SESSION_END,
    NOTICE,
    ACQUIRE,
    TAKEOVER,
    RELEASE,
    CONNECTION_OTHER,
    OTHER_WRITE,
)
READ_KINDS = (
    SESSION_LIST,
    OWNER_QUERY,
    UNOWNED_QUERY,
    LISTING_QUERY,
    PAGE_READ,
    CONNECTION_READ,
    SESSION_READ,
    OTHER_READ,
)
WRITE_OPERATIONS = ("PutItem", "UpdateItem", "DeleteItem")
CAPACITY_OPERATIONS = (*WRITE_OPERATIONS, "GetItem", "Query", "Scan")
CONDITION_FAILED = "ConditionalCheckFailedException"
TABLE = "table"


def _connection_expressions() -> dict[str, str]:
    """The update expression of each connection write, from the rules themselves."""
    lease = Lease("x", "me", 1, 1, "ws://x", 0, 1)
    seen = ConnectionItem("x", schema.STARTED, "ws://x", lease_owner="dead", owner_session_gen=1)
    expressions = {
        lease_rules.acquire_update("x", "me", 1, 0, "t").update_expression: ACQUIRE,
        lease_rules.takeover_update(seen, "me", 1, 0, 0, "t").update_expression: TAKEOVER,
    }
    for started in (True, False):
        for seq in (0, None):
            update = lease_rules.release_update(lease, seq, 0, started=started)
            expressions[update.update_expression] = RELEASE
    for update in (
        lease_rules.park_update(lease, 0, "r", 0),
        lease_rules.clear_owner_update(seen, 0),
        lease_rules.failing_since_update(lease, 0, 0),
        lease_rules.failing_cleared_update(lease, 0),
    ):
        expressions.setdefault(update.update_expression, CONNECTION_OTHER)
    return expressions


CONNECTION_EXPRESSIONS = _connection_expressions()
RENEW_EXPRESSION = session_rules.renew_update(
    0, LeaseTiming.from_lease(), connections=0
).update_expression.split(" ADD ")[0]
"""What every renew's expression starts with (a capacity, a beat and acted notices
follow)."""
NOTICE_EXPRESSION = session_rules.notice_update("x").update_expression


def _partition_key(params: Mapping[str, Any]) -> str:
    key = params.get("Key") or params.get("Item") or {}
    return str(key.get(schema.PARTITION_KEY, {}).get("S", ""))


def classify(operation: str, params: Mapping[str, Any]) -> str:
    """The kind of one DynamoDB call, from its operation and request parameters."""
    pk = _partition_key(params)
    if operation in WRITE_OPERATIONS:
        expression = str(params.get("UpdateExpression", ""))
        if pk.startswith(schema.SESSION_KEY_PREFIX):
            if operation == "PutItem":
                return SESSION_OPEN
            if expression.startswith(RENEW_EXPRESSION):
                return RENEW
            return NOTICE if expression == NOTICE_EXPRESSION else SESSION_END
        if pk.startswith(schema.PAGE_KEY_PREFIX):
            return PAGE if operation == "PutItem" else SESSION_END
        if pk.startswith(schema.KEY_PREFIX):
            return CONNECTION_EXPRESSIONS.get(expression, CONNECTION_OTHER)
        return OTHER_WRITE
    if operation == "Query":
        index = params.get("IndexName")
        if index == schema.OWNER_INDEX_NAME:
            return OWNER_QUERY
        if index == schema.UNOWNED_INDEX_NAME:
            return UNOWNED_QUERY
        if index == schema.STATE_INDEX_NAME:
            return LISTING_QUERY
        values = params.get("ExpressionAttributeValues", {}).values()
        if any(str(v.get("S", "")).startswith(schema.SESSION_KEY_PREFIX) for v in values):
            return SESSION_LIST
        return OTHER_READ
    if operation == "GetItem":
        if pk.startswith(schema.PAGE_KEY_PREFIX):
            return PAGE_READ
        if pk.startswith(schema.KEY_PREFIX):
            return CONNECTION_READ
        if pk.startswith(schema.SESSION_KEY_PREFIX):
            return SESSION_READ
    return OTHER_READ


# --- the meter ----------------------------------------------------------------------------

Item = dict[str, Any]


@dataclass
class Tally:
    """Sums per (kind, figure): ``calls``, ``failed`` (conditions), ``errors``,
    ``computed:<table or index>`` and ``consumed:<table or index>`` units, ``reported``
    (responses that carried consumed capacity)."""

    sums: dict[tuple[str, str], float] = field(default_factory=lambda: defaultdict(float))

    def add(self, kind: str, figure: str, value: float = 1.0) -> None:
        self.sums[(kind, figure)] += value

    def get(self, kind: str, figure: str) -> float:
        return self.sums.get((kind, figure), 0.0)

    def copy(self) -> Tally:
        return Tally(defaultdict(float, self.sums))

    def minus(self, earlier: Tally) -> Tally:
        keys = set(self.sums) | set(earlier.sums)
        return Tally(defaultdict(float, {k: self.get(*k) - earlier.get(*k) for k in keys}))

    def units(self, kind: str, source: str) -> float:
        """Computed (``source="computed"``) or reported units of ``kind``, table and
        indexes together."""
        return sum(v for (k, f), v in self.sums.items() if k == kind and f.startswith(source + ":"))

    def by_target(self, kinds: tuple[str, ...], source: str) -> dict[str, float]:
        """Units per table or index over ``kinds``."""
        out: dict[str, float] = defaultdict(float)
        for (k, f), v in self.sums.items():
            if k in kinds and f.startswith(source + ":"):
                out[f.split(":", 1)[1]] += v
        return dict(out)

    def total(self, kinds: tuple[str, ...], figure: str) -> float:
        if figure in ("computed", "consumed"):
            return sum(self.units(k, figure) for k in kinds)
        return sum(self.get(k, figure) for k in kinds)


@dataclass(frozen=True, slots=True)
class PageWrite:
    entries: int
    blob_bytes: int
    item_bytes: int
    units: int


def _key_of(params: Mapping[str, Any]) -> Item:
    if "Key" in params:
        return dict(params["Key"])
    item = params.get("Item", {})
    return {k: item[k] for k in (schema.PARTITION_KEY, schema.SORT_KEY) if k in item}


class Meter:
    """botocore hooks that meter every DynamoDB call of the clients registered, and the
    meter's copy of the items they wrote. Thread-safe: the worker calls from its
    executor threads and its renew thread at once."""

    def __init__(self, inspector: DynamoDBClient) -> None:
        self._inspector = inspector
        self._lock = threading.Lock()
        self._tally = Tally()
        self._items: dict[tuple[str, str], Item | None] = {}
        self.attempts = 0
        self.pages: list[PageWrite] = []

    def register(self, client: Any) -> None:
        events = client.meta.events
        events.register("before-parameter-build.dynamodb.*", self._before)
        events.register("before-send.dynamodb.*", self._before_send)
        events.register("after-call.dynamodb.*", self._after)
        events.register("after-call-error.dynamodb.*", self._after_error)

    def snapshot(self) -> Tally:
        with self._lock:
            return self._tally.copy()

    # --- hooks -----------------------------------------------------------------------

    def _before(
        self, params: dict[str, Any], model: Any, context: dict[str, Any], **_: Any
    ) -> None:
        operation = model.name
        if operation in CAPACITY_OPERATIONS:
            params["ReturnConsumedCapacity"] = "INDEXES"
        call: dict[str, Any] = {
            "operation": operation,
            "params": dict(params),
            "kind": classify(operation, params),
        }
        context["meter"] = call
        if operation not in WRITE_OPERATIONS:
            return
        if operation == "UpdateItem" and params.get("ReturnValues") == "ALL_OLD":
            return  # the answer carries the item before the write
        slot = self._slot(params)
        with self._lock:
            known = slot in self._items
        if not known:
            call["old"] = self._read(params["TableName"], _key_of(params))

    def _before_send(self, **_: Any) -> None:
        with self._lock:
            self.attempts += 1

    def _after_error(self, context: dict[str, Any], **_: Any) -> None:
        call = context.get("meter")
        if call is not None:
            with self._lock:
                self._tally.add(call["kind"], "calls")
                self._tally.add(call["kind"], "errors")

    def _after(self, parsed: dict[str, Any], context: dict[str, Any], **_: Any) -> None:
        call = context.get("meter")
        if call is None:
            return
        kind, operation, params = call["kind"], call["operation"], call["params"]
        error = parsed.get("Error", {}).get("Code")
        consumed = parsed.get("ConsumedCapacity") or {}
        computed: dict[str, float] = {}
        page: PageWrite | None = None
        slot = self._slot(params)
        if error == CONDITION_FAILED:
            existing = parsed.get("Item") or call.get("old") or self._known(slot)
            computed[TABLE] = cm.failed_write_units(existing)
            if parsed.get("Item"):
                self._remember(slot, parsed["Item"])
        elif error is None and operation in WRITE_OPERATIONS:
            old, new = self._before_and_after(call, parsed, slot)
            cost = cm.write_cost(old, new)
            computed = {TABLE: cost.table, **cost.indexes}
            self._remember(slot, new)
            if kind == PAGE and new is not None:
                page = _page_write(new, cost.table)
        elif error is None and operation in ("Query", "GetItem"):
            items = parsed.get("Items", []) if operation == "Query" else [parsed.get("Item")]
            size = sum(cm.item_size(item) for item in items)
            consistent = bool(params.get("ConsistentRead", False))
            computed[params.get("IndexName") or TABLE] = cm.read_units(size, consistent=consistent)
            if operation == "GetItem" and consistent:
                self._remember(slot, parsed.get("Item"))
        with self._lock:
            tally = self._tally
            tally.add(kind, "calls")
            if error == CONDITION_FAILED:
                tally.add(kind, "failed")
            elif error is not None:
                tally.add(kind, "errors")
            for target, units in computed.items():
                tally.add(kind, f"computed:{target}", units)
            if consumed:
                tally.add(kind, "reported")
                table_units = float(consumed.get("Table", {}).get("CapacityUnits", 0.0))
                tally.add(kind, f"consumed:{TABLE}", table_units)
                for name, index in (consumed.get("GlobalSecondaryIndexes") or {}).items():
                    tally.add(kind, f"consumed:{name}", float(index.get("CapacityUnits", 0.0)))
            if page is not None:
                self.pages.append(page)

    # --- the meter's copy of the items ------------------------------------------------

    @staticmethod
    def _slot(params: Mapping[str, Any]) -> tuple[str, str]:
        key = _key_of(params)
        return (str(params.get("TableName")), json.dumps(key, sort_keys=True, default=str))

    def _known(self, slot: tuple[str, str]) -> Item | None:
        with self._lock:
            return self._items.get(slot)

    def _remember(self, slot: tuple[str, str], item: Item | None) -> None:
        with self._lock:
            self._items[slot] = item

    def _read(self, table_name: str, key: Item) -> Item | None:
        item: Item | None = self._inspector.get_item(
            TableName=table_name, Key=key, ConsistentRead=True
        ).get("Item")
        return item

    def _before_and_after(
        self, call: Mapping[str, Any], parsed: Mapping[str, Any], slot: tuple[str, str]
    ) -> tuple[Item | None, Item | None]:
        operation, params = call["operation"], call["params"]
        returned = parsed.get("Attributes")
        if operation == "UpdateItem" and params.get("ReturnValues") == "ALL_OLD":
            old = returned
        else:
            old = call["old"] if "old" in call else self._known(slot)
        if operation == "PutItem":
            return old, params["Item"]
        if operation == "DeleteItem":
            return old, None
        if params.get("ReturnValues") == "ALL_NEW":
            return old, returned
        return old, self._read(params["TableName"], _key_of(params))


def _page_write(item: Mapping[str, Any], units: int) -> PageWrite:
    blob = bytes(item[schema.PAGE_ENTRIES]["B"])
    return PageWrite(
        entries=len(json.loads(zlib.decompress(blob))),
        blob_bytes=len(blob),
        item_bytes=cm.item_size(item),
        units=units,
    )


# --- the worker and its connections -------------------------------------------------------


class CountingHandler:
    """A no-op handler that counts what it was given, per connection."""

    def __init__(self) -> None:
        self.messages = 0
        self.by_connection: dict[str, int] = defaultdict(int)

    async def handle(self, delivery: Delivery) -> None:
        self.messages += 1
        self.by_connection[delivery.connection_id] += 1


@dataclass
class InProcessWorker:
    config: WorkerConfig
    worker: Worker
    meter: Meter
    handler: CountingHandler


def build(deployment: Deployment, work_dir: Path, inspector: DynamoDBClient) -> InProcessWorker:
    """A worker built as ``python -m worker`` builds one, with the meter on both of
    its DynamoDB clients; no timing variable is set, nor ``WORKER_ID`` (the default id:
    host, pid and a random suffix)."""
    config = WorkerConfig.from_env(
        {
            "TABLE_NAME": deployment.table,
            "QUEUE_URL": deployment.queue_url,
            "HEALTH_FILE": str(work_dir / "worker.alive"),
            "SQS_WAIT_SECONDS": "10",
            "METRICS_INTERVAL_SECONDS": "60",
        }
    )
    clients = make_clients(
        config.timing, sqs_wait_seconds=config.sqs_wait_seconds, pool_size=AWS_THREADS
    )
    meter = Meter(inspector)
    meter.register(clients.dynamodb)
    meter.register(clients.renewals)
    handler = CountingHandler()
    deps = WorkerDeps(
        store=LeaseStore(clients.dynamodb, config.table_name, config.timing),
        sessions=SessionStore(clients.dynamodb, config.table_name, config.timing),
        renewals=SessionStore(clients.renewals, config.table_name, config.timing),
        sqs=clients.sqs,
        sqs_poll=clients.sqs_poll,
        handler=handler,
        protocol=JsonSeqProtocol(),
    )
    return InProcessWorker(config, Worker(config, deps), meter, handler)


def start_connections(
    deployment: Deployment, stack: LocalServers, count: int, rate: float
) -> list[str]:
    """Start ``count`` connections through the router, which makes their ids."""

    # A start without an id is not safe to retry (a lost answer would leave a second
    # connection behind): wait long for each answer instead, on a loaded machine too.
    api = FleetClient(deployment.api.api_url, timeout=START_TIMEOUT_S)

    def start(n: int) -> str:
        answer = api.start(stack.feed_url(f"stream-{n}", {"rate": rate}))
        return str(answer["connection_id"])

    with ThreadPoolExecutor(START_THREADS, thread_name_prefix="start") as pool:
        return list(pool.map(start, range(count)))


@dataclass
class Measured:
    steady: Tally
    whole: Tally
    seconds: float
    messages: int
    connection_ids: list[str]
    held_at_end: int
    settle_seconds: float
    pages: list[PageWrite]


async def drive(
    w: InProcessWorker, deployment: Deployment, stack: LocalServers, args: argparse.Namespace
) -> Measured:
    loop = asyncio.get_running_loop()
    loop.set_default_executor(ThreadPoolExecutor(AWS_THREADS, thread_name_prefix="aws"))
    stop = asyncio.Event()
    task = asyncio.create_task(w.worker.run(stop))
    began = time.monotonic()
    try:
        ids = await loop.run_in_executor(
            None, start_connections, deployment, stack, args.connections, args.rate
        )
        deadline = time.monotonic() + SETTLE_TIMEOUT_S
        while len(w.worker.owned()) < len(ids) or any(
            w.handler.by_connection.get(cid, 0) == 0 for cid in ids
        ):
            if time.monotonic() > deadline or task.done():
                raise TimeoutError(
                    f"{len(w.worker.owned())} of {len(ids)} connections held and"
                    f" {sum(1 for c in ids if w.handler.by_connection.get(c))} handling"
                    f" after {SETTLE_TIMEOUT_S:g} s"
                )
            await asyncio.sleep(0.2)
        # One checkpoint interval and one pass more: the page holds every connection.
        timing = w.config.timing
        await asyncio.sleep(timing.checkpoint + timing.reconcile)
        settle = time.monotonic() - began
        before, messages_before = w.meter.snapshot(), w.handler.messages
        pages_before = len(w.meter.pages)
        started = time.monotonic()
        await asyncio.sleep(args.window)
        seconds = time.monotonic() - started
        after, messages_after = w.meter.snapshot(), w.handler.messages
        held = len(w.worker.owned())
        pages = w.meter.pages[pages_before:]
    finally:
        stop.set()
        await asyncio.gather(task, return_exceptions=True)
    return Measured(
        steady=after.minus(before),
        whole=w.meter.snapshot(),
        seconds=seconds,
        messages=messages_after - messages_before,
        connection_ids=ids,
        held_at_end=held,
        settle_seconds=settle,
        pages=pages,
    )


# --- figures ------------------------------------------------------------------------------


def _round(value: float, digits: int = 2) -> float:
    return round(value, digits)


def _per_call(tally: Tally, kind: str) -> float:
    calls = tally.get(kind, "calls")
    return tally.units(kind, "computed") / calls if calls else 0.0


def _passes(tally: Tally) -> float:
    """Reconcile passes: each lists every session partition once."""
    return tally.get(SESSION_LIST, "calls") / schema.SESSION_SHARDS


def cadence(steady: Tally, seconds: float, timing: LeaseTiming) -> dict[str, Any]:
    """Seconds between session renews, page writes and reconcile passes, measured and
    nominal (a pass's own duration adds to its jittered sleep; a page's write to the
    checkpoint interval)."""

    def every(calls: float) -> float | None:
        return _round(seconds / calls, 3) if calls else None

    return {
        "renew_every_s": every(steady.get(RENEW, "calls")),
        "page_every_s": every(steady.get(PAGE, "calls")),
        "pass_every_s": every(_passes(steady)),
        "nominal": {
            "renew_every_s": timing.heartbeat,
            "page_every_s": timing.checkpoint,
            "pass_every_s": timing.reconcile,
        },
    }


def at_nominal_cadence(steady: Tally, timing: LeaseTiming, connections: int) -> dict[str, float]:
    """The measured units per renew, per page and per pass, at the nominal cadence
    (what an idle machine approaches from below)."""
    passes = _passes(steady)
    per_pass = (
        sum(steady.units(k, "computed") for k in (SESSION_LIST, OWNER_QUERY, UNOWNED_QUERY))
        / passes
        if passes
        else 0.0
    )
    per_hour = cm.SECONDS_PER_HOUR / connections
    renew = _per_call(steady, RENEW) * per_hour / timing.heartbeat
    page = _per_call(steady, PAGE) * per_hour / timing.checkpoint
    reads = per_pass * per_hour / timing.reconcile
    return {
        "renew_units_per_call": _round(_per_call(steady, RENEW)),
        "page_units_per_call": _round(_per_call(steady, PAGE)),
        "read_units_per_pass": _round(per_pass),
        "write_units_per_connection_hour": _round(renew + page),
        "session_renew": _round(renew),
        "page": _round(page),
        "read_units_per_connection_hour": _round(reads),
        "per_connection_month_usd_on_demand": round(
            cm.per_connection_month_usd(renew + page, reads), 4
        ),
    }


def figures(w: InProcessWorker, m: Measured, connections: int) -> dict[str, Any]:
    timing = w.config.timing
    connection_hours = connections * m.seconds / cm.SECONDS_PER_HOUR
    steady = m.steady

    def per_hour(value: float) -> float:
        return _round(value / connection_hours)

    kinds = [k for k in (*WRITE_KINDS, *READ_KINDS) if steady.get(k, "calls")]
    by_kind = {
        kind: {
            "calls_per_connection_hour": per_hour(steady.get(kind, "calls")),
            "computed_units_per_connection_hour": per_hour(steady.units(kind, "computed")),
            "reported_units_per_connection_hour": per_hour(steady.units(kind, "consumed")),
            "calls": int(steady.get(kind, "calls")),
            "calls_with_reported_capacity": int(steady.get(kind, "reported")),
            "failed_conditions": int(steady.get(kind, "failed")),
            "errors": int(steady.get(kind, "errors")),
        }
        for kind in kinds
    }
    others = tuple(k for k in WRITE_KINDS if k not in (RENEW, PAGE))
    writes = per_hour(steady.total(WRITE_KINDS, "computed"))
    reads = per_hour(steady.total(READ_KINDS, "computed"))
    fleet = cm.Fleet(connections, 1, timing, w.config.max_connections, worker_id=w.config.worker_id)
    model = cm.report(fleet, cm.Prices())
    page_entries = [p.entries for p in m.pages]
    page_blob = [p.blob_bytes for p in m.pages]
    return {
        "timing": {
            "lease_s": timing.lease,
            "heartbeat_s": timing.heartbeat,
            "reconcile_s": timing.reconcile,
            "checkpoint_s": timing.checkpoint,
            "max_connections": w.config.max_connections,
        },
        "connections": connections,
        "worker_id": w.config.worker_id,
        "id_example": m.connection_ids[0] if m.connection_ids else None,
        "held_at_end": m.held_at_end,
        "settle_s": _round(m.settle_seconds, 1),
        "window_s": _round(m.seconds, 1),
        "messages_in_window": m.messages,
        "messages_per_connection_second": _round(m.messages / (connections * m.seconds), 3),
        "write_units_per_connection_hour": {
            "total": writes,
            RENEW: per_hour(steady.units(RENEW, "computed")),
            PAGE: per_hour(steady.units(PAGE, "computed")),
            "other": per_hour(steady.total(others, "computed")),
        },
        "read_units_per_connection_hour": {
            "total": reads,
            **{k: per_hour(steady.units(k, "computed")) for k in READ_KINDS if k in kinds},
        },
        "per_connection_month_usd_on_demand": round(cm.per_connection_month_usd(writes, reads), 4),
        "cadence": cadence(steady, m.seconds, timing),
        "at_nominal_cadence": at_nominal_cadence(steady, timing, connections),
        "cross_check": {
            "computed_write_units": _round(steady.total(WRITE_KINDS, "computed")),
            "reported_write_units": _round(steady.total(WRITE_KINDS, "consumed")),
            "computed_read_units": _round(steady.total(READ_KINDS, "computed")),
            "reported_read_units": _round(steady.total(READ_KINDS, "consumed")),
            "computed_write_units_by_target": {
                k: _round(v) for k, v in steady.by_target(WRITE_KINDS, "computed").items()
            },
            "reported_write_units_by_target": {
                k: _round(v) for k, v in steady.by_target(WRITE_KINDS, "consumed").items()
            },
            "computed_read_units_by_target": {
                k: _round(v) for k, v in steady.by_target(READ_KINDS, "computed").items()
            },
            "reported_read_units_by_target": {
                k: _round(v) for k, v in steady.by_target(READ_KINDS, "consumed").items()
            },
        },
        "by_kind": by_kind,
        "pages": {
            "writes": len(m.pages),
            "entries_mean": _round(sum(page_entries) / len(page_entries), 1) if m.pages else 0,
            "blob_bytes_mean": _round(sum(page_blob) / len(page_blob), 1) if m.pages else 0,
            "bytes_per_entry": _round(sum(page_blob) / max(1, sum(page_entries)), 2),
            "units": sorted({p.units for p in m.pages}),
        },
        "whole_run": {
            kind: int(m.whole.get(kind, "calls"))
            for kind in (*WRITE_KINDS, *READ_KINDS)
            if m.whole.get(kind, "calls")
        },
        "whole_run_units_per_call": {
            kind: _round(m.whole.units(kind, "computed") / m.whole.get(kind, "calls"))
            for kind in (SESSION_OPEN, ACQUIRE, RELEASE, SESSION_END)
            if m.whole.get(kind, "calls")
        },
        "model": {
            "write_units_per_connection_hour": model["write_units_per_connection_hour"],
            "read_units_per_connection_hour": model["read_units_per_connection_hour"],
            "per_connection_month_usd_on_demand": model["per_connection_month_usd_on_demand"],
            "sizes": model["sizes"],
        },
        "previous_design": model["previous_design"],
    }


def run(args: argparse.Namespace, work_dir: Path) -> dict[str, Any]:
    with LocalServers(work_dir, feeds=1, feed_rate=args.rate) as stack:
        # The worker runs in this process: boto3 reads endpoints and credentials from
        # its environment, as in a deployment.
        use_local_aws(os.environ, stack.endpoints)
        deployment = stack.deployment("bench")
        inspector: DynamoDBClient = services.local_client(
            "dynamodb",
            stack.endpoints.dynamodb,
            config=Config(max_pool_connections=AWS_THREADS + 2, retries={"mode": "standard"}),
        )
        w = build(deployment, work_dir, inspector)
        # The worker's EMF lines go to stdout: keep this command's output readable.
        with contextlib.redirect_stdout(io.StringIO()):
            measured = asyncio.run(drive(w, deployment, stack, args))
        meter_attempts = w.meter.attempts
    result = figures(w, measured, args.connections)
    result["http_attempts_whole_run"] = meter_attempts
    return {"benchmark": "ddb_requests", "result": result, "machine": machine()}


def render(result: dict[str, Any]) -> str:
    r = result["result"]
    model_writes = r["model"]["write_units_per_connection_hour"]
    model_reads = r["model"]["read_units_per_connection_hour"]
    model_of = {
        RENEW: model_writes.get(cm.RENEW),
        PAGE: model_writes.get(cm.PAGE),
        SESSION_LIST: model_reads.get(cm.SESSION_LIST),
        OWNER_QUERY: model_reads.get(cm.OWNER_QUERY),
        UNOWNED_QUERY: model_reads.get(cm.UNOWNED_QUERY),
    }
    rows: list[list[object]] = [
        [
            kind,
            k["calls_per_connection_hour"],
            k["computed_units_per_connection_hour"],
            k["reported_units_per_connection_hour"],
            "" if model_of.get(kind) is None else model_of[kind],
            k["failed_conditions"],
            k["errors"],
        ]
        for kind, k in r["by_kind"].items()
    ]
    kinds = table(
        [
            "kind (steady window)",
            "calls/conn-h",
            "units/conn-h (billing rules)",
            "units/conn-h (DynamoDB Local)",
            "model",
            "failed cond.",
            "errors",
        ],
        rows,
    )
    writes, reads, check = (
        r["write_units_per_connection_hour"],
        r["read_units_per_connection_hour"],
        r["cross_check"],
    )
    pages, timing, nominal = r["pages"], r["timing"], r["at_nominal_cadence"]
    lines = [
        kinds,
        "",
        f"write units / connection-hour: {writes['total']:.2f}"
        f" (session renew {writes[RENEW]:.2f}, page {writes[PAGE]:.2f},"
        f" other {writes['other']:.2f}); model {model_writes['total']:.2f}",
        f"read units / connection-hour: {reads['total']:.2f}; model {model_reads['total']:.2f}",
        f"on demand: ${r['per_connection_month_usd_on_demand']:.4f} per connection-month;"
        f" model ${r['model']['per_connection_month_usd_on_demand']:.4f}",
        f"cadence: a renew every {r['cadence']['renew_every_s']} s, a page every"
        f" {r['cadence']['page_every_s']} s, a reconcile pass every"
        f" {r['cadence']['pass_every_s']} s (nominal {timing['heartbeat_s']:g}, "
        f"{timing['checkpoint_s']:g}, {timing['reconcile_s']:g})",
        f"at the nominal cadence: {nominal['write_units_per_connection_hour']:.2f} write units"
        f" (session renew {nominal['session_renew']:.2f}, page {nominal['page']:.2f}) and"
        f" {nominal['read_units_per_connection_hour']:.2f} read units / connection-hour,"
        f" ${nominal['per_connection_month_usd_on_demand']:.4f} per connection-month",
        f"pages: {pages['writes']} in the window, {pages['entries_mean']:g} entries,"
        f" {pages['blob_bytes_mean']:,.0f} B packed ({pages['bytes_per_entry']:g} B an entry),"
        f" {pages['units']} units each",
        f"cross-check, window: writes {check['computed_write_units']:g} units by the billing"
        f" rules, {check['reported_write_units']:g} reported by DynamoDB Local; reads"
        f" {check['computed_read_units']:g} and {check['reported_read_units']:g}",
        f"messages: {r['messages_per_connection_second']:g} per connection-second;"
        f" {r['held_at_end']} of {r['connections']} held at the end; ids like {r['id_example']};"
        f" worker {r['worker_id']}",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.ddb_requests", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--connections", type=int, default=500)
    parser.add_argument("--window", type=float, default=120.0, help="steady seconds counted")
    parser.add_argument("--rate", type=float, default=1.0, help="messages a second, each")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    try:
        with sigterm_as_interrupt(), tempfile.TemporaryDirectory(prefix="ddb-requests-") as tmp:
            result = run(args, Path(tmp))
    except KeyboardInterrupt:
        print("interrupted; every child process has been stopped", file=sys.stderr)
        return 130
    r = result["result"]
    emit(
        f"DynamoDB capacity, one worker, {args.connections} connections at {args.rate:g} msg/s,"
        f" {r['window_s']:g} s steady window (lease {r['timing']['lease_s']:g} s,"
        f" heartbeat {r['timing']['heartbeat_s']:g} s,"
        f" checkpoint {r['timing']['checkpoint_s']:g} s)",
        render(result),
        result,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
