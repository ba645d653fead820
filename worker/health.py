"""Container health: the event loop stamps a file; the health command checks its age.

``python -m worker.health`` exits 0 while the stamp is younger than three
heartbeats and never less than 10 s (``LeaseTiming.stale_health_after``), 1 otherwise
(missing file included). The ECS task definition runs it.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from worker.config import DEFAULT_HEALTH_FILE, HEALTH_FILE, ConfigError, timing_from_env


def stamp(path: Path) -> None:
    """Record that the event loop is running now."""
    path.touch()


def stamp_age(path: Path, now: float) -> float | None:
    try:
        return now - path.stat().st_mtime
    except FileNotFoundError:
        return None


def is_healthy(age: float | None, stale_after: float) -> bool:
    return age is not None and age <= stale_after


def main() -> int:
    path = Path(os.environ.get(HEALTH_FILE) or DEFAULT_HEALTH_FILE)
    try:
        stale_after = timing_from_env(os.environ).stale_health_after
    except ConfigError as error:
        print(f"unhealthy: {error}", file=sys.stderr)
        return 1
    age = stamp_age(path, time.time())
    if is_healthy(age, stale_after):
        return 0
    what = "missing" if age is None else f"{age:.1f} s old"
    print(
        f"unhealthy: event loop stamp {path} is {what} (limit {stale_after:.1f} s)",
        file=sys.stderr,
    )
    return 1


if __name__ == "__main__":
    sys.exit(main())
