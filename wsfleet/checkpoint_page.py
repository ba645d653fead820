"""A session's checkpoint page: the checkpoint of every connection it runs, in one
item written every ``CHECKPOINT_SECONDS`` (docs/DESIGN.md §3.5).

The entries are packed (JSON, then zlib) into one binary attribute: a write costs one
unit per started KB of item, and 500 entries packed this way fit in about 15 KB,
where a map of the same entries would take twice that.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from wsfleet import schema
from wsfleet.item import to_attribute


@dataclass(frozen=True, slots=True)
class PageEntry:
    """One connection's checkpoint as its owner last wrote it."""

    epoch: int
    seq_gen: int
    seq: int
    advanced_at_ms: int | None
    """Wall-clock ms of the last time ``seq`` moved (None before the first message)."""


@dataclass(frozen=True, slots=True)
class CheckpointPage:
    written_at_ms: int
    entries: Mapping[str, PageEntry]


def encode_entries(entries: Mapping[str, PageEntry], written_at_ms: int) -> bytes:
    """``[id, epoch, seq_gen, seq, ms before the write when seq last moved or -1]``."""
    rows = [
        [
            cid,
            e.epoch,
            e.seq_gen,
            e.seq,
            -1 if e.advanced_at_ms is None else max(0, written_at_ms - e.advanced_at_ms),
        ]
        for cid, e in entries.items()
    ]
    return zlib.compress(json.dumps(rows, separators=(",", ":")).encode(), 6)


def decode_entries(blob: bytes, written_at_ms: int) -> dict[str, PageEntry]:
    rows = json.loads(zlib.decompress(blob))
    return {
        str(cid): PageEntry(
            epoch=int(epoch),
            seq_gen=int(seq_gen),
            seq=int(seq),
            advanced_at_ms=None if ago < 0 else written_at_ms - int(ago),
        )
        for cid, epoch, seq_gen, seq, ago in rows
    }


def page_item(
    worker_id: str, session_gen: int, entries: Mapping[str, PageEntry], written_at_ms: int
) -> dict[str, Any]:
    """The page as a DynamoDB item (typed attributes)."""
    return {
        **{k: to_attribute(v) for k, v in schema.page_key(worker_id, session_gen).items()},
        schema.PAGE_WRITTEN_AT_MS: to_attribute(written_at_ms),
        schema.PAGE_ENTRIES: {"B": encode_entries(entries, written_at_ms)},
    }


def page_put_condition(written_at_ms: int) -> dict[str, Any]:
    """A page never replaces a newer one (a late write of an older page would move
    resume points back: more duplicates, never a loss, but for nothing)."""
    return {
        "ConditionExpression": "attribute_not_exists(#written) OR #written < :written",
        "ExpressionAttributeNames": {"#written": schema.PAGE_WRITTEN_AT_MS},
        "ExpressionAttributeValues": {":written": to_attribute(written_at_ms)},
    }


def page_from_dynamodb(raw: Mapping[str, Any]) -> CheckpointPage:
    written = int(raw[schema.PAGE_WRITTEN_AT_MS]["N"])
    blob = raw[schema.PAGE_ENTRIES]["B"]
    return CheckpointPage(written, decode_entries(bytes(blob), written))


def resume_seq(
    item_epoch: int, item_seq_gen: int, item_last_seq: int, entry: PageEntry | None
) -> int:
    """Where a takeover resumes: the page entry's seq when it belongs to the item's
    current hold (same epoch) and stream (same ``seq_gen``) and is ahead of the
    item's own checkpoint; otherwise the item's ``last_seq``."""
    if entry is None or entry.epoch != item_epoch or entry.seq_gen != item_seq_gen:
        return item_last_seq
    return max(item_last_seq, entry.seq)
