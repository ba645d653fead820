"""Crash failover and graceful handoff: our defaults against the seed's timings, in the
same run, on the same servers, with scaled timings.

``python -m benchmarks.failover [--repetitions 6] [--lease-seconds 2]``
``python -m benchmarks.failover --shipped-defaults --connections 600 --rate 10 --repetitions 10``

Two fleets run side by side on their own tables (``ours``: reconcile = 0.24 x lease and a
``reassign`` message on release; ``seed``: reconcile = 3 x lease, no ``reassign``), each
with ``--workers`` workers and ``--connections`` connections at ``--rate`` msg/s. Each
repetition, for each scenario and each fleet in turn:

- pick the worker that handles the most connections (from the delivery records);
- ``crash``: SIGKILL it; ``handoff``: SIGTERM it;
- measure, per connection it handled, the time from the signal to the first delivery
  by another worker (recording handler timestamps); the figure of the repetition is the
  slowest of its connections (every one handled elsewhere);
- start a replacement and wait until every connection flows again.

With ``--shipped-defaults`` only ``ours`` runs, with no timing set at all (the
worker's shipped defaults: lease 2.2 s, heartbeat and reconcile 0.594 s, margin 0.22 s).

Reported: p50 and max over repetitions, per scenario and fleet, the bound docs/DESIGN.md §3.11
promises for those timings, the ratio seed / ours, the duplicates (deliveries by the
new owners of seqs the victim had already handled: 0 is the promise of a handoff) and
the takeover writes refused by their condition, as a share of the connections moved
(from the sweepers' "dead session swept" log lines). Nothing is asserted.
"""

from __future__ import annotations

import argparse
import itertools
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.profiles import Profile, ours, seed
from benchmarks.report import emit, machine, percentile, summary, table
from local_stack.audit import Record
from local_stack.clock import wait_until
from local_stack.fleet import Deployment
from local_stack.recording import DeliveryTracker
from local_stack.server_group import LocalServers
from local_stack.stop_requests import sigterm_as_interrupt
from local_stack.workers import parse_log_time
from wsfleet.timing import DEFAULT_LEASE_SECONDS, LeaseTiming

SCENARIOS = {"crash": signal.SIGKILL, "handoff": signal.SIGTERM}
FLOWING_WITHIN_S = 0.5
DUPLICATES_AFTER_S = 1.0
SETTLE_TIMEOUT_S = 60.0


@dataclass
class Fleet:
    """One deployment, its timing profile and the deliveries it makes."""

    profile: Profile
    timing: LeaseTiming
    deployment: Deployment
    tracker: DeliveryTracker
    connection_ids: list[str]
    ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    results: dict[str, list[float]] = field(default_factory=dict)
    details: dict[str, list[Measured]] = field(default_factory=dict)

    def bound(self, scenario: str) -> float:
        """What docs/DESIGN.md §3.11 promises for this scenario under these timings."""
        if scenario == "crash":
            return self.timing.crash_failover_bound()
        if self.profile.env.get("REASSIGN_ON_RELEASE") == "false":
            # The seed: a released lease waits for the next reconcile of any worker.
            return 1.2 * self.timing.reconcile + 1.0
        return 1.0

    def start_workers(self, count: int) -> None:
        names = [f"{self.profile.name}-w{next(self.ids)}" for _ in range(count)]
        self.deployment.start_workers(names, self.profile.env)

    def settle(self, workers: int) -> None:
        """Bring the fleet back to ``workers`` and wait until every connection flows."""
        missing = workers - len(self.deployment.live_workers())
        if missing > 0:
            self.start_workers(missing)
        wait_until(
            lambda: self.tracker.flowing(self.connection_ids, FLOWING_WITHIN_S),
            SETTLE_TIMEOUT_S,
            f"every {self.profile.name} connection to flow",
        )


@dataclass(frozen=True)
class Measured:
    seconds: float
    """From the signal to the slowest of the victim's connections' first delivery by
    another worker."""
    moved: int
    duplicates: int
    """Deliveries by the new owners of seqs the victim had already handled."""
    failed_takeover_writes: int
    """Takeover writes refused by their condition, summed over the sweepers' logs."""
    steps: dict[str, float] = field(default_factory=dict)
    """Where the seconds went, each from the signal (worker log times): a crash's
    reap and its last sweep; a handoff's releases and offers done at the victim and
    the receivers' last acquires; the median connection's first delivery elsewhere."""


def measure(fleet: Fleet, scenario: str) -> Measured:
    """Signal the busiest worker; seconds until each of its connections was handled by
    another worker (the slowest), how many it had, the duplicates and the takeover
    writes that failed."""
    fleet.tracker.poll()
    live = {w.worker_id: w for w in fleet.deployment.live_workers()}
    victim_id = max(live, key=lambda wid: len(fleet.tracker.handled_by(wid)))
    victim = live[victim_id]
    theirs = fleet.tracker.handled_by(victim_id)
    victim_last = {cid: fleet.tracker.latest[cid].seq for cid in theirs}
    others: list[Record] = []
    signalled = time.time()
    victim.signal(SCENARIOS[scenario])
    first_elsewhere: dict[str, float] = {}

    def take(records: list[Record]) -> None:
        for record in records:
            cid = record.connection_id
            if cid not in victim_last:
                continue
            if record.worker == victim_id:
                if not record.failed:
                    victim_last[cid] = max(victim_last[cid], record.seq)
                continue
            if record.t > signalled:
                others.append(record)
                first_elsewhere.setdefault(cid, record.t)

    def all_elsewhere() -> bool:
        take(fleet.tracker.poll())
        return len(first_elsewhere) == len(theirs)

    timeout = 3 * fleet.bound(scenario) + 10
    wait_until(all_elsewhere, timeout, f"{fleet.profile.name} {scenario} takeover", 0.01)
    victim.wait(30)
    time.sleep(DUPLICATES_AFTER_S)  # the new owners' first deliveries, duplicates or not
    take(fleet.tracker.poll())
    duplicates = sum(1 for r in others if not r.failed and r.seq <= victim_last[r.connection_id])
    failed_writes = sum(
        int(entry.get("failed_conditional_writes", 0))
        for worker in fleet.deployment.workers
        for entry in worker.logged("dead session swept")
        if entry.get("session_worker") == victim_id
    )
    firsts = sorted(first_elsewhere.values())
    steps = {
        **_steps(fleet, scenario, victim_id, signalled),
        "first_delivery_p50": percentile(firsts, 50) - signalled,
        "first_delivery_max": firsts[-1] - signalled,
    }
    return Measured(
        firsts[-1] - signalled,
        len(theirs),
        duplicates,
        failed_writes,
        {k: round(v, 3) for k, v in steps.items()},
    )


def _steps(fleet: Fleet, scenario: str, victim_id: str, signalled: float) -> dict[str, float]:
    """The log lines that mark each step of this failover or handoff, as seconds after
    the signal (the last of each kind, from workers other than the victim but for the
    victim's own drain)."""

    def last(
        message: str, *, victim: bool, match: Callable[[dict[str, Any]], bool] = lambda _: True
    ) -> float | None:
        times = [
            parse_log_time(entry["timestamp"])
            for worker in fleet.deployment.workers
            if (worker.worker_id == victim_id) == victim
            for entry in worker.logged(message)
            if match(entry)
        ]
        times = [t for t in times if t >= signalled]
        return max(times) - signalled if times else None

    if scenario == "crash":
        marks = {
            "reaped": last(
                "session reaped", victim=False, match=lambda e: e.get("session_worker") == victim_id
            ),
            "swept": last(
                "dead session swept",
                victim=False,
                match=lambda e: e.get("session_worker") == victim_id,
            ),
        }
    else:
        marks = {
            "released_and_offered": last("drain handed over", victim=True),
            # The receivers' acquires of what the drain offered (not a later balance move).
            "offers_taken": last(
                "offers", victim=False, match=lambda e: int(e.get("drained", 0)) > 0
            ),
        }
    return {k: v for k, v in marks.items() if v is not None}


def run(args: argparse.Namespace, work_dir: Path) -> dict[str, Any]:
    lease = None if args.shipped_defaults else args.lease_seconds
    profiles = [ours(lease)] if lease is None else [ours(lease), seed(lease)]
    with LocalServers(work_dir, feeds=1, feed_rate=args.rate) as stack:
        fleets: list[Fleet] = []
        for profile in profiles:
            deployment = stack.deployment(profile.name)
            ids = [f"{profile.name}-c{i}" for i in range(args.connections)]
            timing = LeaseTiming.from_lease(
                DEFAULT_LEASE_SECONDS if lease is None else lease,
                reconcile=float(profile.env["RECONCILE_SECONDS"])
                if "RECONCILE_SECONDS" in profile.env
                else None,
            )
            fleet = Fleet(profile, timing, deployment, DeliveryTracker(deployment.record_dir), ids)
            fleet.start_workers(args.workers)
            for cid in ids:
                deployment.start_connection(cid, stack.feed_url(cid, {"rate": args.rate}))
            fleets.append(fleet)
        for repetition in range(1, args.repetitions + 1):
            for scenario in SCENARIOS:
                for fleet in fleets:
                    fleet.settle(args.workers)
                    measured = measure(fleet, scenario)
                    fleet.results.setdefault(scenario, []).append(measured.seconds)
                    fleet.details.setdefault(scenario, []).append(measured)
                    print(
                        f"  #{repetition} {scenario:8} {fleet.profile.name:5} "
                        f"{measured.seconds:6.3f} s ({measured.moved} connections, "
                        f"{measured.duplicates} duplicates, "
                        f"{measured.failed_takeover_writes} failed takeover writes; "
                        f"steps {measured.steps})",
                        flush=True,
                    )
        return result_of(args, fleets)


def result_of(args: argparse.Namespace, fleets: list[Fleet]) -> dict[str, Any]:
    by_name = {f.profile.name: f for f in fleets}
    scenarios: dict[str, Any] = {}
    for scenario in SCENARIOS:
        entry: dict[str, Any] = {}
        for name, fleet in by_name.items():
            values = fleet.results[scenario]
            details = fleet.details[scenario]
            entry[name] = {
                **summary(values),
                "bound_s": round(fleet.bound(scenario), 3),
                "reconcile_s": fleet.timing.reconcile,
                "values_s": [round(v, 3) for v in values],
                "moved": [d.moved for d in details],
                "duplicates": [d.duplicates for d in details],
                "failed_takeover_writes": [d.failed_takeover_writes for d in details],
                "steps_s": [d.steps for d in details],
                "steps_p50_s": {
                    name: round(
                        percentile([d.steps[name] for d in details if name in d.steps], 50), 3
                    )
                    for name in sorted({k for d in details for k in d.steps})
                },
                "failed_takeover_writes_share_max": round(
                    max(d.failed_takeover_writes / max(1, d.moved) for d in details), 4
                ),
            }
        if "seed" in by_name:
            ours_values, seed_values = (
                by_name["ours"].results[scenario],
                by_name["seed"].results[scenario],
            )
            entry["ratio_seed_over_ours"] = {
                "p50": round(percentile(seed_values, 50) / percentile(ours_values, 50), 2),
                "max": round(max(seed_values) / max(ours_values), 2),
            }
        scenarios[scenario] = entry
    return {
        "benchmark": "failover",
        "lease_s": DEFAULT_LEASE_SECONDS if args.shipped_defaults else args.lease_seconds,
        "shipped_defaults": args.shipped_defaults,
        "workers": args.workers,
        "connections": args.connections,
        "rate": args.rate,
        "repetitions": args.repetitions,
        "scenarios": scenarios,
        "machine": machine(),
    }


def render(result: dict[str, Any]) -> str:
    rows = []
    for scenario, entry in result["scenarios"].items():
        for name in ("ours", "seed"):
            if name not in entry:
                continue
            s = entry[name]
            rows.append(
                [
                    scenario,
                    name,
                    s["reconcile_s"],
                    s["n"],
                    s["p50"],
                    s["max"],
                    s["bound_s"],
                    max(s["duplicates"]),
                    f"{100 * s['failed_takeover_writes_share_max']:.1f}%",
                ]
            )
        if "ratio_seed_over_ours" in entry:
            ratio = entry["ratio_seed_over_ours"]
            rows.append(
                [
                    scenario,
                    "seed / ours",
                    "",
                    "",
                    f"x{ratio['p50']}",
                    f"x{ratio['max']}",
                    "",
                    "",
                    "",
                ]
            )
    return table(
        [
            "scenario",
            "timings",
            "reconcile s",
            "n",
            "p50 s",
            "max s",
            "bound s",
            "duplicates (max)",
            "failed takeover writes / moved (max)",
        ],
        rows,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.failover", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--repetitions", type=int, default=6)
    parser.add_argument("--lease-seconds", type=float, default=2.0)
    parser.add_argument(
        "--shipped-defaults",
        action="store_true",
        help="run only our fleet, with the worker's shipped default timings",
    )
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--connections", type=int, default=6)
    parser.add_argument("--rate", type=float, default=20.0, help="messages/s per connection")
    parser.add_argument("--work-dir", type=Path, help="keep the logs here (default: a temp dir)")
    args = parser.parse_args(argv)
    if args.workers < 2 or args.repetitions < 1:
        parser.error("need --workers >= 2 and --repetitions >= 1")
    try:
        with sigterm_as_interrupt(), tempfile.TemporaryDirectory(prefix="failover-") as tmp:
            result = run(args, args.work_dir or Path(tmp))
    except KeyboardInterrupt:
        print("interrupted; every child process has been stopped", file=sys.stderr)
        return 130
    timings = "shipped defaults" if args.shipped_defaults else f"lease {args.lease_seconds:g} s"
    emit(
        f"failover, {timings}, {args.workers} workers, "
        f"{args.connections} connections, {args.repetitions} repetitions",
        render(result),
        result,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
