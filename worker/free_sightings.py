"""When this worker first saw each free connection in the ``unowned`` index, so that
a sweep leaves a connection alone for a grace after it became free (docs/DESIGN.md
§4.4).

A balance move releases connections into the unowned index and offers them to one
receiver, which acquires them at its next renew. A sweep by any other worker in that
window would take a connection meant for someone else: the receiver then has room left
over that only a later sweep fills, and a worker that took one beyond its share gives
it back a round later. Waiting until a connection has been seen free on a scan at
least a grace earlier (two heartbeats: the receiver's renew and its acquire) gives
offers and ``reassign`` hints the first claim, and leaves the sweep to what nobody
claimed: its real job, the fallback.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from wsfleet import schema


@dataclass
class _Seen:
    first: float
    last: float


class FreeSightings:
    def __init__(self, grace: float) -> None:
        """``grace``: seconds a connection must have been seen free before a sweep
        takes it (0: take it at first sight)."""
        self._grace = grace
        self._seen: dict[str, _Seen] = {}

    def __len__(self) -> int:
        return len(self._seen)

    def scanned(self, shards: Iterable[str], found: Iterable[str], now: float) -> list[str]:
        """Record one scan of ``shards`` at ``now`` (seconds, monotonic) that found the
        ids ``found``; returns those of them seen free for at least the grace.

        An id of a scanned shard that the scan did not find is forgotten (taken, or
        stopped), so a connection freed again later waits a full grace again."""
        found = list(found)
        scanned = set(shards)
        present = set(found)
        for cid in [c for c in self._seen if c not in present]:
            if schema.free_shard(cid) in scanned:
                del self._seen[cid]
        ready: list[str] = []
        for cid in found:
            seen = self._seen.get(cid)
            if seen is None:
                seen = self._seen[cid] = _Seen(now, now)
            seen.last = now
            if now - seen.first >= self._grace:
                ready.append(cid)
        return ready
