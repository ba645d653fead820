"""Wall-clock time in the table's unit, and waiting for a condition with a deadline,
for the local stack, the benchmarks and the tests."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

#: How often :func:`wait_until` asks by default.
POLL_S = 0.05


def now_ms() -> int:
    """Epoch milliseconds, the unit of the table's times (``expires_at_ms``...)."""
    return time.time_ns() // 1_000_000


def wait_until(
    predicate: Callable[[], T | None], timeout: float, what: str, interval: float = POLL_S
) -> T:
    """Ask ``predicate`` every ``interval`` seconds until it returns something truthy,
    and return that. Raises TimeoutError naming ``what`` once ``timeout`` seconds have
    passed; whatever ``predicate`` raises goes through."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(interval)
