"""How one connection's upstream is doing, as its owner's checkpoint page reports it
(docs/DESIGN.md §3.5, "Health"): status, reconnects and the last error during the
current hold, and the rate of handled messages between two page lines.

Plain bookkeeping with no I/O: the runner sets the status as it connects, streams and
backs off, and tells it when an upstream connection ended; the page writer asks for
the rate every ``CHECKPOINT_SECONDS``.
"""

from __future__ import annotations

from wsfleet.checkpoint_page import CONNECTING, round_rate


class UpstreamHealth:
    def __init__(self, now: float, checkpoint: int) -> None:
        """``now``: loop time at the start of the hold; ``checkpoint``: its resume point."""
        self.status = CONNECTING
        self.reconnects = 0
        self.last_error: str | None = None
        self.keepalive_sent_ms: int | None = None
        """Wall ms of the last application-level keepalive sent, during the hold."""
        self.keepalive_answered_ms: int | None = None
        """Wall ms of the last answer to one."""
        self._since = now
        self._since_checkpoint = checkpoint

    def attempt_ended(self, why: str, status: str) -> None:
        """An upstream connection ended (or never opened) for ``why``; the connection
        now has ``status`` until its next attempt."""
        self.reconnects += 1
        self.last_error = why
        self.status = status

    def rate_since_last(self, now: float, checkpoint: int) -> float | None:
        """Messages handled per second since the previous call (or the hold's start),
        two significant digits (None when no time has passed); the next call measures
        from here."""
        elapsed = now - self._since
        handled = checkpoint - self._since_checkpoint
        if elapsed <= 0:
            return None
        self._since, self._since_checkpoint = now, checkpoint
        return round_rate(max(0, handled) / elapsed)
