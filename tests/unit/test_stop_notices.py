"""P3: a stop the router answered ends delivery within the stop bound whenever the
owner's renews land, however slow the owner's other reads are: the runner is ended on
the notice alone, once per notice, and a start written since leaves it to the read."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any, cast

import pytest

from worker import connection
from worker.acquire_result import AcquireResult
from worker.connection_state import Ending
from worker.holdings import Holdings
from worker.notices import Notices
from wsfleet import session_rules
from wsfleet.item import ConnectionItem
from wsfleet.lease_store import Released

pytestmark = pytest.mark.timeout(10)


class Runner:
    def __init__(self) -> None:
        self.endings: list[Ending] = []
        self.lease = None

    def stop(self, ending: Ending) -> None:
        self.endings.append(ending)


class Reads:
    """A store whose strong reads are recorded and never answer in time."""

    def __init__(self) -> None:
        self.read: list[list[str]] = []

    def get_many(self, connection_ids: Sequence[str]) -> dict[str, ConnectionItem]:
        self.read.append(sorted(connection_ids))
        raise TimeoutError("slow")


def _notices(reads: Reads, holdings: Holdings) -> Notices:
    async def acquire(connection_id: str) -> AcquireResult:
        raise AssertionError("no offer here")

    async def send_reassign(connection_id: str) -> None:
        raise AssertionError("no offer here")

    return Notices(
        store=cast(Any, reads),
        holdings=holdings,
        balancer=cast(Any, None),
        acquire=acquire,
        send_reassign=send_reassign,
    )


async def test_a_stop_notice_ends_its_runner_without_a_read() -> None:
    reads, holdings = Reads(), Holdings()
    runner = Runner()
    holdings.runners["c1"] = cast(Any, runner)
    stop = session_rules.notice_token("c1", "stop", 1_000, "n1")
    acted: set[str] = set()
    await _notices(reads, holdings).act_on({stop}, acted)
    assert runner.endings == [Ending.STOPPED]
    assert acted == {stop}
    assert reads.read == []


async def test_a_stop_notice_returned_again_never_ends_a_later_hold() -> None:
    """A renew sent before the notice was removed answers with it again, after the
    connection may have been started again and taken by this worker once more."""
    reads, holdings = Reads(), Holdings()
    first, later = Runner(), Runner()
    notices = _notices(reads, holdings)
    stop = session_rules.notice_token("c1", "stop", 1_000, "n1")
    holdings.runners["c1"] = cast(Any, first)
    await notices.act_on({stop}, set())
    holdings.runners["c1"] = cast(Any, later)
    acted: set[str] = set()
    await notices.act_on({stop}, acted)
    assert (first.endings, later.endings) == ([Ending.STOPPED], [])
    assert acted == {stop}


async def test_a_start_written_after_the_stop_is_left_to_the_read() -> None:
    reads, holdings = Reads(), Holdings()
    runner = Runner()
    holdings.runners["c1"] = cast(Any, runner)
    tokens = {
        session_rules.notice_token("c1", "stop", 1_000, "n1"),
        session_rules.notice_token("c1", "start", 1_001, "n2"),
    }
    acted: set[str] = set()
    await _notices(reads, holdings).act_on(tokens, acted)
    assert runner.endings == []
    assert reads.read == [["c1"]]
    assert acted == set()  # the read failed: looked at again with the next renew


async def test_a_stop_of_a_connection_being_acquired_waits_for_the_acquire() -> None:
    reads, holdings = Reads(), Holdings()
    holdings.acquiring["c1"] = cast(Any, asyncio.get_running_loop().create_future())
    stop = session_rules.notice_token("c1", "stop", 1_000, "n1")
    acted: set[str] = set()
    await _notices(reads, holdings).act_on({stop}, acted)
    assert acted == set()


@pytest.mark.parametrize(
    ("ending", "released", "again"),
    [
        # Stopped on the notice alone, and the release found it STARTED: a start came
        # since whose notice the renew has not returned yet. Taken again at once.
        (Ending.STOPPED, Released(True, restarted=False, checkpointed=True, started=True), True),
        (Ending.STOPPED, Released(True, restarted=False, checkpointed=True), False),
        (Ending.STOPPED, Released(True, restarted=True, checkpointed=False, started=True), True),
        (Ending.STOPPED, None, False),  # no answer: the own-check's
        # Other endings that found it STARTED are not restarts: a handoff, a loss.
        (Ending.HANDED_OFF, Released(True, False, True, started=True), False),
        (Ending.SHUTDOWN, Released(True, False, True, started=True), False),
        (Ending.SHUTDOWN, Released(True, restarted=True, checkpointed=False), True),
    ],
)
def test_a_runner_stopped_by_notice_whose_connection_is_started_is_taken_again(
    ending: Ending, released: Released | None, again: bool
) -> None:
    assert connection.started_since(ending, released) is again
