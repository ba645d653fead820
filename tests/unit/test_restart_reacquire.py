"""A connection restarted by the router is acquired again at once after its release
(the router's start hint may have been consumed as held while this worker still ran
it). When this worker cannot take it (its acquire raised with its reply lost, or was
not even tried: no session ready, no free slot, closing), the connection is hinted on
the start queue instead; left in the unowned index, where every worker at or above its
share leaves it, it stayed dark. Found by the simulator with restarts on new streams
during a failover: seed 49 (the acquire's error escaped the runner's task, and nobody
retrieved it) and seed 59 (a worker whose DynamoDB was slow read its restart notices
late and found its session not ready: 9 s dark)."""

from __future__ import annotations

import pytest
from botocore.exceptions import ReadTimeoutError

from tests.support.bare_worker import bare_worker
from worker.acquire_result import AcquireResult
from worker.connection import Outcome
from worker.connection_state import Ending
from worker.fleet_worker import Worker
from wsfleet.timing import LeaseTiming

pytestmark = pytest.mark.timeout(10)

TIMING = LeaseTiming.from_lease(2.5)
RESTARTED = Outcome(Ending.RESTARTED, released=True, last_seq=6, restarted=True)


def worker_whose_acquire(answer: AcquireResult | Exception) -> tuple[Worker, list[str]]:
    w = bare_worker(TIMING)
    hinted: list[str] = []

    async def acquire(connection_id: str) -> AcquireResult:
        if isinstance(answer, Exception):
            raise answer
        return answer

    async def send_reassign(connection_id: str) -> None:
        hinted.append(connection_id)

    w.ownership.acquire = acquire  # type: ignore[method-assign]
    w.ownership.send_reassign = send_reassign
    return w, hinted


async def test_a_failed_acquire_after_a_restart_is_hinted_not_raised() -> None:
    w, hinted = worker_whose_acquire(ReadTimeoutError(endpoint_url="https://dynamodb"))
    await w.ownership._after_release("c153", RESTARTED)
    assert hinted == ["c153"]


@pytest.mark.parametrize(
    "untried", [AcquireResult.NO_SESSION, AcquireResult.NO_CAPACITY, AcquireResult.CLOSING]
)
async def test_an_acquire_not_tried_after_a_restart_is_hinted(untried: AcquireResult) -> None:
    w, hinted = worker_whose_acquire(untried)
    await w.ownership._after_release("c61", RESTARTED)
    assert hinted == ["c61"]


@pytest.mark.parametrize("settled", [AcquireResult.WON, AcquireResult.HELD, AcquireResult.STOPPED])
async def test_a_restart_taken_again_or_settled_elsewhere_sends_no_hint(
    settled: AcquireResult,
) -> None:
    w, hinted = worker_whose_acquire(settled)
    await w.ownership._after_release("c61", RESTARTED)
    assert hinted == []
