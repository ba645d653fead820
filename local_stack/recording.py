"""The recording handler of the tests and benchmarks, and the readers of what it writes.

``HANDLER=local_stack.recording:factory`` records each delivery when ``handle`` is
entered (the moment a message counts as delivered) as one JSON line in the record
format of :mod:`local_stack.audit` (``worker, pid, connection_id, epoch, seq, t,
failed, feed``) in ``<RECORD_DIR>/deliveries-<pid>.jsonl``. Each line is one write(2)
before anything else happens, so a SIGKILL right after loses no record. Calls that
return are listed in ``<RECORD_DIR>/handled-<pid>.txt`` (``<id> <seq>`` lines).

``HANDLER=local_stack.recording:batch_factory`` is the same as a batch handler
(``handle_batch``): every delivery of a batch is recorded, with ``batch`` (the batch's
size), in one write when the call is entered; a batch that holds the failing seq
fails whole (its records marked failed); the delay and the gate apply per batch.

Environment:

- ``RECORD_DIR`` (required): where the files go, one pair per process;
- ``RECORD_FAIL_SEQ`` + ``RECORD_FAIL_TIMES``: raise on the first N deliveries of that
  seq (per connection), to test retries and skips; ``RECORD_FAIL_WITH=cancel`` raises
  ``asyncio.CancelledError`` instead of an ordinary exception;
- ``RECORD_DELAY_SECONDS``: every call takes this long after it is recorded;
- ``RECORD_GATE_SEQ`` + ``RECORD_GATE_FILE``: the call of that seq waits until the
  file exists.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Final, TextIO

from local_stack.audit import Record, record_from_json
from local_stack.json_lines import JsonLinesTail

if TYPE_CHECKING:
    from worker.delivery import Delivery

HANDLER: Final = "local_stack.recording:factory"
RECORD_DIR: Final = "RECORD_DIR"
RECORD_FAIL_SEQ: Final = "RECORD_FAIL_SEQ"
RECORD_FAIL_TIMES: Final = "RECORD_FAIL_TIMES"
RECORD_FAIL_WITH: Final = "RECORD_FAIL_WITH"
RECORD_DELAY_SECONDS: Final = "RECORD_DELAY_SECONDS"
RECORD_GATE_SEQ: Final = "RECORD_GATE_SEQ"
RECORD_GATE_FILE: Final = "RECORD_GATE_FILE"
_GATE_POLL_S = 0.01


class HandlerFailureError(RuntimeError):
    """The failure ``RECORD_FAIL_SEQ`` asks for."""


@dataclass(frozen=True, slots=True)
class RecordingSettings:
    directory: Path
    fail_seq: int = 0
    """0: never (upstream seqs start at 1)."""
    fail_times: int = 0
    fail_with_cancel: bool = False
    delay: float = 0.0
    gate_seq: int = 0
    gate_file: Path | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> RecordingSettings:
        directory = env.get(RECORD_DIR, "").strip()
        if not directory:
            raise RuntimeError(f"{RECORD_DIR} must name a directory for the delivery records")
        gate = env.get(RECORD_GATE_FILE, "").strip()
        return cls(
            directory=Path(directory),
            fail_seq=int(env.get(RECORD_FAIL_SEQ) or 0),
            fail_times=int(env.get(RECORD_FAIL_TIMES) or 0),
            fail_with_cancel=env.get(RECORD_FAIL_WITH) == "cancel",
            delay=float(env.get(RECORD_DELAY_SECONDS) or 0),
            gate_seq=int(env.get(RECORD_GATE_SEQ) or 0),
            gate_file=Path(gate) if gate else None,
        )


def recording_settings(record_dir: Path) -> dict[str, str]:
    """The worker variables that load this handler and write to ``record_dir``."""
    return {"HANDLER": HANDLER, RECORD_DIR: str(record_dir)}


class RecordingHandler:
    def __init__(self, settings: RecordingSettings) -> None:
        self._settings = settings
        self._pid = os.getpid()
        settings.directory.mkdir(parents=True, exist_ok=True)
        # Line-buffered: every line is one write(2).
        self._records: TextIO = (settings.directory / f"deliveries-{self._pid}.jsonl").open(
            "a", buffering=1
        )
        self._handled: TextIO = (settings.directory / f"handled-{self._pid}.txt").open(
            "a", buffering=1
        )
        self._failures: Counter[str] = Counter()

    async def handle(self, delivery: Delivery) -> None:
        await self._handle([delivery], batch=False)

    def _line(self, delivery: Delivery, failing: bool, batch: int | None) -> str:
        payload = delivery.payload
        record = {
            "worker": delivery.worker_id,
            "pid": self._pid,
            "connection_id": delivery.connection_id,
            "epoch": delivery.epoch,
            "seq": delivery.seq,
            "t": time.time(),
            "failed": failing,
            "feed": payload.get("feed") if isinstance(payload, dict) else None,
        }
        if batch is not None:
            record["batch"] = batch
        return json.dumps(record, separators=(",", ":")) + "\n"

    async def _handle(self, deliveries: Sequence[Delivery], *, batch: bool) -> None:
        settings = self._settings
        connection_id = deliveries[0].connection_id
        seqs = {d.seq for d in deliveries}
        failing = settings.fail_seq in seqs and self._failures[connection_id] < settings.fail_times
        size = len(deliveries) if batch else None
        self._records.write("".join(self._line(d, failing, size) for d in deliveries))
        if failing:
            self._failures[connection_id] += 1
            if settings.fail_with_cancel:
                raise asyncio.CancelledError  # as a pool that cancels its futures would
            raise HandlerFailureError(f"injected failure at seq {settings.fail_seq}")
        if settings.gate_file is not None and settings.gate_seq in seqs:
            while not settings.gate_file.exists():  # noqa: ASYNC110 - a file has no event
                await asyncio.sleep(_GATE_POLL_S)
        if settings.delay:
            await asyncio.sleep(settings.delay)
        self._handled.write("".join(f"{d.connection_id} {d.seq}\n" for d in deliveries))


class BatchRecordingHandler(RecordingHandler):
    """The recording handler as a batch handler."""

    async def handle_batch(self, deliveries: Sequence[Delivery]) -> None:
        await self._handle(deliveries, batch=True)


def factory() -> RecordingHandler:
    """``HANDLER=local_stack.recording:factory``; needs ``RECORD_DIR``."""
    return RecordingHandler(RecordingSettings.from_env(os.environ))


def batch_factory() -> BatchRecordingHandler:
    """``HANDLER=local_stack.recording:batch_factory``; needs ``RECORD_DIR``."""
    return BatchRecordingHandler(RecordingSettings.from_env(os.environ))


# --- readers ---------------------------------------------------------------------------


def handled_seqs(record_dir: Path, connection_id: str) -> list[int]:
    """Seqs of ``connection_id`` whose handler call returned, in file order."""
    seqs: list[int] = []
    for path in sorted(record_dir.glob("handled-*.txt")):
        for line in path.read_text().splitlines():
            cid, _, seq = line.partition(" ")
            if cid == connection_id and seq.isdigit():
                seqs.append(int(seq))
    return seqs


class DeliveryTracker:
    """Follows the delivery records under one directory as they are written: who
    handled each connection last, and when."""

    def __init__(self, record_dir: Path) -> None:
        self._dir = record_dir
        self._tail = JsonLinesTail()
        self.latest: dict[str, Record] = {}
        """Connection id -> its latest delivery."""

    def poll(self) -> list[Record]:
        """Records written since the last call (oldest first); updates :attr:`latest`."""
        found: list[Record] = []
        for path in sorted(self._dir.glob("*.jsonl")):
            found.extend(record_from_json(raw) for raw in self._tail.read(path))
        found.sort(key=lambda record: record.t)
        for record in found:
            self.latest[record.connection_id] = record
        return found

    def handled_by(self, worker_id: str) -> list[str]:
        """Connections whose latest delivery came from ``worker_id``."""
        return sorted(cid for cid, r in self.latest.items() if r.worker == worker_id)

    def flowing(self, connection_ids: list[str], within: float) -> bool:
        """Whether each of ``connection_ids`` had a delivery in the last ``within`` s."""
        self.poll()
        since = time.time() - within
        return all(cid in self.latest and self.latest[cid].t >= since for cid in connection_ids)
