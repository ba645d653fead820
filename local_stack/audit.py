"""Checks over recorded deliveries: the promises of the fleet, stated as code.

A record is one handler entry: ``worker, connection_id, epoch, seq, t`` (epoch
seconds) and ``failed`` (the handler raised). The recording handler of the tests
and the chaos run write them as JSON lines.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True, slots=True)
class Record:
    worker: str
    connection_id: str
    epoch: int
    seq: int
    t: float
    failed: bool = False
    feed: str | None = None
    """The upstream stream the message came from, when the payload names it."""


def record_from_json(raw: dict[str, Any]) -> Record:
    """One record from its JSON line's object."""
    return Record(
        worker=raw["worker"],
        connection_id=raw["connection_id"],
        epoch=int(raw["epoch"]),
        seq=int(raw["seq"]),
        t=float(raw["t"]),
        failed=bool(raw.get("failed", False)),
        feed=raw.get("feed"),
    )


def load_records(directory: Path) -> list[Record]:
    """Every record under ``directory`` (``*.jsonl``); a torn last line of a killed
    process is ignored."""
    records: list[Record] = []
    for path in sorted(directory.glob("*.jsonl")):
        for line in path.read_text().splitlines():
            try:
                raw = json.loads(line)
            except ValueError:
                continue
            records.append(record_from_json(raw))
    return records


def by_connection(records: Iterable[Record]) -> dict[str, list[Record]]:
    grouped: dict[str, list[Record]] = defaultdict(list)
    for record in records:
        grouped[record.connection_id].append(record)
    for group in grouped.values():
        group.sort(key=lambda r: r.t)
    return dict(grouped)


def epoch_starts(records: Iterable[Record]) -> dict[tuple[str, int], float]:
    """(connection, epoch) -> time of the first delivery under that epoch."""
    starts: dict[tuple[str, int], float] = {}
    for r in records:
        key = (r.connection_id, r.epoch)
        starts[key] = min(r.t, starts.get(key, r.t))
    return starts


def stale_deliveries(records: Iterable[Record]) -> list[Record]:
    """Deliveries under an epoch made after a newer epoch of the same connection
    had begun (its first delivery). Must be empty."""
    records = list(records)
    starts = epoch_starts(records)
    newest_start: dict[str, list[tuple[int, float]]] = defaultdict(list)
    for (cid, epoch), t in starts.items():
        newest_start[cid].append((epoch, t))
    stale = []
    for r in records:
        if any(e > r.epoch and t < r.t for e, t in newest_start[r.connection_id]):
            stale.append(r)
    return stale


def handled_seqs(records: Iterable[Record]) -> dict[str, set[int]]:
    handled: dict[str, set[int]] = defaultdict(set)
    for r in records:
        if not r.failed:
            handled[r.connection_id].add(r.seq)
    return dict(handled)


def lost_seqs(records: Iterable[Record]) -> dict[str, list[int]]:
    """Per connection, the seqs missing from ``1..highest handled``. Must be empty."""
    lost = {}
    for cid, seqs in handled_seqs(records).items():
        missing = sorted(set(range(1, max(seqs) + 1)) - seqs)
        if missing:
            lost[cid] = missing
    return lost


def duplicate_count(records: Iterable[Record]) -> dict[str, int]:
    """Per connection, successful deliveries beyond the first of each seq (allowed
    after a crash: messages handled after the last checkpoint are delivered again)."""
    counts = Counter((r.connection_id, r.seq) for r in records if not r.failed)
    duplicates: Counter[str] = Counter()
    for (cid, _), n in counts.items():
        if n > 1:
            duplicates[cid] += n - 1
    return dict(duplicates)
