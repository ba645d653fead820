"""P5: a process that has exited sends nothing more. A long poll it left waiting must
not wake after the exit and take a message (a start hint) that then stays invisible
for the visibility timeout with nobody to act on it."""

from __future__ import annotations

import asyncio

import pytest

from sim.aws import Caller, Link, Retries, SimQueue, SimSQS
from sim.runtime import World


@pytest.fixture
def world():
    made = World(1)
    yield made
    made.close()


def test_a_long_poll_left_waiting_at_exit_takes_nothing_after_it(world):
    loop = world.loop("w1")
    link = Link(world, latency=lambda: 0.001)
    queue = SimQueue(world, visibility=30.0)
    lost: list[str] = []
    sqs = SimSQS(queue, Caller(loop, link, Retries(25.0, 1)), lost.append)
    answers: list[object] = []

    async def poll_then_exit() -> None:
        running = asyncio.get_running_loop()
        polling = running.run_in_executor(
            None, lambda: sqs.receive_message(MaxNumberOfMessages=10, WaitTimeSeconds=20)
        )
        polling.add_done_callback(lambda done: answers.append(done.result()))
        await asyncio.sleep(1.0)
        sqs.exited()  # the process exits with its poll still waiting

    world.run_task(loop, poll_then_exit())
    world.run_until(world.now + 2.0)
    queue.send('{"type": "reassign", "connection_id": "c1"}')  # another worker's hint
    world.run_until(world.now + 25.0)
    # The hint is still there for a live worker: nobody took it.
    assert [m["Body"] for m in queue.receive(10)] == ['{"type": "reassign", "connection_id": "c1"}']
    assert answers == [{}]
