"""A lease won under a session that is no longer live is given back unrun, and then
hinted: free in the unowned index alone it waited there, since every worker at or
above its share leaves what it finds there and the worker that gave it back does not
take it again for a while (found by the simulator, seed 125 on the draws of
`fb137e1`: a taker stopped after its takeover's transaction gave its session up, gave
back what the transaction had won, and the connection was 10 s dark)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.bare_worker import bare_worker
from wsfleet.lease_rules import Lease
from wsfleet.lease_store import Released
from wsfleet.timing import LeaseTiming

pytestmark = pytest.mark.timeout(10)

TIMING = LeaseTiming.from_lease(2.5)


def lease(connection_id: str) -> Lease:
    return Lease(connection_id, "w", 3, 1, "wss://feed", 0, session_gen=1)


@pytest.mark.parametrize(
    ("answer", "hinted"),
    [
        (Released(released=True, restarted=False, checkpointed=False), ["c1"]),
        (Released(released=False, restarted=False, checkpointed=False), []),  # not ours
    ],
)
async def test_a_lease_given_back_unrun_is_hinted_once_free(
    answer: Released, hinted: list[str]
) -> None:
    w = bare_worker(TIMING)
    sent: list[str] = []

    async def send_reassign(connection_id: str) -> None:
        sent.append(connection_id)

    def release(*args: Any) -> Released:
        return answer

    w.give_back._send_reassign = send_reassign
    w.give_back._store.release = release  # type: ignore[method-assign]
    await w.give_back.unrun(lease("c1"))
    assert sent == hinted
