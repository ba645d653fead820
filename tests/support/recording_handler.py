"""A handler for fleet tests: records every delivery at the moment ``handle`` is
entered (worker, connection, epoch, seq, time) as one JSON line per delivery.

Environment: ``RECORD_DIR`` (required): one file per process is written there.
``RECORD_FAIL_SEQ`` + ``RECORD_FAIL_TIMES``: raise on the first N deliveries of that
seq (per connection), to test retries and skips; ``RECORD_FAIL_WITH=cancel`` raises
``asyncio.CancelledError`` instead of an ordinary exception.
``RECORD_DELAY_SECONDS``: every call takes this long after it is recorded.
``RECORD_GATE_SEQ`` + ``RECORD_GATE_FILE``: the call of that seq waits until the file
exists. Calls that return are also listed in ``handled-<pid>.txt`` (``id seq`` lines).
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections import Counter
from pathlib import Path

from worker.delivery import Delivery


class HandlerFailureError(RuntimeError):
    pass


class RecordingHandler:
    def __init__(self) -> None:
        directory = Path(os.environ["RECORD_DIR"])
        directory.mkdir(parents=True, exist_ok=True)
        self._file = (directory / f"deliveries-{os.getpid()}.jsonl").open("a", buffering=1)
        self._handled = (directory / f"handled-{os.getpid()}.txt").open("a", buffering=1)
        self._fail_seq = int(os.environ.get("RECORD_FAIL_SEQ", "0"))
        self._fail_times = int(os.environ.get("RECORD_FAIL_TIMES", "0"))
        self._fail_with_cancel = os.environ.get("RECORD_FAIL_WITH") == "cancel"
        self._failures: Counter[str] = Counter()
        self._delay = float(os.environ.get("RECORD_DELAY_SECONDS", "0"))
        self._gate_seq = int(os.environ.get("RECORD_GATE_SEQ", "0"))
        self._gate = Path(os.environ.get("RECORD_GATE_FILE", "/nonexistent"))

    async def handle(self, delivery: Delivery) -> None:
        entered = time.time()
        failing = (
            delivery.seq == self._fail_seq
            and self._failures[delivery.connection_id] < self._fail_times
        )
        record = {
            "worker": delivery.worker_id,
            "pid": os.getpid(),
            "connection_id": delivery.connection_id,
            "epoch": delivery.epoch,
            "seq": delivery.seq,
            "t": entered,
            "failed": failing,
            "feed": delivery.payload.get("feed") if isinstance(delivery.payload, dict) else None,
        }
        self._file.write(json.dumps(record) + "\n")
        if failing:
            self._failures[delivery.connection_id] += 1
            if self._fail_with_cancel:
                raise asyncio.CancelledError  # as a pool that cancels its futures would
            raise HandlerFailureError(f"injected failure at seq {delivery.seq}")
        if delivery.seq == self._gate_seq:
            while not self._gate.exists():  # noqa: ASYNC110 - a file has no event
                await asyncio.sleep(0.01)
        if self._delay:
            await asyncio.sleep(self._delay)
        self._handled.write(f"{delivery.connection_id} {delivery.seq}\n")


def factory() -> RecordingHandler:
    return RecordingHandler()
