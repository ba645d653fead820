"""The demo feed as a test service; what its log says is read by
:func:`local_stack.feed_events.stream_events`."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from local_stack.feed_events import stream_events

__all__ = ["FeedService", "stream_events"]


@dataclass(frozen=True, slots=True)
class FeedService:
    url: str
    log_path: Path
