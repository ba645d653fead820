"""What the demo feed's log says about its streams: when each one was opened and
closed, on the feed's own clock (``python -m local_stack.feed`` logs ``open '/name?...'``
and ``done '/name?...'`` with a timestamp), so a test or a benchmark can tell when a
worker really closed an upstream socket."""

from __future__ import annotations

import re
from datetime import datetime
from pathlib import Path

_LINE = re.compile(
    r"^(?P<at>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) \S+ \S+ (?P<event>open|done) '/(?P<name>[^?']*)"
)


def stream_events(log_path: Path, name: str, event: str) -> list[float]:
    """Epoch seconds of every ``event`` (``open`` or ``done``) of the stream ``name``."""
    times = []
    for line in log_path.read_text(errors="replace").splitlines():
        found = _LINE.match(line)
        if found and found["event"] == event and found["name"] == name:
            at = datetime.strptime(found["at"], "%Y-%m-%d %H:%M:%S,%f")
            times.append(at.timestamp())  # the feed logs local time, as this reads it
    return times
