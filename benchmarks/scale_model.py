"""The lease table at scale: today's design against the session design of
``docs/SCALING.md``, with the prices and arithmetic of :mod:`benchmarks.cost_model`.

``python -m benchmarks.scale_model [--connections 100000] [--per-worker 500]``

Designs compared at the same lease timing (lease 20 s, heartbeat 5 s, reconcile 5 s),
hence the same crash failover bound:

- ``current``: one conditional renew per connection per heartbeat, carrying the
  checkpoint; each renew moves the GSI sort key (one table write + two index writes).
- ``sessions+pages``: one small session item per worker renewed every heartbeat (its
  expiry is the sort key of a sessions index: one table write + two index writes),
  connection items written only when ownership changes, and each worker's checkpoints
  packed into one page item written every heartbeat (a write costs one unit per KB of
  the item, so a page of 500 entries costs about 25 units instead of 500). Stops are
  noticed by a per-worker query of a by-owner index every heartbeat (reads).
- ``sessions+rare``: the same, but each connection's checkpoint written to its own item
  every ``--checkpoint-seconds`` (simpler; more duplicates after a crash).

Write units are counted the way DynamoDB bills them (1 per KB of the larger of the item
before and after the write, plus 2 per index entry whose key changes), not estimated.
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import asdict, dataclass, field

from benchmarks.cost_model import (
    GSI_PARTITION_WRITES_PER_SECOND,
    INDEX_WRITES_PER_RENEW,
    Fleet,
    Load,
    MonthlyCost,
    Prices,
    load_of,
    monthly_cost,
)
from benchmarks.report import table
from wsfleet.timing import LeaseTiming

KB = 1024
READ_UNIT_BYTES = 4 * KB
EVENTUALLY_CONSISTENT = 0.5


@dataclass(frozen=True, slots=True)
class Scale:
    connections: int = 100_000
    per_worker: int = 500
    timing: LeaseTiming = field(default_factory=lambda: LeaseTiming.from_lease(20.0))
    checkpoint_entry_bytes: int = 50
    """One connection in a packed page: id (32 chars for the router's generated ids),
    epoch and seq as numbers, map overhead."""
    owner_index_entry_bytes: int = 80
    """One by-owner index entry read by the stop query: keys + desired_state + start_gen."""
    rare_checkpoint_seconds: float = 60.0

    @property
    def workers(self) -> int:
        return math.ceil(self.connections / self.per_worker)


@dataclass(frozen=True, slots=True)
class DesignFigures:
    name: str
    load: Load
    cost: MonthlyCost
    hottest_index_partition_writes_per_second: float
    crash_duplicate_window_s: float
    """Most seconds of messages delivered again after a crash (handled after the last
    checkpoint that reached DynamoDB)."""
    partition_duplicate_window_s: float
    """The same after a DynamoDB partition: the worker handles until its fence deadline."""
    crash_failover_bound_s: float


def current(scale: Scale, prices: Prices) -> DesignFigures:
    """Today's design (per-connection renews), from :func:`cost_model.load_of`."""
    timing = scale.timing
    load = load_of(Fleet(scale.connections, scale.workers, timing))
    return DesignFigures(
        name="current",
        load=load,
        cost=monthly_cost(load, prices),
        hottest_index_partition_writes_per_second=load.index_writes_per_second,
        crash_duplicate_window_s=timing.heartbeat,
        partition_duplicate_window_s=timing.fence_after,
        crash_failover_bound_s=timing.crash_failover_bound(),
    )


def sessions(scale: Scale, prices: Prices, *, packed: bool) -> DesignFigures:
    """The session design with packed checkpoint pages (``packed``) or rare
    per-connection checkpoints."""
    timing = scale.timing
    workers = scale.workers
    session_renews = workers / timing.heartbeat
    # A session item is tiny: 1 unit; its expiry is the sessions-index sort key: 2 more.
    table_writes = session_renews
    index_writes = INDEX_WRITES_PER_RENEW * session_renews
    if packed:
        page_units = math.ceil(scale.per_worker * scale.checkpoint_entry_bytes / KB)
        table_writes += workers * page_units / timing.heartbeat
        crash_window = timing.heartbeat
        name = "sessions+pages"
    else:
        # One unit per connection item (no indexed attribute changes).
        table_writes += scale.connections / scale.rare_checkpoint_seconds
        crash_window = scale.rare_checkpoint_seconds
        name = "sessions+rare"
    # Reads: the dead-session query (0.5 per worker per reconcile) and the stop query of
    # each worker's by-owner index page every heartbeat.
    owner_query_units = EVENTUALLY_CONSISTENT * math.ceil(
        scale.per_worker * scale.owner_index_entry_bytes / READ_UNIT_BYTES
    )
    reads = EVENTUALLY_CONSISTENT * workers / timing.reconcile + (
        owner_query_units * workers / timing.heartbeat
    )
    load = Load(session_renews, table_writes, index_writes, reads)
    return DesignFigures(
        name=name,
        load=load,
        cost=monthly_cost(load, prices),
        hottest_index_partition_writes_per_second=index_writes,
        crash_duplicate_window_s=crash_window,
        partition_duplicate_window_s=max(timing.fence_after, crash_window),
        crash_failover_bound_s=timing.crash_failover_bound(),
    )


def takeover_write_units(scale: Scale) -> int:
    """Write units of taking over one dead worker's connections: one conditional write
    per connection, whose owner is the by-owner index key (1 + 2 units), plus marking
    the session dead (1 + 2)."""
    return 3 * scale.per_worker + 3


def compare(scale: Scale, prices: Prices) -> list[DesignFigures]:
    return [
        current(scale, prices),
        sessions(scale, prices, packed=True),
        sessions(scale, prices, packed=False),
    ]


def to_json(scale: Scale, designs: list[DesignFigures]) -> dict[str, object]:
    base = designs[0].load.write_units_per_second
    return {
        "connections": scale.connections,
        "workers": scale.workers,
        "timing": asdict(scale.timing),
        "takeover_write_units_per_dead_worker": takeover_write_units(scale),
        "designs": [
            {
                "name": d.name,
                "write_units_per_second": round(d.load.write_units_per_second, 1),
                "index_writes_per_second": round(d.load.index_writes_per_second, 1),
                "read_units_per_second": round(d.load.reads_per_second, 1),
                "write_share_of_current": round(d.load.write_units_per_second / base, 4),
                "monthly_usd_on_demand": round(d.cost.on_demand, 2),
                "monthly_usd_provisioned": round(d.cost.provisioned, 2),
                "hottest_index_partition_writes_per_second": round(
                    d.hottest_index_partition_writes_per_second, 1
                ),
                "index_partition_limit": GSI_PARTITION_WRITES_PER_SECOND,
                "crash_failover_bound_s": round(d.crash_failover_bound_s, 2),
                "crash_duplicate_window_s": d.crash_duplicate_window_s,
                "partition_duplicate_window_s": round(d.partition_duplicate_window_s, 2),
            }
            for d in designs
        ],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.scale_model", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--connections", type=int, default=100_000)
    parser.add_argument("--per-worker", type=int, default=500)
    parser.add_argument("--lease-seconds", type=float, default=20.0)
    parser.add_argument("--checkpoint-seconds", type=float, default=60.0)
    args = parser.parse_args(argv)
    scale = Scale(
        connections=args.connections,
        per_worker=args.per_worker,
        timing=LeaseTiming.from_lease(args.lease_seconds),
        rare_checkpoint_seconds=args.checkpoint_seconds,
    )
    designs = compare(scale, Prices())
    result = to_json(scale, designs)
    rows = [
        [
            d["name"],
            d["write_units_per_second"],
            f"{d['write_share_of_current']:.1%}",
            d["read_units_per_second"],
            f"${d['monthly_usd_on_demand']:,.0f}",
            f"${d['monthly_usd_provisioned']:,.0f}",
            d["hottest_index_partition_writes_per_second"],
            d["crash_failover_bound_s"],
            d["crash_duplicate_window_s"],
        ]
        for d in result["designs"]  # type: ignore[attr-defined]
    ]
    print(
        f"{scale.connections:,} connections on {scale.workers} workers, lease "
        f"{scale.timing.lease:g} s, heartbeat {scale.timing.heartbeat:g} s"
    )
    print(
        table(
            [
                "design",
                "WCU/s",
                "of current",
                "RCU/s",
                "on-demand/month",
                "provisioned/month",
                "hottest index partition writes/s",
                "crash failover bound s",
                "crash duplicate window s",
            ],
            rows,
        )
    )
    print(json.dumps(result, separators=(",", ":")))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
