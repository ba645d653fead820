"""DynamoDB calls that a slow path cannot turn into unknown outcomes.

The shared client abandons an attempt after a third of a heartbeat (at least 0.5 s),
so that a lost reply costs little. On a path that is slow but alive (round trips
between that timeout and the renew window, docs/DESIGN.md §3.11), every attempt would
then time out and land all the same: acquires that land unseen, releases never
answered, listings that never come, while the session, renewed on its own client with
the whole window, lives on. So a call whose short attempts all timed out goes once
more on a patient client, whose attempt waits as long as a renew's; and while the
latest round trip was longer than a short attempt, calls go straight to the patient
client. A retry is safe here for the reason botocore's own retries are: every write
is conditional and recognises its own earlier landing (docs/DESIGN.md §3.2).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from botocore.exceptions import ClientError, ConnectTimeoutError, ReadTimeoutError

log = logging.getLogger(__name__)

TIMEOUTS = (ReadTimeoutError, ConnectTimeoutError)
"""What a slow path raises (an error answer, or a refused connection, is no sign of
slowness)."""


@dataclass
class RoundTrips:
    """What the latest DynamoDB calls say of the path's speed; no I/O, no clock."""

    short_attempt: float
    """Seconds a short attempt waits for its answer."""
    slow: bool = False
    """The latest call's round trip was longer than a short attempt: calls go to the
    patient client, and the worker takes no work it has a choice about (moves)."""

    def answered(self, seconds: float) -> None:
        """A call was answered after ``seconds``. Only answers tell the path's speed:
        an attempt that timed out may have had its reply lost on a fast path."""
        self.slow = seconds > self.short_attempt


class PatientClient:
    """A DynamoDB client (any method of it) that tries ``short`` first and, when its
    attempts time out, ``patient`` once; straight to ``patient`` while the path is slow.
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
        self._lock = threading.Lock()

    def __getattr__(self, name: str) -> Any:
        short = getattr(self._short, name)
        if not callable(short):
            return short
        patient = getattr(self._patient, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            with self._lock:
                slow = self.trips.slow
            if not slow:
                try:
                    return self._timed(short, args, kwargs)
                except TIMEOUTS:
                    pass
            return self._timed(patient, args, kwargs)

        return call

    def _timed(self, method: Callable[..., Any], args: Any, kwargs: Any) -> Any:
        started = self._clock()
        try:
            result = method(*args, **kwargs)
        except ClientError:
            # An error answer (a failed condition, say) is an answer all the same.
            self._answered(self._clock() - started)
            raise
        self._answered(self._clock() - started)
        return result

    def _answered(self, seconds: float) -> None:
        with self._lock:
            was = self.trips.slow
            self.trips.answered(seconds)
            now = self.trips.slow
        if now != was:
            if now:
                log.warning(
                    "DynamoDB round trips are longer than a short attempt: calls go to"
                    " the patient client, and this worker publishes no room",
                    extra={"short_attempt_seconds": self.trips.short_attempt},
                )
            else:
                log.info("DynamoDB round trips are short again")
