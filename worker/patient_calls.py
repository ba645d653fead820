"""DynamoDB calls that a slow path cannot turn into unknown outcomes.

The shared client abandons an attempt after a third of a heartbeat (at least 0.5 s),
so that a lost reply, or a request lost in a partition, costs little. On a path that is
slow but alive (round trips between that timeout and the renew window, docs/DESIGN.md
§3.11) every such attempt would time out and land all the same: acquires that land
unseen, releases never answered, listings that never come, while the session, renewed
on its own client with the whole window, lives on. The renews are the probe: each one
answered tells the path's round trip, and so does every other answer to a first
attempt. While the latest round trip is longer than a short attempt, calls go to a
patient client, whose attempt waits as long as a renew's; otherwise to the short one.
A timeout tells nothing (a reply lost on a fast path, a partition), so it changes
nothing.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from botocore.exceptions import ClientError

log = logging.getLogger(__name__)


@dataclass
class RoundTrips:
    """What the latest DynamoDB answers say of the path's speed; no clock (it is told
    each round trip). Fed from executor threads and the event loop."""

    short_attempt: float
    """Seconds a short attempt waits for its answer."""
    slow: bool = False
    """The latest answer took longer than a short attempt: calls go to the patient
    client, and the worker takes no work it may leave to others (moves, takeovers)."""
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def answered(self, seconds: float) -> bool:
        """A renew or a call was answered after ``seconds``; whether that changed
        :attr:`slow`."""
        with self._lock:
            was, self.slow = self.slow, seconds > self.short_attempt
            changed = was != self.slow
        if changed and self.slow:
            log.warning(
                "DynamoDB round trips are longer than a short attempt: calls go to the"
                " patient client, and this worker publishes no room",
                extra={"round_trip_seconds": round(seconds, 3)},
            )
        elif changed:
            log.info("DynamoDB round trips are short again")
        return changed


class PatientClient:
    """A DynamoDB client (any method of it) that calls ``short``, or ``patient`` while
    the path is slow; each answer to a first attempt times the path for ``trips``.
    Called from executor threads."""

    def __init__(
        self,
        short: Any,
        patient: Any,
        trips: RoundTrips,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._short = short
        self._patient = patient
        self.trips = trips
        self._clock = clock

    def __getattr__(self, name: str) -> Any:
        short = getattr(self._short, name)
        if not callable(short):
            return short
        patient = getattr(self._patient, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            method = patient if self.trips.slow else short
            started = self._clock()
            try:
                result = method(*args, **kwargs)
            except ClientError as error:
                # An error answer (a failed condition, say) is an answer all the same.
                self._answered(error.response, started)
                raise
            self._answered(result, started)
            return result

        return call

    def _answered(self, response: Any, started: float) -> None:
        """Only an answer to a first attempt times the path: one after retries (a lost
        reply, a throttle's backoff) says how long the retries took."""
        metadata = response.get("ResponseMetadata", {}) if isinstance(response, dict) else {}
        if metadata.get("RetryAttempts", 0) == 0:
            self.trips.answered(self._clock() - started)
