"""What the store tests against DynamoDB Local share: their timing, clock and URL."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from tests.support.timing import scaled
from wsfleet.lease_rules import Lease
from wsfleet.timing import LeaseTiming

STORE_TIMING = LeaseTiming.from_lease(20)
"""Long enough that nothing lapses by itself while a test runs (lease 20 000 ms);
every time is passed in."""
T0 = 1_800_000_000_000
URL = "wss://feed.example/a"


def won(result: object) -> Lease:
    assert isinstance(result, Lease), result
    return result


def eventually(
    probe: Callable[[], Any], wanted: Callable[[Any], bool], within: float = 10.0
) -> Any:
    """Poll an eventually consistent read (an index) until ``wanted`` holds; the last
    answer otherwise, for the assertion that follows to show."""
    deadline = time.monotonic() + scaled(within)
    while True:
        got = probe()
        if wanted(got) or time.monotonic() >= deadline:
            return got
        time.sleep(0.02)


def with_attributes(item: dict[str, Any], attributes: dict[str, Any]) -> dict[str, Any]:
    """A typed item with ``attributes`` set on it (a value of None removes one)."""
    changed = dict(item)
    for name, value in attributes.items():
        if value is None:
            changed.pop(name, None)
        else:
            changed[name] = value
    return changed
