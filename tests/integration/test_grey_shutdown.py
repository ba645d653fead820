"""Shutdown under grey failure, with a real worker in this process against DynamoDB
Local and moto's SQS, its calls held at chosen moments (tests.support.in_process)."""

from __future__ import annotations

import pytest

from tests.support.in_process import Gated, in_process_worker, until
from tests.support.timing import scaled
from wsfleet import schema
from wsfleet.session_store import SessionStore

pytestmark = pytest.mark.timeout(scaled(90))


async def test_p1_the_session_is_retired_without_waiting_for_the_long_poll(
    ddb, table, sqs, queues, tmp_path
):
    """P1: at SIGTERM a long poll is in flight (held here, as one hung on a
    partition or waiting out SQS_WAIT_SECONDS). The session is retired at once, so
    whatever it still owns goes to the others within the own-check bound, instead of
    after the poll (up to SQS_WAIT_SECONDS + 5 s); and no further poll leaves."""
    gated = Gated(sqs)
    poll = gated.hold("receive_message")
    try:
        async with in_process_worker(
            ddb, table, gated, queues.queue_url, tmp_path, sqs_wait_seconds=20
        ) as running:
            await poll.entered_async()
            worker = running.worker
            gen = await until(lambda: worker.session_gen, what="a session")
            sessions = SessionStore(ddb, table, worker.config.timing)
            running.stop.set()

            def retired() -> bool:
                session = sessions.get_session(worker.worker_id, gen)
                return session is not None and session.state == schema.DEAD

            # The poll is still held: the retire did not wait for it.
            await until(retired, within=10.0, what="the session retired")
            assert gated.calls["receive_message"] == 1
            gated.fail("receive_message")  # the poll ends as one cut by a partition
            poll.release()
    finally:
        poll.release()
    assert gated.calls["receive_message"] == 1  # none left after the shutdown began


async def test_an_open_whose_answer_was_lost_leaves_no_phantom_session(
    ddb, table, sqs, queues, tmp_path
):
    """The first open of a session lands but its answer is lost (a slow DynamoDB). The
    worker must not leave that session ALIVE beside the one it runs: the others would
    count it as a live worker with room and plan takeovers onto it, and the connections
    so planned would wait until it lapsed (found by the simulator: seed 269 on the
    draws of `3d7b00b`, 7.4 s dark against a 5.9 s bound)."""
    async with in_process_worker(
        ddb, table, sqs, queues.queue_url, tmp_path, renewals_lose={"open": 1}
    ) as running:
        worker = running.worker
        await until(lambda: worker.standing.live, what="a session")
        sessions = SessionStore(ddb, table, worker.config.timing)
        mine = [s for s in sessions.list_sessions() if s.worker_id == worker.worker_id]
        assert [(s.session_gen, s.alive) for s in mine] == [(worker.session_gen, True)]
        assert worker.session_gen == 1  # the open that landed, adopted
