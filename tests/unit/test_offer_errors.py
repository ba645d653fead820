"""A receiver whose acquire of an offered connection raises (throttled, timed out):
the offer stays for the next renew to return, the other offers are acted on, and
nothing escapes the notices task (found by the simulator, seed 127: the error went
unretrieved and unlogged)."""

from __future__ import annotations

import pytest
from botocore.exceptions import ClientError

from tests.support.bare_worker import bare_worker
from worker.acquire_result import AcquireResult
from wsfleet import session_rules
from wsfleet.timing import LeaseTiming

pytestmark = pytest.mark.timeout(10)

TIMING = LeaseTiming.from_lease(2.5)


async def test_an_offer_whose_acquire_raises_stays_and_the_others_are_acted_on() -> None:
    w = bare_worker(TIMING)
    throttled = ClientError(
        {"Error": {"Code": "ProvisionedThroughputExceededException", "Message": "slow down"}},
        "UpdateItem",
    )

    async def acquire(connection_id: str) -> AcquireResult:
        if connection_id == "c2":
            raise throttled
        return AcquireResult.WON

    w.acquire = acquire  # type: ignore[method-assign]
    tokens = {
        session_rules.notice_token(cid, session_rules.DRAIN, 1_000, "ab12")
        for cid in ("c1", "c2", "c3")
    }
    acted = await w._take_offers(tokens)
    assert {session_rules.notice_connection_id(t) for t in acted} == {"c1", "c3"}
