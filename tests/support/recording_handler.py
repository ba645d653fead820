"""A handler for fleet tests: records every delivery at the moment ``handle`` is
entered (worker, connection, epoch, seq, time) as one JSON line per delivery.

Environment: ``RECORD_DIR`` (required): one file per process is written there.
``RECORD_FAIL_SEQ`` + ``RECORD_FAIL_TIMES``: raise on the first N deliveries of that
seq (per connection), to test retries and skips.
"""

from __future__ import annotations

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
        self._fail_seq = int(os.environ.get("RECORD_FAIL_SEQ", "0"))
        self._fail_times = int(os.environ.get("RECORD_FAIL_TIMES", "0"))
        self._failures: Counter[str] = Counter()

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
            raise HandlerFailureError(f"injected failure at seq {delivery.seq}")


def factory() -> RecordingHandler:
    return RecordingHandler()
