"""A batch handler slower than its feeds, for :mod:`benchmarks.slow_sink`
(``HANDLER=benchmarks.throttled_sink:factory``).

It takes at most ``THROTTLE_MESSAGES_PER_SECOND`` messages per second over all the
connections of its worker: a token bucket with no burst, in which each call waits
until the tokens of its whole batch are earned, calls being served in the order they
came. Each batch it handled is then written as one line of
``<THROTTLE_RECORD_DIR>/handled-<pid>.txt``: ``<connection_id> <epoch> <first>-<last>``,
or the seqs one by one when they are not contiguous. A call cut at the fence deadline
writes nothing (it comes again, whole), so a line means the call returned.

With tracemalloc on in the worker (``PYTHONTRACEMALLOC``), it also answers requests
for a heap snapshot: a file ``<name>.request`` in the record directory is answered,
within a second, with ``<name>.snapshot`` (:func:`request_snapshot`).
"""

from __future__ import annotations

import asyncio
import gc
import os
import time
import tracemalloc
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final, TextIO

from worker.delivery import Delivery

THROTTLE_MESSAGES_PER_SECOND: Final = "THROTTLE_MESSAGES_PER_SECOND"
THROTTLE_RECORD_DIR: Final = "THROTTLE_RECORD_DIR"


@dataclass(frozen=True, slots=True)
class HandledBatch:
    """One line of a record file."""

    connection_id: str
    epoch: int
    seqs: range | list[int]


class TokenBucket:
    """``rate`` tokens a second, no burst: :meth:`take` returns once its tokens are
    earned, after those of every earlier call."""

    def __init__(self, rate: float) -> None:
        if not rate > 0:
            raise ValueError(f"rate must be > 0, got {rate}")
        self._rate = rate
        self._earned_at = 0.0
        """Loop time at which every token taken so far is earned."""

    async def take(self, tokens: int) -> None:
        loop = asyncio.get_running_loop()
        now = loop.time()
        # Reserved before the wait, so calls that wait together queue in order.
        self._earned_at = max(now, self._earned_at) + tokens / self._rate
        await asyncio.sleep(self._earned_at - now)


class ThrottledSink:
    def __init__(self, rate: float, record_dir: Path) -> None:
        self._bucket = TokenBucket(rate)
        self._dir = record_dir
        record_dir.mkdir(parents=True, exist_ok=True)
        # Line-buffered: one write(2) per batch, readable while the worker runs.
        self._out: TextIO = (record_dir / f"handled-{os.getpid()}.txt").open("a", buffering=1)
        self._snapshots: asyncio.Task[None] | None = None

    async def handle_batch(self, deliveries: Sequence[Delivery]) -> None:
        if self._snapshots is None and tracemalloc.is_tracing():
            self._snapshots = asyncio.create_task(self._answer_snapshot_requests())
        await self._bucket.take(len(deliveries))
        first, last = deliveries[0], deliveries[-1]
        if last.seq - first.seq + 1 == len(deliveries):
            seqs = f"{first.seq}-{last.seq}"
        else:
            seqs = " ".join(str(d.seq) for d in deliveries)
        self._out.write(f"{first.connection_id} {first.epoch} {seqs}\n")

    def close(self) -> None:
        self._out.close()

    async def _answer_snapshot_requests(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            # Off the event loop: the file system, and a snapshot of a large heap.
            await asyncio.to_thread(answer_snapshot_requests, self._dir)


def answer_snapshot_requests(directory: Path) -> None:
    for request in directory.glob("*.request"):
        gc.collect()  # only what is still referenced counts
        partial = request.with_suffix(".partial")
        tracemalloc.take_snapshot().dump(str(partial))
        partial.rename(request.with_suffix(".snapshot"))
        request.unlink()


def request_snapshot(directory: Path, name: str, timeout: float = 120.0) -> tracemalloc.Snapshot:
    """Ask the worker's handler for a heap snapshot and wait for it."""
    answer = directory / f"{name}.snapshot"
    (directory / f"{name}.request").touch()
    deadline = time.monotonic() + timeout
    while not answer.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"no heap snapshot {name!r} within {timeout:g} s")
        time.sleep(0.5)
    return tracemalloc.Snapshot.load(str(answer))


def factory() -> ThrottledSink:
    """``HANDLER=benchmarks.throttled_sink:factory``; needs both variables."""
    return sink_from_env(os.environ)


def sink_from_env(env: Mapping[str, str]) -> ThrottledSink:
    raw_rate = env.get(THROTTLE_MESSAGES_PER_SECOND, "").strip()
    directory = env.get(THROTTLE_RECORD_DIR, "").strip()
    if not raw_rate or not directory:
        raise RuntimeError(f"{THROTTLE_MESSAGES_PER_SECOND} and {THROTTLE_RECORD_DIR} must be set")
    return ThrottledSink(float(raw_rate), Path(directory))


def read_records(record_dir: Path) -> Iterator[HandledBatch]:
    """Every batch recorded under ``record_dir`` so far, file by file, in order."""
    for path in sorted(record_dir.glob("handled-*.txt")):
        # The last piece is empty, or a line being written as this reads: left out.
        for line in path.read_text().split("\n")[:-1]:
            connection_id, epoch, *rest = line.split()
            if len(rest) == 1 and "-" in rest[0]:
                first, _, last = rest[0].partition("-")
                yield HandledBatch(connection_id, int(epoch), range(int(first), int(last) + 1))
            else:
                yield HandledBatch(connection_id, int(epoch), [int(seq) for seq in rest])
