"""Only the long poll may wait as long as the long poll. A hint sent on the long poll's
client waited out its read timeout (the poll's 20 s plus 5, three attempts) when its
answer was lost, and held whoever sent it: a reconcile pass releasing strays left the
next one dark 10.7 s after the fault healed (found by the simulator, seed 200037 on the
draws of `116d324`)."""

from __future__ import annotations

from typing import Any, cast

import pytest

from worker.aws_clients import SQS_CALL_TIMEOUT, make_clients
from worker.start_queue import StartQueue
from wsfleet.start_messages import START, StartMessage
from wsfleet.timing import LeaseTiming

pytestmark = pytest.mark.timeout(10)


def test_every_sqs_call_but_the_long_poll_gives_up_within_seconds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("AWS_DEFAULT_REGION", "eu-west-1")
    clients = make_clients(LeaseTiming.from_lease(2.5), sqs_wait_seconds=20, pool_size=4)
    calls: Any = clients.sqs.meta.config
    poll: Any = clients.sqs_poll.meta.config
    assert calls.read_timeout == SQS_CALL_TIMEOUT < 20
    assert poll.read_timeout > 20


class Client:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def receive_message(self, **_: Any) -> dict[str, Any]:
        self.calls.append("receive")
        return {}

    def send_message(self, **_: Any) -> dict[str, Any]:
        self.calls.append("send")
        return {}

    def delete_message(self, **_: Any) -> dict[str, Any]:
        self.calls.append("delete")
        return {}

    def change_message_visibility(self, **_: Any) -> dict[str, Any]:
        self.calls.append("visibility")
        return {}


async def test_the_start_queue_polls_on_its_poll_client_only() -> None:
    calls, poll = Client(), Client()
    queue = StartQueue(cast(Any, calls), "url", wait_seconds=20, poll=cast(Any, poll))
    await queue.receive(10)
    await queue.send(StartMessage(START, "c1"))
    await queue.hint_reassign("c1")
    await queue.delete("r1")
    await queue.retry_later("r1", 0)
    assert poll.calls == ["receive"]
    assert calls.calls == ["send", "send", "delete", "visibility"]
