"""Monthly DynamoDB cost of the lease table for a fleet size and timing choice.

``python -m benchmarks.cost_model --connections 500 --lease-seconds 20 --workers 2``

Counts what the design writes, not what a formula hopes: every renew is one table
write plus two index writes (it changes the GSI sort key ``lease_expires_at_ms``,
which DynamoDB applies to the index as a delete and a put), and every reconcile pass
of every worker is one eventually consistent keys-only Query. Prices are inputs with
us-east-1 list prices as defaults.
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import asdict, dataclass

from wsfleet.timing import LeaseTiming

HOURS_PER_MONTH = 730.0
GSI_PARTITION_WRITES_PER_SECOND = 1000.0
"""What one index partition absorbs; all STARTED items share one partition value."""
INDEX_WRITES_PER_RENEW = 2
"""A changed index sort key is a delete plus a put in the index."""


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
    timing: LeaseTiming
    connection_churn_per_hour: float = 0.0
    """Starts + stops + failovers per connection per hour (each costs an acquire)."""


@dataclass(frozen=True, slots=True)
class Load:
    renews_per_second: float
    table_writes_per_second: float
    index_writes_per_second: float
    reads_per_second: float

    @property
    def write_units_per_second(self) -> float:
        return self.table_writes_per_second + self.index_writes_per_second


def load_of(fleet: Fleet) -> Load:
    renews = fleet.connections / fleet.timing.heartbeat
    acquires = fleet.connections * fleet.connection_churn_per_hour / 3600
    # An acquire also moves the sort key (new expiry): two index writes as well.
    table_writes = renews + acquires
    index_writes = INDEX_WRITES_PER_RENEW * (renews + acquires)
    # An eventually consistent Query reads at least 0.5 unit; keys-only items are tiny.
    reads = 0.5 * fleet.workers / fleet.timing.reconcile
    return Load(renews, table_writes, index_writes, reads)


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
    seconds = HOURS_PER_MONTH * 3600
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


def index_saturation_connections(timing: LeaseTiming) -> int:
    """Connections at which the single STARTED index partition reaches its write limit."""
    return int(GSI_PARTITION_WRITES_PER_SECOND * timing.heartbeat / INDEX_WRITES_PER_RENEW)


def report(fleet: Fleet, prices: Prices) -> dict[str, object]:
    load = load_of(fleet)
    cost = monthly_cost(load, prices)
    return {
        "connections": fleet.connections,
        "workers": fleet.workers,
        "timing": asdict(fleet.timing),
        "renews_per_second": round(load.renews_per_second, 2),
        "write_units_per_second": round(load.write_units_per_second, 2),
        "index_write_share": round(load.index_writes_per_second / load.write_units_per_second, 3)
        if load.write_units_per_second
        else 0.0,
        "read_units_per_second": round(load.reads_per_second, 3),
        "monthly_usd": {
            "on_demand": round(cost.on_demand, 2),
            "provisioned": round(cost.provisioned, 2),
            "on_demand_writes": round(cost.on_demand_writes, 2),
            "provisioned_writes": round(cost.provisioned_writes, 2),
        },
        "per_connection_month_usd": {
            "on_demand": round(cost.on_demand / fleet.connections, 4) if fleet.connections else 0,
            "provisioned": round(cost.provisioned / fleet.connections, 4)
            if fleet.connections
            else 0,
        },
        "index_partition_saturates_at_connections": index_saturation_connections(fleet.timing),
        "prices": asdict(prices),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--connections", type=int, default=500)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--lease-seconds", type=float, default=20.0)
    parser.add_argument("--heartbeat-seconds", type=float, default=None)
    parser.add_argument("--reconcile-seconds", type=float, default=None)
    parser.add_argument("--churn-per-hour", type=float, default=0.0)
    parser.add_argument("--json", action="store_true", help="print JSON only")
    args = parser.parse_args(argv)
    timing = LeaseTiming.from_lease(
        args.lease_seconds, heartbeat=args.heartbeat_seconds, reconcile=args.reconcile_seconds
    )
    fleet = Fleet(args.connections, args.workers, timing, args.churn_per_hour)
    result = report(fleet, Prices())
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    cost = result["monthly_usd"]
    assert isinstance(cost, dict)
    print(
        f"{fleet.connections} connections, {fleet.workers} workers, lease {timing.lease:g} s, "
        f"heartbeat {timing.heartbeat:g} s, reconcile {timing.reconcile:g} s"
    )
    print(f"  renews/s                     {result['renews_per_second']}")
    print(
        f"  write units/s                {result['write_units_per_second']} "
        f"(index share {result['index_write_share']:.0%})"
    )
    print(f"  read units/s                 {result['read_units_per_second']}")
    print(f"  monthly, on-demand           ${cost['on_demand']:,.2f}")
    print(f"  monthly, provisioned         ${cost['provisioned']:,.2f}")
    print(
        "  index partition saturates at "
        f"{result['index_partition_saturates_at_connections']:,} connections"
    )
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
