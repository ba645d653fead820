"""Recording that an upstream started its sequence over (docs/DESIGN.md §4.6,
"Sequence restarts").

When a connection's :class:`~worker.connection_state.ConnectionState` classifies a
message as :attr:`~worker.connection_state.Frame.RESET`, the stream goes on as a new
generation: ``(seq_gen + 1, seq)`` names its messages downstream, so none of them is
taken for a copy of the old numbering. The generation is written to the item, fenced
by the lease and the start (:meth:`~wsfleet.lease_store.LeaseStore.begin_generation`),
before the message is handed on: a successor then resumes in the new generation, and
a message handed on is never named twice. This part makes that write (off the event
loop, bounded by a heartbeat); the pump decides what to do with its answer.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable

from wsfleet import schema
from wsfleet.lease_rules import Lease
from wsfleet.lease_store import LeaseStore
from wsfleet.timing import LeaseTiming

log = logging.getLogger(__name__)


def lease_in_generation(lease: Lease, seq_gen: int) -> Lease:
    """``lease`` as its holder counts now: in generation ``seq_gen``. A release or a
    park conditions on the generation the item holds, which is no longer the one won
    once the holder began another (and is then present on the item)."""
    if seq_gen == lease.seq_gen:
        return lease
    return dataclasses.replace(lease, seq_gen=seq_gen, absent=lease.absent - {schema.SEQ_GEN})


class SequenceRestarts:
    def __init__(
        self,
        store: LeaseStore,
        lease: Lease,
        timing: LeaseTiming,
        wall_ms: Callable[[], int],
    ) -> None:
        self._store = store
        self._lease = lease
        self._timing = timing
        self._wall_ms = wall_ms

    async def begin(self, seq_gen: int, first_seq: int, previous_last: int) -> int | None:
        """Write that the stream, counted in ``seq_gen`` up to ``previous_last``, goes on
        as generation ``seq_gen + 1`` from ``first_seq``; that generation once written,
        None when the write was refused (the lease or the start is no longer ours) or
        its outcome is unknown."""
        lease = lease_in_generation(self._lease, seq_gen)
        new_gen = seq_gen + 1
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self._timing.heartbeat):
                landed = await loop.run_in_executor(
                    None,
                    self._store.begin_generation,
                    lease,
                    new_gen,
                    first_seq,
                    previous_last,
                    self._wall_ms(),
                )
        except Exception as error:
            log.warning(
                "could not record the upstream's sequence restart",
                extra={"connection_id": lease.connection_id, "error": repr(error)},
            )
            return None
        return new_gen if landed else None
