"""A receiver whose acquire of an offered connection raises (throttled, timed out):
the offer stays for the next renew to return, the other offers are acted on, and
nothing escapes the notices task (found by the simulator, seed 127: the error went
unretrieved and unlogged)."""

from __future__ import annotations

from typing import Any, cast

import pytest
from botocore.exceptions import ClientError

from worker.acquire_result import AcquireResult
from worker.holdings import Holdings
from worker.notices import Notices
from wsfleet import session_rules

pytestmark = pytest.mark.timeout(10)


async def test_an_offer_whose_acquire_raises_stays_and_the_others_are_acted_on() -> None:
    throttled = ClientError(
        {"Error": {"Code": "ProvisionedThroughputExceededException", "Message": "slow down"}},
        "UpdateItem",
    )

    async def acquire(connection_id: str) -> AcquireResult:
        if connection_id == "c2":
            raise throttled
        return AcquireResult.WON

    async def send_reassign(connection_id: str) -> None:
        raise AssertionError("a drain is never declined")

    notices = Notices(
        store=cast(Any, None),
        holdings=Holdings(),
        balancer=cast(Any, None),
        acquire=acquire,
        send_reassign=send_reassign,
    )
    tokens = {
        session_rules.notice_token(cid, session_rules.DRAIN, 1_000, "ab12")
        for cid in ("c1", "c2", "c3")
    }
    acted: set[str] = set()
    await notices.act_on(tokens, acted)
    assert {session_rules.notice_connection_id(t) for t in acted} == {"c1", "c3"}
