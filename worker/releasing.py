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
    retrying errors (throttling, timeouts) with backoff; None when no answer came
    within the release budget. The budget is a deadline, not a count of tries: an
    attempt still waiting at it is given up too, so a cancelled runner ends within it
    and a shutdown's last wait (``release_budget + 1 s``) covers it."""
    loop = asyncio.get_running_loop()
    give_up_at = loop.time() + timing.release_budget
    delays = backoff_delays(initial=0.05, maximum=max(0.05, timing.heartbeat / 2), rng=rng.random)
    while True:
        try:
            # Shielded: a caller that stops waiting (cancelled, or at the deadline)
            # does not drop a write still queued in the executor; it may land later,
            # as any unanswered write may (the own-check settles it).
            attempt = loop.run_in_executor(None, write)
            attempt.add_done_callback(_seen)
            return await asyncio.wait_for(asyncio.shield(attempt), give_up_at - loop.time())
        except TimeoutError:
            log.error(
                "release not answered within its budget; giving up",
                extra={"connection_id": connection_id, "budget_seconds": timing.release_budget},
            )
            return None
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


def _seen(attempt: asyncio.Future[Released]) -> None:
    """Marks the outcome of an attempt nobody awaits any more as seen: asyncio's shield
    stops watching its inner future once the outer one is cancelled, and an error it
    ends with would otherwise be reported as never retrieved."""
    if not attempt.cancelled():
        attempt.exception()
