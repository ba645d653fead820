"""A worker refuses to share its table with sessions of another session protocol
(docs/DEPLOY.md, "Changing the session protocol"): a protocol-1 worker renews by its
wall clock and writes no beat, so a protocol-2 worker would reap it while it runs, and
it would read protocol-2 sessions by rules they no longer keep. A real worker in this
process against DynamoDB Local."""

from __future__ import annotations

import json
import logging
import time

import pytest

from tests.support.in_process import SCALED_TIMING, in_process_worker, until
from tests.support.timing import scaled
from wsfleet import metric_names as m
from wsfleet import schema
from wsfleet.item import to_attribute
from wsfleet.session_store import SessionStore

pytestmark = pytest.mark.timeout(scaled(90))


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def open_protocol_1_session(ddb, table: str, worker_id: str) -> SessionStore:
    """A live session as a protocol-1 worker leaves it: no protocol, no beat."""
    sessions = SessionStore(ddb, table, SCALED_TIMING)
    assert sessions.open(worker_id, 1, now_ms(), capacity=10)
    ddb.update_item(
        TableName=table,
        Key={k: to_attribute(v) for k, v in schema.session_key(worker_id, 1).items()},
        UpdateExpression="REMOVE #p, #b",
        ExpressionAttributeNames={"#p": schema.SESSION_PROTOCOL, "#b": schema.SESSION_BEAT},
    )
    return sessions


async def test_no_session_is_opened_beside_a_live_session_of_another_protocol(
    ddb, table, sqs, queues, tmp_path, caplog, capsys
):
    old = open_protocol_1_session(ddb, table, "old-worker")
    caplog.set_level(logging.ERROR, logger="worker.session_cycle")
    async with in_process_worker(ddb, table, sqs, queues.queue_url, tmp_path) as running:

        def refusals() -> list[logging.LogRecord]:
            return [r for r in caplog.records if "refusing to open a session" in r.message]

        await until(lambda: len(refusals()) >= 2, what="two refusals")
        assert running.worker.session_gen == 0
        assert running.renewals.calls.get("open", 0) == 0
        assert refusals()[0].foreign == ["old-worker#1 (protocol 1)"]  # type: ignore[attr-defined]
        # Counted (the figure published at the metrics interval, or still to publish).
        published = sum(
            json.loads(line).get(m.FOREIGN_SESSIONS, [0.0])[0]
            for line in capsys.readouterr().out.splitlines()
            if line.startswith("{")
        )
        assert published + running.worker.metrics.snapshot()[m.FOREIGN_SESSIONS] >= 2
        # The old worker stops (its session retired): the table is this worker's.
        assert old.retire("old-worker", 1, now_ms())
        await until(lambda: running.worker.session_gen == 1, what="a session opened")
        session = old.get_session(running.worker.worker_id, 1)
        assert session is not None
        assert (session.protocol, session.beat) == (schema.SESSION_PROTOCOL_NOW, 0)
