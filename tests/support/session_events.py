"""A stand-in for the event loop a :class:`~worker.session.SessionKeeper` reports to:
each callback runs at once on the keeper's thread, recorded for the test to wait on."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from worker.session import SessionEvents


@dataclass
class Landed:
    sent_at: float
    answered_at: float


@dataclass
class Told:
    """What the keeper told its loop, in order."""

    landed: list[Landed] = field(default_factory=list)
    failures: int = 0
    reaped: int = 0
    given_up: list[float] = field(default_factory=list)
    """When each give-up was told (monotonic)."""
    changed: threading.Condition = field(default_factory=threading.Condition)

    def call_soon_threadsafe(self, callback: Callable[..., None], *args: Any) -> None:
        with self.changed:
            callback(*args)
            self.changed.notify_all()

    def events(self) -> SessionEvents:
        def renewed(gen: int, sent_at: float, lateness: float, notices: frozenset[str]) -> None:
            self.landed.append(Landed(sent_at, time.monotonic()))

        def failed(gen: int, lateness: float) -> None:
            self.failures += 1

        def reaped(gen: int) -> None:
            self.reaped += 1

        def given_up(gen: int) -> None:
            self.given_up.append(time.monotonic())

        return SessionEvents(renewed, failed, reaped, given_up)

    def wait(self, predicate: Callable[[], bool], timeout: float, what: str) -> None:
        with self.changed:
            if not self.changed.wait_for(predicate, timeout):
                raise TimeoutError(
                    f"timed out after {timeout:g} s waiting for {what}"
                    f" ({len(self.landed)} landed, {self.failures} failed)"
                )
