"""Connection slots of one worker (``MAX_CONNECTIONS``).

A slot is reserved before an acquire is attempted, so the SQS path and the
reconciler together never overshoot the cap.
"""

from __future__ import annotations

import asyncio


class Capacity:
    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError("capacity must be >= 1")
        self._limit = limit
        self._used = 0
        self._changed = asyncio.Condition()

    @property
    def limit(self) -> int:
        return self._limit

    @property
    def used(self) -> int:
        return self._used

    @property
    def free(self) -> int:
        return self._limit - self._used

    def try_reserve(self) -> bool:
        if self._used >= self._limit:
            return False
        self._used += 1
        return True

    async def release(self) -> None:
        if self._used <= 0:
            raise RuntimeError("released more slots than were reserved")
        self._used -= 1
        async with self._changed:
            self._changed.notify_all()

    async def wait_for_free(self) -> None:
        """Return once at least one slot is free."""
        async with self._changed:
            await self._changed.wait_for(lambda: self.free > 0)
