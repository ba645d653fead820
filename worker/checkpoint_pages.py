"""The session's checkpoint page (docs/DESIGN.md §3.5): every ``CHECKPOINT_SECONDS``,
the checkpoint of every connection of the live session in one item, written only when
one of them moved since the last page of that session."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import replace

from worker.holdings import Holdings
from worker.standing import Standing
from wsfleet.checkpoint_page import PageEntry
from wsfleet.session_store import SessionStore

log = logging.getLogger(__name__)


class CheckpointPages:
    def __init__(
        self,
        *,
        worker_id: str,
        sessions: SessionStore,
        holdings: Holdings,
        standing: Standing,
        wall_ms: Callable[[], int],
        every: float,
    ) -> None:
        self._worker_id = worker_id
        self._sessions = sessions
        self._holdings = holdings
        self._standing = standing
        self._wall_ms = wall_ms
        self._every = every
        self._written: dict[str, PageEntry] = {}
        """The last page written, without its times (what decides whether a new one is due)."""
        self._number = 0
        """The last page's number: every write takes the next, a retry included."""

    def forget(self) -> None:
        """A new session was opened: the pages of the one before count for nothing."""
        self._written = {}

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self._every)
            try:
                await self.write()
            except Exception as error:
                log.warning("checkpoint page write failed", extra={"error": repr(error)})

    async def write(self) -> bool:
        """Write the session's page now; False when there was nothing new."""
        loop = asyncio.get_running_loop()
        gen = self._standing.session_gen
        now, now_ms = loop.time(), self._wall_ms()
        entries = {
            cid: runner.page_entry(now, now_ms)
            for cid, runner in self._holdings.runners.items()
            if runner.lease.session_gen == gen
        }
        for cid, entry in self._holdings.unanswered.items():
            entries.setdefault(cid, entry)
        # The times of the last advance move only with the seqs: leave them out, or a
        # rounding millisecond would count as news.
        checkpoints = {cid: replace(e, advanced_at_ms=None) for cid, e in entries.items()}
        if gen == 0 or checkpoints == self._written:
            return False
        self._number += 1
        await loop.run_in_executor(
            None, self._sessions.write_page, self._worker_id, gen, entries, now_ms, self._number
        )
        self._written = checkpoints
        return True
