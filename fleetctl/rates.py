"""MSG/S in the fleet views (``fleetctl watch`` and the local live view).

The views compute no rate of their own: each connection's MSG/S is its view's
``messages_per_second``, the count of messages its owner handled over its last
checkpoint interval (``CHECKPOINT_SECONDS``), as the owner wrote it into its
checkpoint page (docs/DESIGN.md §3.5, "Health"). One rule, the owner's, so every
viewer of a fleet shows the same number however often it polls.

Also here: :func:`parse_time_ms`, which reads the API's timestamps back exactly.

Pure: no I/O, no clock.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any, Final

RATE_LEGEND: Final = (
    "msg/s = the owner's count over its last checkpoint interval (CHECKPOINT_SECONDS); "
    "'-' while no live worker runs the connection"
)
"""One line that says what the MSG/S column means, for the views and their help."""

_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)
_ONE_MS: Final = timedelta(milliseconds=1)


def parse_time_ms(text: Any) -> int | None:
    """An ISO 8601 timestamp as the API writes it, in epoch milliseconds (exact, no
    float rounding); None when absent or not a timestamp. Naive times count as UTC."""
    if not isinstance(text, str) or not text:
        return None
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return (moment - _EPOCH) // _ONE_MS
