"""One scale factor for every timeout and deadline of the tests, as python-websockets
scales its own: ``TEST_TIME_SCALE=3 pytest`` gives each wait three times as long on a
slow or busy machine. What a test sets up (leases, handler delays, feed rates) is not
scaled: only how long it waits for the system to keep its promises."""

from __future__ import annotations

import os
from typing import Final

TIME_SCALE: Final = float(os.environ.get("TEST_TIME_SCALE", "1"))


def scaled(seconds: float) -> float:
    """``seconds`` of waiting, times the factor."""
    return seconds * TIME_SCALE
