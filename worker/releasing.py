"""Giving a lease back: one conditional write, retried on errors for the release
budget (docs/DESIGN.md §3.3). Every retry is still conditional on owner and epoch, so
a retry can never free a newer hold."""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable

from wsfleet.backoff import backoff_delays
from wsfleet.lease_store import Released
from wsfleet.timing import LeaseTiming

log = logging.getLogger(__name__)


async def release_within_budget(
    write: Callable[[], Released], connection_id: str, timing: LeaseTiming, rng: random.Random
) -> Released | None:
    """Run ``write`` (a release or a park) on the loop's executor until it answers,
    retrying errors (throttling, timeouts) with backoff for up to the release budget;
    None when it never got an answer."""
    loop = asyncio.get_running_loop()
    give_up_at = loop.time() + timing.release_budget
    delays = backoff_delays(initial=0.05, maximum=max(0.05, timing.heartbeat / 2), rng=rng.random)
    while True:
        try:
            # Shielded: a cancelled caller stops waiting, but a write still queued in
            # the executor is not dropped with it.
            return await asyncio.shield(loop.run_in_executor(None, write))
        except Exception as error:
            delay = next(delays)
            if loop.time() + delay >= give_up_at:
                log.error(
                    "release failed; giving up",
                    extra={"connection_id": connection_id, "error": repr(error)},
                )
                return None
            log.warning(
                "release failed, retrying",
                extra={"connection_id": connection_id, "error": repr(error)},
            )
            await asyncio.sleep(delay)
