"""A release is bounded by its budget as a deadline, whatever its write does."""

from __future__ import annotations

import asyncio
import gc
import random
import threading
from typing import Any

import pytest

from worker.releasing import release_within_budget
from wsfleet.lease_store import Released
from wsfleet.timing import LeaseTiming

TIMING = LeaseTiming(lease=1.0, heartbeat=0.1, reconcile=0.1, margin=0.1)
"""A release budget of one second."""


def test_an_attempt_still_waiting_at_the_budget_is_given_up(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A write that hangs past the budget (a slow DynamoDB, a queue of releases in the
    executor) ends the release at the budget, unanswered: a cancelled runner then ends
    within the shutdown's last wait (found by the simulator: a worker exited with a
    runner still releasing, its slot not given back)."""
    unblock = threading.Event()

    def write() -> Released:
        unblock.wait(10.0)
        raise AssertionError("never answers in time")

    async def main() -> tuple[Released | None, float]:
        loop = asyncio.get_running_loop()
        started = loop.time()
        try:
            released = await asyncio.wait_for(
                release_within_budget(write, "c1", TIMING, random.Random(1)),
                TIMING.release_budget + 2.0,
            )
        finally:
            unblock.set()
        return released, loop.time() - started

    released, took = asyncio.run(main())
    assert released is None
    assert TIMING.release_budget <= took < TIMING.release_budget + 1.0
    assert "release not answered within its budget; giving up" in caplog.text


def test_an_error_after_the_caller_gave_up_is_not_reported_as_never_retrieved() -> None:
    """The attempt goes on in the executor after the release gave up on it (it may
    still land); its error is nobody's to raise, and asyncio must not report it."""
    unblock = threading.Event()
    reported: list[dict[str, Any]] = []

    def write() -> Released:
        unblock.wait(10.0)
        raise RuntimeError("throttled")

    async def main() -> Released | None:
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(lambda _loop, context: reported.append(context))
        released = await release_within_budget(write, "c1", TIMING, random.Random(1))
        unblock.set()
        # Joined threads: the attempt's outcome was handed to the loop before.
        await loop.shutdown_default_executor()
        gc.collect()
        return released

    assert asyncio.run(main()) is None
    assert [c.get("message") for c in reported] == []


def test_errors_are_retried_and_an_answer_within_the_budget_is_returned() -> None:
    answers: list[Released | Exception] = [
        RuntimeError("throttled"),
        RuntimeError("throttled"),
        Released(released=True, restarted=False, checkpointed=True),
    ]

    def write() -> Released:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    released = asyncio.run(release_within_budget(write, "c1", TIMING, random.Random(1)))
    assert released == Released(released=True, restarted=False, checkpointed=True)
    assert answers == []
