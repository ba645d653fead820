"""What the store tests against DynamoDB Local share: their timing, clock and URL."""

from __future__ import annotations

from wsfleet.lease_rules import Lease
from wsfleet.timing import LeaseTiming

STORE_TIMING = LeaseTiming.from_lease(20)
"""Long enough that nothing lapses by itself while a test runs (lease 20 000 ms,
skew 250 ms); every time is passed in."""
T0 = 1_800_000_000_000
URL = "wss://feed.example/a"


def won(result: object) -> Lease:
    assert isinstance(result, Lease), result
    return result
