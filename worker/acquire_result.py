"""What an attempt to take a connection came to, from the worker's point of view."""

from __future__ import annotations

import enum


class AcquireResult(enum.Enum):
    WON = "won"
    ALREADY_MINE = "already_mine"
    HELD = "held"
    """Another session owns it (live, or dead and about to be taken over)."""
    STOPPED = "stopped"
    PARKED = "parked"
    """Its upstream was given up on; nobody takes it until the router re-arms it."""
    UNKNOWN_ID = "unknown_id"
    NO_CAPACITY = "no_capacity"
    CLOSING = "closing"
    """The worker is shutting down and takes no more work."""
    NO_SESSION = "no_session"
    """The worker's session is not open or not renewed lately: it takes nothing now."""

    @property
    def settled(self) -> bool:
        """The outcome is known and final for this hint: its message can be deleted."""
        return self not in (
            AcquireResult.NO_CAPACITY,
            AcquireResult.CLOSING,
            AcquireResult.NO_SESSION,
        )
