"""Message handlers for benchmark and chaos workers (``HANDLER=benchmarks.handlers:...``).

- :func:`recording_factory`: one JSON line per delivery, written when ``handle`` is
  entered (the moment a message counts as delivered), in the record format of
  :mod:`local_stack.audit`. Environment: ``RECORD_DIR`` (required), one file per
  process. The line reaches the kernel before ``handle`` returns, so a SIGKILL right
  after loses no record.
- :func:`noop_factory`: does nothing; the worker's own ``messages_processed`` count
  (its "worker stats" log line) tells how many messages went through.
- :func:`noop_without_gc_factory`: the same, and it turns off the cyclic garbage
  collector of the worker process when the worker loads it. A diagnostic for the
  density benchmark: it shows how much of the renew lateness is collector pauses.
"""

from __future__ import annotations

import gc
import json
import os
import time
from pathlib import Path
from typing import TextIO

from worker.delivery import Delivery

RECORD_DIR = "RECORD_DIR"


class RecordingHandler:
    """Appends ``{"worker", "pid", "connection_id", "epoch", "seq", "t", "failed",
    "feed"}`` per delivery to ``<RECORD_DIR>/deliveries-<pid>.jsonl``."""

    def __init__(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        # Line-buffered: every record is one write(2) at handler entry.
        self._file: TextIO = (directory / f"deliveries-{os.getpid()}.jsonl").open("a", buffering=1)
        self._pid = os.getpid()

    async def handle(self, delivery: Delivery) -> None:
        payload = delivery.payload
        record = {
            "worker": delivery.worker_id,
            "pid": self._pid,
            "connection_id": delivery.connection_id,
            "epoch": delivery.epoch,
            "seq": delivery.seq,
            "t": time.time(),
            "failed": False,
            "feed": payload.get("feed") if isinstance(payload, dict) else None,
        }
        self._file.write(json.dumps(record, separators=(",", ":")) + "\n")


class NoopHandler:
    """Handles every message instantly."""

    async def handle(self, delivery: Delivery) -> None:
        return None


def recording_factory() -> RecordingHandler:
    """``HANDLER=benchmarks.handlers:recording_factory``; needs ``RECORD_DIR``."""
    directory = os.environ.get(RECORD_DIR, "").strip()
    if not directory:
        raise RuntimeError(f"{RECORD_DIR} must name a directory for the delivery records")
    return RecordingHandler(Path(directory))


def noop_factory() -> NoopHandler:
    """``HANDLER=benchmarks.handlers:noop_factory``."""
    return NoopHandler()


def noop_without_gc_factory() -> NoopHandler:
    """``HANDLER=benchmarks.handlers:noop_without_gc_factory`` (diagnostic only: the
    process then never frees reference cycles)."""
    gc.disable()
    return NoopHandler()
