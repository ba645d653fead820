"""Pacing of new upstream connects, per host (docs/DESIGN.md §4.4, "Connect pacing").

After a takeover a worker may open hundreds of connections to the same upstream host
at once, and real upstreams rate-limit connects per client. Every connect attempt of
a worker (first connects, reconnects after failures, takeovers) first reserves a slot
in the token bucket of its host: ``burst`` slots at once after an idle period, then
``rate`` per second.

:class:`TokenBucket` is the rule, pure: no I/O and no clock of its own, it is given
``now``. Reservations are taken in order and never given back, so N connects waiting
at once get N distinct slots ``1 / rate`` apart. :class:`ConnectPacer` keeps one
bucket per host and sleeps for the reserved time, plus a jitter of a random fraction
of one token interval when it has to wait at all (so connects released together by
one slot boundary do not all go at the same instant).
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
from collections.abc import Awaitable, Callable
from typing import Final
from urllib.parse import urlsplit

log = logging.getLogger(__name__)

FORGET_SECONDS: Final = 60.0
"""How often, at most, the buckets that are full again are forgotten. A full bucket
behaves exactly like a new one, so forgetting it changes nothing but the memory."""
LOG_WAIT_SECONDS: Final = 1.0
"""A connect that has to wait longer than this is logged (debug)."""
_TOKEN_EPSILON: Final = 1e-9
"""A token short by less than this (float rounding of the refill) is a whole one."""


class TokenBucket:
    """``burst`` tokens, refilled at ``rate`` per second up to ``burst``; a reservation
    takes one token, and when none is left it books the next one to come (the count
    goes negative). ``burst == 0`` or ``rate == 0``: unlimited, every reservation goes
    at once."""

    __slots__ = ("_at", "_tokens", "burst", "rate")

    def __init__(self, burst: int, rate: float) -> None:
        if burst < 0:
            raise ValueError(f"burst must be >= 0, got {burst}")
        if not (math.isfinite(rate) and rate >= 0):
            raise ValueError(f"rate must be a finite number >= 0, got {rate}")
        self.burst = burst
        self.rate = rate
        self._tokens = float(burst)
        self._at: float | None = None
        """When ``_tokens`` was last brought up to date; None: never used (full)."""

    @property
    def unlimited(self) -> bool:
        return self.burst == 0 or self.rate == 0

    def reserve(self, now: float) -> float:
        """Take the next slot: seconds from ``now`` until it comes, 0 for at once. A
        reservation is never given back (a connect that is abandoned while it waits
        leaves its slot unused)."""
        if self.unlimited:
            return 0.0
        self._tokens = self._available(now) - 1
        self._at = now if self._at is None else max(self._at, now)
        if self._tokens > -_TOKEN_EPSILON:
            return 0.0
        return self._at - now + -self._tokens / self.rate

    def full(self, now: float) -> bool:
        """Nothing is booked and every token is back: the same as a new bucket."""
        return self.unlimited or self._available(now) > self.burst - _TOKEN_EPSILON

    def _available(self, now: float) -> float:
        """Tokens at ``now`` (negative while slots to come are booked), capped at
        ``burst``. A ``now`` earlier than the last one refills nothing."""
        if self._at is None:
            return float(self.burst)
        elapsed = max(0.0, now - self._at)
        return min(float(self.burst), self._tokens + elapsed * self.rate)


def host_of(url: str) -> str:
    """The host name a URL connects to, lowercased (the port is left out); "" for a
    URL without one (such URLs share a bucket, and their connect fails anyway)."""
    try:
        return urlsplit(url).hostname or ""
    except ValueError:
        return ""


class ConnectPacer:
    """One :class:`TokenBucket` per upstream host, shared by every connection of a
    worker; ``await pacer.wait(url)`` before each connect attempt. The defaults
    (``burst`` 0) pace nothing."""

    def __init__(
        self,
        burst: int = 0,
        rate: float = 0.0,
        *,
        rng: random.Random | None = None,
        clock: Callable[[], float] | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        """``clock``: seconds, the running loop's time by default; ``sleep``: how the
        wait is spent (cancellable: cancelling :meth:`wait` ends it at once)."""
        TokenBucket(burst, rate)  # validates both
        self.burst = burst
        self.rate = rate
        self._rng = rng or random.Random()
        self._clock = clock
        self._sleep = sleep
        self._buckets: dict[str, TokenBucket] = {}
        self._forget_at: float | None = None

    @property
    def unlimited(self) -> bool:
        return self.burst == 0 or self.rate == 0

    @property
    def hosts(self) -> int:
        """How many buckets are kept (hosts connected to lately)."""
        return len(self._buckets)

    def delay(self, url: str, now: float) -> float:
        """Reserve the next connect slot of ``url``'s host at ``now``: seconds to wait
        before connecting, jitter included (0: connect at once)."""
        if self.unlimited:
            return 0.0
        self._forget_full(now)
        host = host_of(url)
        bucket = self._buckets.get(host)
        if bucket is None:
            bucket = self._buckets[host] = TokenBucket(self.burst, self.rate)
        wait = bucket.reserve(now)
        if wait <= 0:
            return 0.0
        return wait + self._rng.random() / self.rate

    async def wait(self, url: str) -> None:
        """Wait for the next connect slot of ``url``'s host (returns at once without
        pacing). Cancelling it ends the wait at once; the slot stays used."""
        if self.unlimited:
            return
        delay = self.delay(url, self._now())
        if delay <= 0:
            return
        if delay > LOG_WAIT_SECONDS:
            log.debug(
                "upstream connect paced",
                extra={"host": host_of(url), "wait_seconds": round(delay, 3)},
            )
        await self._sleep(delay)

    def _now(self) -> float:
        return self._clock() if self._clock is not None else asyncio.get_running_loop().time()

    def _forget_full(self, now: float) -> None:
        """At most once per :data:`FORGET_SECONDS`, drop the buckets that are full
        again: memory stays bounded by the hosts connected to lately."""
        if self._forget_at is not None and now < self._forget_at:
            return
        self._forget_at = now + FORGET_SECONDS
        for host in [h for h, bucket in self._buckets.items() if bucket.full(now)]:
            del self._buckets[host]
