"""Small helpers shared by the benchmark scripts: percentiles and the printed output
(a readable table, then one JSON line with every figure)."""

from __future__ import annotations

import contextlib
import json
import math
import os
import platform
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (``q`` in 0..100) of a non-empty sequence: the smallest
    value with at least ``q`` percent of the values at or below it."""
    if not values:
        raise ValueError("percentile of no values")
    if not 0 <= q <= 100:
        raise ValueError(f"q must be within 0..100, got {q}")
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def summary(values: Sequence[float], digits: int = 3) -> dict[str, float | int]:
    """n, p50, p99, max and mean of ``values`` (empty -> just n = 0)."""
    if not values:
        return {"n": 0}
    return {
        "n": len(values),
        "p50": round(percentile(values, 50), digits),
        "p99": round(percentile(values, 99), digits),
        "max": round(max(values), digits),
        "mean": round(sum(values) / len(values), digits),
    }


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A plain-text table, columns padded to their widest cell."""
    cells = [[str(h) for h in headers], *[[_cell(c) for c in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(line.rstrip() for line in lines)


def _cell(value: object) -> str:
    if isinstance(value, float):
        return f"{value:,.3f}" if abs(value) < 100 else f"{value:,.1f}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return str(value)


def emit(title: str, text: str, result: dict[str, Any]) -> None:
    """Print ``title``, the readable ``text`` and then ``result`` as one JSON line."""
    print(title)
    print(text)
    print(json.dumps(result, separators=(",", ":"), sort_keys=True))


def machine() -> dict[str, Any]:
    """Cores, memory, Python and Java versions of this machine, for the record."""
    info: dict[str, Any] = {
        "cpus": _cpu_count(),
        "python": platform.python_version(),
        "kernel": platform.release(),
    }
    try:
        meminfo = Path("/proc/meminfo").read_text().splitlines()
        total_kb = int(next(line for line in meminfo if line.startswith("MemTotal:")).split()[1])
        info["memory_gib"] = round(total_kb / 1024 / 1024, 1)
    except (OSError, StopIteration, ValueError):
        pass
    try:
        model = next(
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        )
        info["cpu_model"] = model
    except (OSError, StopIteration):
        pass
    try:
        java = subprocess.run(
            ["java", "-version"], capture_output=True, text=True, timeout=20, check=False
        )
        info["java"] = (java.stderr or java.stdout).splitlines()[0]
    except (OSError, subprocess.SubprocessError, IndexError):
        info["java"] = None
    with contextlib.suppress(OSError):
        info["load_average"] = [
            round(float(x), 2) for x in Path("/proc/loadavg").read_text().split()[:3]
        ]
    return info


def _cpu_count() -> int:
    return len(os.sched_getaffinity(0))
