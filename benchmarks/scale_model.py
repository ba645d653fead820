"""How many connections one table holds in the session design: the hottest partition
key of the table and of each index, in steady state and while a dead worker's
connections are taken over within a second, with the sizes and billing rules of
:mod:`benchmarks.cost_model`.

``python -m benchmarks.scale_model [--connections 100000] [--per-worker 500]``

The partition keys that take load (docs/DESIGN.md §2, §3):

- ``SESSIONS#n`` (table, 4 of them): every session renew of the workers whose id
  hashes there, every heartbeat; every worker's listing Query, every reconcile pass;
  the reap of a dead session.
- ``PAGE#<worker>#<gen>`` (table, one per session): the page put every checkpoint.
- ``CONN#<id>`` (table, one per connection): ownership changes only.
- ``<worker>#<gen>#<n>`` (``by-owner``, 4 per session): nothing in steady state; a
  takeover deletes every entry of the dead session's keys and puts one under the
  taker's keys.
- ``FREE#n`` (``unowned``, 8): starts, releases and acquires only.
- ``STARTED`` / ``STOPPED`` (``by-desired-state``): the router's starts and stops only.

A table holds a fleet when every partition key stays under half of what a partition
absorbs (1,000 write units/s; 3,000 read units/s for reads) in steady state and during
a one-second takeover of ``--dead-workers`` workers. Connections per table is the
largest fleet of ``--per-worker`` connections per worker that does; the write
criterion is the one the design was asked to meet, the read criterion is printed
beside it.
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from benchmarks import cost_model as cm
from benchmarks.report import table
from wsfleet import schema
from wsfleet.timing import LeaseTiming

HEADROOM = 0.5
"""A partition key may use this share of what a partition absorbs."""
WRITE_LIMIT = HEADROOM * cm.PARTITION_WRITE_UNITS_PER_SECOND
READ_LIMIT = HEADROOM * cm.PARTITION_READ_UNITS_PER_SECOND
MAX_SEARCH_CONNECTIONS = 100_000_000


@dataclass(frozen=True, slots=True)
class Scale:
    connections: int = 100_000
    per_worker: int = 500
    timing: LeaseTiming = field(default_factory=LeaseTiming.from_lease)
    capacity: int = cm.DEFAULT_CAPACITY
    """``MAX_CONNECTIONS``: the most a taker can take at once."""
    takeover_seconds: float = 1.0
    dead_workers: int = 1
    """Workers whose sessions lapse together (one crash; more for a zone)."""
    churn_per_hour: float = 0.0
    """Starts + stops per connection per hour (the router's writes)."""
    what_ifs: dict[str, Any] = field(default_factory=dict)
    """:class:`benchmarks.cost_model.Fleet` what-ifs (session shards, shards listed per
    pass, stray check every N passes); empty: the design as built."""

    @property
    def workers(self) -> int:
        return math.ceil(self.connections / self.per_worker)

    def fleet(self) -> cm.Fleet:
        return cm.Fleet(
            self.connections,
            self.workers,
            self.timing,
            self.capacity,
            connection_churn_per_hour=self.churn_per_hour,
            **self.what_ifs,
        )


@dataclass(frozen=True, slots=True)
class HotKey:
    """The busiest key of one kind, in units per second."""

    name: str
    where: str
    steady_writes: float
    takeover_writes: float
    steady_reads: float

    @property
    def peak_writes(self) -> float:
        return max(self.steady_writes, self.takeover_writes)


def hot_keys(scale: Scale, sizes: cm.Sizes | None = None) -> list[HotKey]:
    timing = scale.timing
    sizes = sizes or cm.sizes_of(scale.per_worker, timing, scale.capacity)
    workers = scale.workers
    fleet = scale.fleet()
    in_session_shard = math.ceil(workers / fleet.session_shards)
    renews = in_session_shard * sizes.renew_units / timing.heartbeat
    # Every worker lists every session partition once per pass (eventually consistent).
    listing = (
        workers
        * fleet.listed_per_pass
        / fleet.session_shards
        / timing.reconcile
        * cm.read_units(in_session_shard * sizes.session_bytes, consistent=False)
    )
    # The reaps of sessions that lapse together (all in one shard, at worst).
    reaps = min(scale.dead_workers, in_session_shard) / scale.takeover_seconds
    per_owner_key = math.ceil(scale.per_worker / schema.OWNER_SHARDS)
    taken_per_taker = min(scale.capacity, scale.per_worker * scale.dead_workers)
    # Each connection taken over deletes its entry under a key of the dead session and
    # puts one under a key of the taker's: one entry's units on each key.
    owner_takeover = (
        max(per_owner_key, math.ceil(taken_per_taker / schema.OWNER_SHARDS))
        * cm.write_units(sizes.owner_entry_bytes)
        / scale.takeover_seconds
    )
    stray_check = (
        cm.read_units(per_owner_key * sizes.owner_entry_bytes, consistent=False)
        / timing.reconcile
        / fleet.stray_check_every
    )
    moves = scale.connections * scale.churn_per_hour / cm.SECONDS_PER_HOUR
    # A start puts an entry in FREE#n, its acquire deletes it; a stop moves STARTED to
    # STOPPED in the listing index (a delete and a put), a start moves it back.
    free_churn = 2 * moves / schema.UNOWNED_SHARDS
    room = scale.per_worker < scale.capacity
    free_reads = (
        workers
        * cm.UNOWNED_QUERIES_PER_PASS
        / schema.UNOWNED_SHARDS
        / timing.reconcile
        * cm.read_units(0, consistent=False)
        if room
        else 0.0
    )
    return [
        HotKey("SESSIONS#n", "table", renews, renews + reaps, listing),
        HotKey("PAGE#<worker>#<gen>", "table", sizes.page_units / timing.checkpoint, 0.0, 0.0),
        HotKey("CONN#<id>", "table", 0.0, 2 / scale.takeover_seconds, 0.0),
        HotKey(
            "<worker>#<gen>#<n>",
            schema.OWNER_INDEX_NAME,
            moves / max(1, workers * schema.OWNER_SHARDS),
            owner_takeover,
            stray_check,
        ),
        HotKey("FREE#n", schema.UNOWNED_INDEX_NAME, free_churn, free_churn, free_reads),
        HotKey("STARTED", schema.STATE_INDEX_NAME, moves, moves, 0.0),
    ]


def fits(scale: Scale, *, reads: bool = False, sizes: cm.Sizes | None = None) -> bool:
    """Every partition key under half its write limit (and its read limit)."""
    keys = hot_keys(scale, sizes)
    if any(k.peak_writes >= WRITE_LIMIT for k in keys):
        return False
    return not reads or all(k.steady_reads < READ_LIMIT for k in keys)


def connections_per_table(scale: Scale, *, reads: bool = False) -> int:
    """The largest whole number of workers' worth of connections that :func:`fits`
    (0 when not even one worker does)."""
    sizes = cm.sizes_of(scale.per_worker, scale.timing, scale.capacity)

    def ok(workers: int) -> bool:
        return fits(
            replace(scale, connections=workers * scale.per_worker), reads=reads, sizes=sizes
        )

    if not ok(1):
        return 0
    low, high = 1, MAX_SEARCH_CONNECTIONS // scale.per_worker
    if ok(high):
        return high * scale.per_worker
    while high - low > 1:
        middle = (low + high) // 2
        if ok(middle):
            low = middle
        else:
            high = middle
    return low * scale.per_worker


def takeover_write_units(scale: Scale) -> int:
    """Write units of taking over one dead worker's connections: one conditional
    write per connection moving ``owner_key`` (1 table + 2 ``by-owner`` units), the
    reap of its session (1), then forgetting the session and deleting its page."""
    sizes = cm.sizes_of(scale.per_worker, scale.timing, scale.capacity)
    return (
        cm.takeover_cost().total * scale.per_worker
        + sizes.renew_units
        + sizes.renew_units
        + sizes.page_units
    )


def to_json(scale: Scale, prices: cm.Prices) -> dict[str, Any]:
    fleet = scale.fleet()
    model = cm.report(fleet, prices)
    keys = hot_keys(scale)
    return {
        "connections": scale.connections,
        "workers": scale.workers,
        "per_worker": scale.per_worker,
        "timing": asdict(scale.timing),
        "dead_workers": scale.dead_workers,
        "what_ifs": scale.what_ifs,
        "takeover_seconds": scale.takeover_seconds,
        "write_units_per_second": model["write_units_per_second"],
        "read_units_per_second": model["read_units_per_second"],
        "write_units_per_connection_hour": model["write_units_per_connection_hour"]["total"],
        "read_units_per_connection_hour": model["read_units_per_connection_hour"]["total"],
        "per_connection_month_usd_on_demand": model["per_connection_month_usd_on_demand"],
        "monthly_usd": model["monthly_usd"],
        "takeover_write_units_per_dead_worker": takeover_write_units(scale),
        "hot_keys": [
            {
                "key": k.name,
                "in": k.where,
                "steady_writes_per_second": round(k.steady_writes, 1),
                "takeover_writes_per_second": round(k.takeover_writes, 1),
                "steady_reads_per_second": round(k.steady_reads, 1),
            }
            for k in keys
        ],
        "write_limit_per_key": WRITE_LIMIT,
        "read_limit_per_key": READ_LIMIT,
        "fits_writes": fits(scale),
        "fits_reads": fits(scale, reads=True),
        "connections_per_table": connections_per_table(scale),
        "connections_per_table_with_reads": connections_per_table(scale, reads=True),
        "previous_design": model["previous_design"],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.scale_model", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--connections", type=int, default=100_000)
    parser.add_argument("--per-worker", type=int, default=500)
    parser.add_argument("--capacity", type=int, default=cm.DEFAULT_CAPACITY, help="MAX_CONNECTIONS")
    parser.add_argument("--lease-seconds", type=float, default=None)
    parser.add_argument("--checkpoint-seconds", type=float, default=None)
    parser.add_argument("--dead-workers", type=int, default=1)
    parser.add_argument("--churn-per-hour", type=float, default=0.0)
    cm.add_what_ifs(parser)
    args = parser.parse_args(argv)
    timing = LeaseTiming.from_lease(
        *(() if args.lease_seconds is None else (args.lease_seconds,)),
        checkpoint=args.checkpoint_seconds,
    )
    scale = Scale(
        connections=args.connections,
        per_worker=args.per_worker,
        timing=timing,
        capacity=max(args.capacity, args.per_worker),
        dead_workers=args.dead_workers,
        churn_per_hour=args.churn_per_hour,
        what_ifs=cm.what_ifs(args),
    )
    result = to_json(scale, cm.Prices())
    print(
        f"{scale.connections:,} connections on {scale.workers:,} workers of {scale.per_worker},"
        f" lease {timing.lease:g} s, heartbeat {timing.heartbeat:g} s,"
        f" checkpoint {timing.checkpoint:g} s; takeover of {scale.dead_workers} worker(s)"
        f" in {scale.takeover_seconds:g} s"
    )
    print(
        table(
            ["hottest key", "in", "steady W/s", "takeover W/s", "steady R/s"],
            [
                [
                    k["key"],
                    k["in"],
                    k["steady_writes_per_second"],
                    k["takeover_writes_per_second"],
                    k["steady_reads_per_second"],
                ]
                for k in result["hot_keys"]
            ],
        )
    )
    previous = result["previous_design"]
    print(
        f"limits per key: {WRITE_LIMIT:g} W/s, {READ_LIMIT:g} R/s (half a partition);"
        f" fits: writes {result['fits_writes']}, reads {result['fits_reads']}"
    )
    print(
        f"connections per table: {result['connections_per_table']:,} (writes),"
        f" {result['connections_per_table_with_reads']:,} (writes and reads);"
        f" previous design {previous['connections_per_table']:,}"
    )
    print(
        f"table: {result['write_units_per_second']:,} W/s, {result['read_units_per_second']:,} R/s;"
        f" {result['write_units_per_connection_hour']} W and"
        f" {result['read_units_per_connection_hour']} R per connection-hour;"
        f" ${result['per_connection_month_usd_on_demand']:.4f} per connection-month on demand"
        f" (${result['monthly_usd']['on_demand']:,.0f} a month)"
    )
    print(json.dumps(result, separators=(",", ":")))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
