"""DynamoDB capacity and cost of the session design, counted as DynamoDB bills it.

``python -m benchmarks.cost_model [--connections 500] [--workers 1] [--json]``

What one worker does in steady state (docs/DESIGN.md §3), from the code as built:

- renews its **session** item every heartbeat (one ``UpdateItem`` of a ~200 B item
  that no index contains: 1 write unit);
- puts its checkpoint **page** every ``CHECKPOINT_SECONDS`` when something changed (one
  ``PutItem``, billed on the larger of the old and the new page: 1 unit per started KB;
  the page's size is that of :func:`wsfleet.checkpoint_page.page_item` with one entry
  per connection, the ids random uuid4 hex as the router makes them);
- on every reconcile pass reads: one Query per session item collection (4, no index),
  one Query per ``by-owner`` shard of its own session (4, eventually consistent, the
  projected entries of its connections), and, while it has room for more, two Queries
  of the sparse ``unowned`` index.

Connection items are written only when ownership changes; ``--churn-per-hour`` counts
those (an acquire and a release per move). Every size comes from the items the code
builds (:func:`session_item`, :func:`page_item_of`, :func:`connection_item`) measured
with DynamoDB's item-size rules (:func:`item_size`), and every index write from the
projections of ``local_stack.resources.table_indexes`` (:func:`write_cost`).

The design this replaced renewed every connection every 5 s, each renew moving the
sort key of the one ``STARTED`` index partition: :func:`previous_design` keeps its
arithmetic for comparison (2,160 write units per connection-hour, about $0.99 per
connection-month, saturation at about 2,500 connections per table; docs/BENCHMARKS.md
measured the same 2,160).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import uuid
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from functools import cache
from typing import Any

from local_stack.resources import table_indexes
from wsfleet import schema, session_rules
from wsfleet.checkpoint_page import PageEntry, page_item
from wsfleet.item import to_attribute
from wsfleet.timing import OWN_CHECK_PASSES, LeaseTiming

HOURS_PER_MONTH = 730.0
SECONDS_PER_HOUR = 3600.0
KB = 1024
WRITE_UNIT_BYTES = KB
READ_UNIT_BYTES = 4 * KB
PARTITION_WRITE_UNITS_PER_SECOND = 1000.0
"""What one partition (of the table or of an index) absorbs."""
PARTITION_READ_UNITS_PER_SECOND = 3000.0
DEFAULT_CAPACITY = 500
"""``MAX_CONNECTIONS`` as shipped."""
UNOWNED_QUERIES_PER_PASS = 2
"""``worker.reconciler.UNOWNED_SHARDS_PER_PASS``: run only while the worker has room."""

EXAMPLE_WORKER_ID = "ip-10-0-12-34.ec2.internal-7-a1b2c3"
"""What ``worker.config.default_worker_id`` makes on a Fargate task: host, pid, 6 hex."""
EXAMPLE_NOW_MS = 1_767_225_600_000
EXAMPLE_URL_BYTES = 64
"""A typical upstream URL: ``wss://stream.example.com/v1/...``."""
EXAMPLE_SEQ = 1_000_000
"""A checkpoint a few days into a 1 msg/s stream (the page barely depends on it)."""


# --- DynamoDB's billing rules -------------------------------------------------------------


def _number_size(text: str) -> int:
    """1 byte per two significant digits, plus 1 (leading and trailing zeros trimmed,
    so zero is 1 byte, as DynamoDB Local counts it)."""
    digits = text.lstrip("+-").lower().split("e")[0].replace(".", "").strip("0")
    return math.ceil(len(digits) / 2) + 1


def value_size(value: Mapping[str, Any]) -> int:
    """Bytes of one typed attribute value (``{"S": ...}``, ``{"N": ...}``...), by the
    rules of DynamoDB's item-size documentation."""
    (kind, raw), *_ = value.items()
    if kind == "S":
        return len(str(raw).encode())
    if kind == "N":
        return _number_size(str(raw))
    if kind == "B":
        return len(raw)
    if kind == "SS":
        return sum(len(str(s).encode()) for s in raw)
    if kind == "NS":
        return sum(_number_size(str(n)) for n in raw)
    if kind == "BS":
        return sum(len(b) for b in raw)
    if kind in ("BOOL", "NULL"):
        return 1
    if kind == "L":
        return 3 + sum(value_size(v) + 1 for v in raw)
    if kind == "M":
        return 3 + sum(len(k.encode()) + value_size(v) + 1 for k, v in raw.items())
    raise ValueError(f"unknown attribute type {kind!r}")


def item_size(item: Mapping[str, Mapping[str, Any]] | None) -> int:
    """Bytes of an item (typed attributes): names plus values; 0 for no item."""
    if not item:
        return 0
    return sum(len(name.encode()) + value_size(value) for name, value in item.items())


def write_units(size: int) -> int:
    """1 write unit per started KB, at least 1."""
    return max(1, math.ceil(size / WRITE_UNIT_BYTES))


def read_units(size: int, *, consistent: bool) -> float:
    """A GetItem of an item, or a Query of items totalling ``size`` bytes: 1 unit per
    started 4 KB (at least one), half of it when eventually consistent."""
    blocks = max(1, math.ceil(size / READ_UNIT_BYTES))
    return float(blocks) if consistent else blocks / 2


@dataclass(frozen=True, slots=True)
class IndexShape:
    name: str
    partition_key: str
    sort_key: str
    projected: tuple[str, ...]
    """Non-key attributes projected (empty for KEYS_ONLY)."""


@cache
def index_shapes() -> tuple[IndexShape, ...]:
    """The table's global secondary indexes, as ``local_stack.resources`` creates them."""
    shapes = []
    for index in table_indexes():
        keys = {k["KeyType"]: k["AttributeName"] for k in index["KeySchema"]}
        shapes.append(
            IndexShape(
                name=index["IndexName"],
                partition_key=keys["HASH"],
                sort_key=keys["RANGE"],
                projected=tuple(index["Projection"].get("NonKeyAttributes", ())),
            )
        )
    return tuple(shapes)


def index_entry(
    item: Mapping[str, Mapping[str, Any]] | None, index: IndexShape
) -> dict[str, Mapping[str, Any]] | None:
    """The entry ``item`` has in ``index`` (None when it lacks the index keys): the
    index keys, the table keys and the projected attributes."""
    if not item or index.partition_key not in item or index.sort_key not in item:
        return None
    names = (
        index.partition_key,
        index.sort_key,
        schema.PARTITION_KEY,
        schema.SORT_KEY,
        *index.projected,
    )
    return {name: item[name] for name in names if name in item}


def index_write_units(
    old: Mapping[str, Mapping[str, Any]] | None,
    new: Mapping[str, Mapping[str, Any]] | None,
    index: IndexShape,
) -> int:
    """Write units one table write costs ``index``: a put for an entry that appears, a
    delete for one that goes, both when an index key changes, an update (larger of the
    two) when only projected attributes change, nothing otherwise."""
    before, after = index_entry(old, index), index_entry(new, index)
    if before is None and after is None:
        return 0
    if before is None:
        return write_units(item_size(after))
    if after is None:
        return write_units(item_size(before))
    keys = (index.partition_key, index.sort_key)
    if any(before[k] != after[k] for k in keys):
        return write_units(item_size(before)) + write_units(item_size(after))
    if before == after:
        return 0
    return write_units(max(item_size(before), item_size(after)))


@dataclass(frozen=True, slots=True)
class WriteCost:
    table: int
    indexes: dict[str, int] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return self.table + sum(self.indexes.values())


def write_cost(
    old: Mapping[str, Mapping[str, Any]] | None, new: Mapping[str, Mapping[str, Any]] | None
) -> WriteCost:
    """What one successful write that turns ``old`` into ``new`` costs (either may be
    None: a put of a new item, a delete): the larger of the two per started KB in the
    table, plus every index entry it writes."""
    indexes = {
        index.name: units
        for index in index_shapes()
        if (units := index_write_units(old, new, index))
    }
    return WriteCost(write_units(max(item_size(old), item_size(new))), indexes)


def failed_write_units(existing: Mapping[str, Mapping[str, Any]] | None) -> int:
    """A conditional write whose condition failed: billed on the item that is there
    (1 unit for every item of this table but a page)."""
    return write_units(item_size(existing))


# --- the items, as the code builds them ---------------------------------------------------


def _typed(plain: Mapping[str, Any]) -> dict[str, Any]:
    return {k: to_attribute(v) for k, v in plain.items()}


def session_item(
    connections: int,
    *,
    worker_id: str = EXAMPLE_WORKER_ID,
    timing: LeaseTiming | None = None,
    capacity: int = DEFAULT_CAPACITY,
    notices: int = 0,
) -> dict[str, Any]:
    """A renewed session item (``notices`` pending router notices on it)."""
    timing = timing or LeaseTiming.from_lease()
    item = session_rules.new_session_item(worker_id, 1, EXAMPLE_NOW_MS, timing, capacity)
    item[schema.SESSION_CONNECTIONS] = to_attribute(connections)
    if notices:
        item[schema.SESSION_NOTICES] = {
            "SS": [
                session_rules.notice_token(uuid.UUID(int=n).hex, "stop", EXAMPLE_NOW_MS, "0f1e2d3c")
                for n in range(notices)
            ]
        }
    return item


def uuid_hex_ids(count: int, seed: int = 0) -> list[str]:
    """``count`` ids as the router makes them (``uuid.uuid4().hex``), reproducibly."""
    rng = random.Random(seed)
    return [uuid.UUID(int=rng.getrandbits(128), version=4).hex for _ in range(count)]


def page_entries(
    count: int, *, seed: int = 0, seq: int = EXAMPLE_SEQ, spread_ms: int = 1000
) -> dict[str, PageEntry]:
    """Entries of ``count`` connections at about 1 msg/s: seqs near ``seq``, each moved
    within the last ``spread_ms``."""
    rng = random.Random(seed + 1)
    return {
        cid: PageEntry(
            epoch=1,
            seq_gen=0,
            seq=seq + rng.randrange(1000),
            advanced_at_ms=EXAMPLE_NOW_MS - rng.randrange(spread_ms),
        )
        for cid in uuid_hex_ids(count, seed)
    }


def page_item_of(
    count: int, *, worker_id: str = EXAMPLE_WORKER_ID, seed: int = 0
) -> dict[str, Any]:
    """The checkpoint page of a session running ``count`` connections."""
    return page_item(worker_id, 1, page_entries(count, seed=seed), EXAMPLE_NOW_MS)


def connection_item(
    connection_id: str,
    *,
    owner: str | None = EXAMPLE_WORKER_ID,
    session_gen: int = 1,
    url_bytes: int = EXAMPLE_URL_BYTES,
) -> dict[str, Any]:
    """A STARTED connection item as the router creates it and an acquire leaves it
    (``owner=None``: free, in the ``unowned`` index)."""
    url = ("wss://stream.example.com/v1/" + "x" * url_bytes)[:url_bytes]
    plain: dict[str, Any] = {
        **schema.connection_key(connection_id),
        schema.DESIRED_STATE: schema.STARTED,
        schema.WS_URL: url,
        schema.LEASE_EPOCH: 1,
        schema.LAST_SEQ: EXAMPLE_SEQ,
        schema.START_GEN: 1,
        schema.SEQ_GEN: 0,
        schema.CREATED_AT_MS: EXAMPLE_NOW_MS,
        schema.UPDATED_AT_MS: EXAMPLE_NOW_MS + 1,
    }
    if owner is None:
        plain[schema.FREE_SHARD] = schema.free_shard(connection_id)
    else:
        plain |= {
            schema.LEASE_OWNER: owner,
            schema.OWNER_SESSION_GEN: session_gen,
            schema.OWNER_KEY: schema.owner_key(owner, session_gen, connection_id),
            schema.LEASE_TOKEN: "0123456789abcdef",
        }
    return _typed(plain)


def owner_index_entry_size(
    url_bytes: int = EXAMPLE_URL_BYTES, worker_id: str = EXAMPLE_WORKER_ID
) -> int:
    """Bytes of one ``by-owner`` entry (what the stray check reads per connection)."""
    by_owner = next(i for i in index_shapes() if i.name == schema.OWNER_INDEX_NAME)
    item = connection_item(uuid_hex_ids(1)[0], owner=worker_id, url_bytes=url_bytes)
    return item_size(index_entry(item, by_owner))


@dataclass(frozen=True, slots=True)
class Sizes:
    """Bytes and write units of what a worker with ``connections`` writes and reads."""

    session_bytes: int
    page_bytes: int
    page_entry_bytes: float
    owner_entry_bytes: int
    connection_bytes: int

    @property
    def renew_units(self) -> int:
        return write_units(self.session_bytes)

    @property
    def page_units(self) -> int:
        return write_units(self.page_bytes)


def sizes_of(
    connections: int,
    timing: LeaseTiming,
    capacity: int = DEFAULT_CAPACITY,
    worker_id: str = EXAMPLE_WORKER_ID,
) -> Sizes:
    page = page_item_of(connections, worker_id=worker_id)
    blob = len(page[schema.PAGE_ENTRIES]["B"])
    session = session_item(connections, worker_id=worker_id, timing=timing, capacity=capacity)
    return Sizes(
        session_bytes=item_size(session),
        page_bytes=item_size(page),
        page_entry_bytes=blob / connections if connections else 0.0,
        owner_entry_bytes=owner_index_entry_size(worker_id=worker_id),
        connection_bytes=item_size(connection_item(uuid_hex_ids(1)[0], owner=worker_id)),
    )


# --- what the fleet costs -----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Prices:
    """USD, us-east-1 list prices (on-demand since the November 2024 reduction)."""

    on_demand_per_million_writes: float = 0.625
    on_demand_per_million_reads: float = 0.125
    provisioned_wcu_hour: float = 0.00065
    provisioned_rcu_hour: float = 0.00013


@dataclass(frozen=True, slots=True)
class Fleet:
    connections: int
    workers: int
    timing: LeaseTiming = field(default_factory=LeaseTiming.from_lease)
    capacity: int = DEFAULT_CAPACITY
    """``MAX_CONNECTIONS`` of every worker: a full worker skips the unowned queries."""
    connection_churn_per_hour: float = 0.0
    """Ownership moves (starts, stops, failovers) per connection per hour; each is an
    acquire and a release."""
    # What-ifs: the design as built has 4 session item collections, lists all of them
    # on every pass and checks its own by-owner entries every OWN_CHECK_PASSES passes.
    session_shards: int = schema.SESSION_SHARDS
    session_shards_per_pass: int | None = None
    """How many session item collections one pass lists (None: all of them)."""
    stray_check_every: int = OWN_CHECK_PASSES
    """The by-owner query of the worker's own session, once every this many passes."""
    worker_id: str = EXAMPLE_WORKER_ID
    """Its length sizes the session item, the page's key and every by-owner entry."""

    @property
    def per_worker(self) -> int:
        """Connections of the busiest worker (spread evenly)."""
        return math.ceil(self.connections / self.workers) if self.workers else 0

    @property
    def listed_per_pass(self) -> int:
        return self.session_shards_per_pass or self.session_shards


def _spread(total: int, parts: int) -> list[int]:
    return [total // parts + (1 if n < total % parts else 0) for n in range(parts)]


def acquire_cost(url_bytes: int = EXAMPLE_URL_BYTES) -> WriteCost:
    cid = uuid_hex_ids(1)[0]
    return write_cost(
        connection_item(cid, owner=None, url_bytes=url_bytes),
        connection_item(cid, url_bytes=url_bytes),
    )


def release_cost(url_bytes: int = EXAMPLE_URL_BYTES) -> WriteCost:
    cid = uuid_hex_ids(1)[0]
    return write_cost(
        connection_item(cid, url_bytes=url_bytes),
        connection_item(cid, owner=None, url_bytes=url_bytes),
    )


def takeover_cost(url_bytes: int = EXAMPLE_URL_BYTES) -> WriteCost:
    """One connection moved from a dead session to a live one: ``owner_key`` changes.
    The write is part of a transaction (``TransactWriteItems``), which DynamoDB bills
    at twice the units of the table write; the index writes are billed as usual."""
    cid = uuid_hex_ids(1)[0]
    plain = write_cost(
        connection_item(cid, owner="dead-worker", url_bytes=url_bytes),
        connection_item(cid, url_bytes=url_bytes),
    )
    return WriteCost(2 * plain.table, plain.indexes)


@dataclass(frozen=True, slots=True)
class Load:
    """Capacity units per second of the whole fleet, by kind."""

    writes: dict[str, float]
    reads: dict[str, float]
    requests: dict[str, float]

    @property
    def write_units_per_second(self) -> float:
        return sum(self.writes.values())

    @property
    def reads_per_second(self) -> float:
        return sum(self.reads.values())


RENEW, PAGE, OWNERSHIP = "session renew", "page", "ownership moves"
SESSION_LIST, OWNER_QUERY, UNOWNED_QUERY = "session listing", "by-owner query", "unowned query"


def reads_per_pass(fleet: Fleet, sizes: Sizes) -> dict[str, float]:
    """Read units of one reconcile pass of the busiest worker."""
    per_shard = [
        read_units(n * sizes.session_bytes, consistent=False)
        for n in _spread(fleet.workers, fleet.session_shards)
    ]
    sessions = sum(per_shard) / len(per_shard) * fleet.listed_per_pass
    owner = sum(
        read_units(n * sizes.owner_entry_bytes, consistent=False)
        for n in _spread(fleet.per_worker, schema.OWNER_SHARDS)
    ) / max(1, fleet.stray_check_every)
    room = fleet.per_worker < fleet.capacity
    unowned = UNOWNED_QUERIES_PER_PASS * read_units(0, consistent=False) if room else 0.0
    return {SESSION_LIST: sessions, OWNER_QUERY: owner, UNOWNED_QUERY: unowned}


def load_of(fleet: Fleet, sizes: Sizes | None = None) -> Load:
    timing = fleet.timing
    sizes = sizes or sizes_of(fleet.per_worker, timing, fleet.capacity, fleet.worker_id)
    workers = fleet.workers
    moves = fleet.connections * fleet.connection_churn_per_hour / SECONDS_PER_HOUR
    writes = {
        RENEW: workers * sizes.renew_units / timing.heartbeat,
        PAGE: workers * sizes.page_units / timing.checkpoint if fleet.per_worker else 0.0,
        OWNERSHIP: moves * (acquire_cost().total + release_cost().total),
    }
    reads = {k: workers * v / timing.reconcile for k, v in reads_per_pass(fleet, sizes).items()}
    room = fleet.per_worker < fleet.capacity
    queries_per_pass = (
        fleet.listed_per_pass
        + schema.OWNER_SHARDS / max(1, fleet.stray_check_every)
        + (UNOWNED_QUERIES_PER_PASS if room else 0)
    )
    requests = {
        RENEW: workers / timing.heartbeat,
        PAGE: workers / timing.checkpoint if fleet.per_worker else 0.0,
        OWNERSHIP: 2 * moves,
        "queries": workers * queries_per_pass / timing.reconcile,
    }
    return Load(writes, reads, requests)


@dataclass(frozen=True, slots=True)
class MonthlyCost:
    on_demand_writes: float
    on_demand_reads: float
    provisioned_writes: float
    provisioned_reads: float

    @property
    def on_demand(self) -> float:
        return self.on_demand_writes + self.on_demand_reads

    @property
    def provisioned(self) -> float:
        return self.provisioned_writes + self.provisioned_reads


def monthly_cost(load: Load, prices: Prices, *, provisioned_headroom: float = 1.25) -> MonthlyCost:
    """On-demand pays per request; provisioned pays for capacity, sized with headroom
    over the steady load (autoscaling keeps utilisation near 1/headroom)."""
    seconds = HOURS_PER_MONTH * SECONDS_PER_HOUR
    wcu = math.ceil(load.write_units_per_second * provisioned_headroom)
    rcu = max(1, math.ceil(load.reads_per_second * provisioned_headroom))
    return MonthlyCost(
        on_demand_writes=load.write_units_per_second
        * seconds
        / 1e6
        * prices.on_demand_per_million_writes,
        on_demand_reads=load.reads_per_second * seconds / 1e6 * prices.on_demand_per_million_reads,
        provisioned_writes=wcu * HOURS_PER_MONTH * prices.provisioned_wcu_hour,
        provisioned_reads=rcu * HOURS_PER_MONTH * prices.provisioned_rcu_hour,
    )


def per_connection_month_usd(
    write_units_per_connection_hour: float,
    read_units_per_connection_hour: float,
    prices: Prices | None = None,
) -> float:
    """On-demand dollars per connection-month from units per connection-hour."""
    prices = prices or Prices()
    return (
        HOURS_PER_MONTH
        / 1e6
        * (
            write_units_per_connection_hour * prices.on_demand_per_million_writes
            + read_units_per_connection_hour * prices.on_demand_per_million_reads
        )
    )


# --- the design this replaced -------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PreviousDesign:
    write_units_per_connection_hour: float
    usd_per_connection_month: float
    connections_per_table: int


def previous_design(heartbeat: float = 5.0, prices: Prices | None = None) -> PreviousDesign:
    """One conditional renew per connection per heartbeat (lease 20 s, heartbeat 5 s),
    each 1 table write plus 2 index writes (it moved the sort key of the one
    ``STARTED`` index partition, which saturates at 1,000 writes/s)."""
    units = 3 * SECONDS_PER_HOUR / heartbeat
    return PreviousDesign(
        write_units_per_connection_hour=units,
        usd_per_connection_month=per_connection_month_usd(units, 0.0, prices),
        connections_per_table=int(PARTITION_WRITE_UNITS_PER_SECOND * heartbeat / 2),
    )


# --- report ----------------------------------------------------------------------------------


def report(fleet: Fleet, prices: Prices) -> dict[str, Any]:
    sizes = sizes_of(fleet.per_worker, fleet.timing, fleet.capacity, fleet.worker_id)
    load = load_of(fleet, sizes)
    cost = monthly_cost(load, prices)
    connection_hours_per_second = fleet.connections / SECONDS_PER_HOUR

    def per_connection_hour(units_per_second: float) -> float:
        if not fleet.connections:
            return 0.0
        return round(units_per_second / connection_hours_per_second, 2)

    writes = per_connection_hour(load.write_units_per_second)
    reads = per_connection_hour(load.reads_per_second)
    previous = previous_design(prices=prices)
    return {
        "connections": fleet.connections,
        "workers": fleet.workers,
        "per_worker": fleet.per_worker,
        "worker_id_example": fleet.worker_id,
        "timing": asdict(fleet.timing),
        "sizes": {
            "session_bytes": sizes.session_bytes,
            "page_bytes": sizes.page_bytes,
            "page_entry_bytes": round(sizes.page_entry_bytes, 1),
            "owner_index_entry_bytes": sizes.owner_entry_bytes,
            "connection_bytes": sizes.connection_bytes,
            "renew_write_units": sizes.renew_units,
            "page_write_units": sizes.page_units,
        },
        "write_units_per_second": round(load.write_units_per_second, 2),
        "read_units_per_second": round(load.reads_per_second, 2),
        "write_units_per_connection_hour": {
            "total": writes,
            **{k: per_connection_hour(v) for k, v in load.writes.items()},
        },
        "read_units_per_connection_hour": {
            "total": reads,
            **{k: per_connection_hour(v) for k, v in load.reads.items()},
        },
        "per_connection_month_usd_on_demand": round(
            per_connection_month_usd(writes, reads, prices), 4
        ),
        "monthly_usd": {
            "on_demand": round(cost.on_demand, 2),
            "on_demand_writes": round(cost.on_demand_writes, 2),
            "on_demand_reads": round(cost.on_demand_reads, 2),
            "provisioned": round(cost.provisioned, 2),
        },
        "write_units": {
            "acquire": acquire_cost().total,
            "release": release_cost().total,
            "takeover_per_connection": takeover_cost().total,
        },
        "previous_design": asdict(previous),
        "prices": asdict(prices),
    }


def add_what_ifs(parser: argparse.ArgumentParser) -> None:
    """Flags for changes the design does not have (yet), to price them."""
    group = parser.add_argument_group("what-ifs (not the design as built)")
    group.add_argument("--session-shards", type=int, default=schema.SESSION_SHARDS)
    group.add_argument(
        "--session-shards-per-pass", type=int, default=None, help="default: all of them"
    )
    group.add_argument("--stray-check-every", type=int, default=OWN_CHECK_PASSES, help="passes")


def what_ifs(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "session_shards": args.session_shards,
        "session_shards_per_pass": args.session_shards_per_pass,
        "stray_check_every": args.stray_check_every,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.cost_model", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--connections", type=int, default=500)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--capacity", type=int, default=DEFAULT_CAPACITY, help="MAX_CONNECTIONS")
    parser.add_argument("--lease-seconds", type=float, default=None)
    parser.add_argument("--heartbeat-seconds", type=float, default=None)
    parser.add_argument("--reconcile-seconds", type=float, default=None)
    parser.add_argument("--checkpoint-seconds", type=float, default=None)
    parser.add_argument("--churn-per-hour", type=float, default=0.0)
    add_what_ifs(parser)
    parser.add_argument("--json", action="store_true", help="print JSON only")
    args = parser.parse_args(argv)
    timing = LeaseTiming.from_lease(
        *(() if args.lease_seconds is None else (args.lease_seconds,)),
        heartbeat=args.heartbeat_seconds,
        reconcile=args.reconcile_seconds,
        checkpoint=args.checkpoint_seconds,
    )
    fleet = Fleet(
        args.connections,
        args.workers,
        timing,
        args.capacity,
        args.churn_per_hour,
        **what_ifs(args),
    )
    result = report(fleet, Prices())
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    sizes, writes, reads = (
        result["sizes"],
        result["write_units_per_connection_hour"],
        result["read_units_per_connection_hour"],
    )
    previous = result["previous_design"]
    print(
        f"{fleet.connections:,} connections on {fleet.workers} worker(s), lease {timing.lease:g} s,"
        f" heartbeat {timing.heartbeat:g} s, reconcile {timing.reconcile:g} s,"
        f" checkpoint {timing.checkpoint:g} s"
    )
    print(
        f"  session item {sizes['session_bytes']} B ({sizes['renew_write_units']} unit);"
        f" page {sizes['page_bytes']:,} B for {fleet.per_worker} entries"
        f" ({sizes['page_entry_bytes']} B each, {sizes['page_write_units']} units);"
        f" by-owner entry {sizes['owner_index_entry_bytes']} B"
    )
    for kind, value in writes.items():
        print(f"  write units / connection-hour, {kind:<16} {value:>8,.2f}")
    for kind, value in reads.items():
        print(f"  read units / connection-hour, {kind:<17} {value:>8,.2f}")
    print(
        f"  on demand, per connection-month   ${result['per_connection_month_usd_on_demand']:.4f}"
        f"  (fleet: ${result['monthly_usd']['on_demand']:,.2f} a month)"
    )
    print(
        f"  previous design: {previous['write_units_per_connection_hour']:,.0f} write units"
        f" / connection-hour, ${previous['usd_per_connection_month']:.2f}"
        f" / connection-month, {previous['connections_per_table']:,} connections per table"
    )
    print(json.dumps(result, separators=(",", ":")))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
