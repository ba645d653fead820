"""The machine's own share of event-loop lag: a process that does nothing but the
worker's lag probe (a 20 ms timer, :func:`worker.loop_watch.probe_lag`), run beside a
benchmark's worker over the same window. What it measures is how late a process that
needs almost no CPU is scheduled on this machine at that moment; a worker's lag above
it is the worker's own.

``python -m benchmarks.lag_control --seconds 20`` prints one JSON line:
``{"samples": N, "p50_ms": ..., "p99_ms": ..., "max_ms": ...}``.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json

from worker.loop_watch import probe_lag
from worker.metrics import FleetMetrics


async def measure(seconds: float) -> dict[str, float | int]:
    metrics = FleetMetrics(
        namespace="control",
        service="control",
        task_id="control",
        active_connections=lambda: 0,
        out=io.StringIO(),
    )
    probe = asyncio.create_task(probe_lag(metrics))
    await asyncio.sleep(seconds)
    probe.cancel()
    summary = metrics.loop_summary()
    return {
        "samples": summary["lag_samples"],
        "p50_ms": summary.get("lag_p50_ms", 0.0),
        "p99_ms": summary.get("lag_p99_ms", 0.0),
        "max_ms": summary.get("lag_max_ms", 0.0),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.lag_control", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--seconds", type=float, default=20.0)
    args = parser.parse_args(argv)
    print(json.dumps(asyncio.run(measure(args.seconds))), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
