"""A session's checkpoint page: the checkpoint of every connection it runs, in one
item written every ``CHECKPOINT_SECONDS`` (docs/DESIGN.md §3.5).

The entries are packed (JSON, then zlib) into one binary attribute: a write costs one
unit per started KB of item, and 500 entries packed this way fit in about 15 KB,
where a map of the same entries would take twice that.

Each entry also says how its connection is doing (docs/DESIGN.md §3.5, "Health"):
its messages per second over the interval before the write, and, only for a
connection that is not streaming or has reconnected during the hold, its status, its
reconnects and its last upstream error, and, for a connection with an
application-level keepalive, when its last keepalive went out and when the upstream
last answered one. These live in a second packed attribute (``health``): the rates as
one list in the entries' order, the rest by connection id for the few that have any,
so a healthy fleet pays a few bytes per connection and nothing more, and a reader that
knows only ``entries`` still reads the page.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from wsfleet import schema
from wsfleet.item import MalformedItemError, key_text, to_attribute

STREAMING: Final = "streaming"
"""Connected upstream (a quiet stream is streaming too)."""
CONNECTING: Final = "connecting"
"""Opening the upstream connection, or waiting for the host's connect pacing."""
BACKING_OFF: Final = "backing_off"
"""Waiting after a failed or lost upstream connection before the next attempt."""
WORKER_STATUSES: Final = (STREAMING, CONNECTING, BACKING_OFF)


@dataclass(frozen=True, slots=True)
class PageEntry:
    """One connection's checkpoint as its owner last wrote it."""

    epoch: int
    seq_gen: int
    seq: int
    advanced_at_ms: int | None
    """Wall-clock ms of the last time ``seq`` moved (None before the first message)."""
    rate: float | None = None
    """Messages handled per second over the interval before the write (None: unknown)."""
    status: str = STREAMING
    reconnects: int = 0
    """Upstream connections lost or refused since this hold began."""
    last_error: str | None = None
    """What ended the last upstream connection, short, never a URL."""
    keepalive_sent_ms: int | None = None
    """Wall-clock ms of the last application-level keepalive sent (None: none)."""
    keepalive_answered_ms: int | None = None
    """Wall-clock ms of the last answer to one (None: none)."""

    @property
    def troubled(self) -> bool:
        """Whether the entry has anything to say beyond its rate."""
        return self.status != STREAMING or self.reconnects > 0 or self.last_error is not None


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


def encode_health(entries: Mapping[str, PageEntry]) -> bytes | None:
    """``{"r": [rate of each entry, in order], "t": {id: [status, reconnects, last
    error]} for the troubled ones, "k": {id: [keepalive sent, answered]} (wall ms or
    null) for those with a keepalive}``; None when there is nothing to say."""
    rates = [e.rate for e in entries.values()]
    trouble = {
        cid: [e.status, e.reconnects, e.last_error] for cid, e in entries.items() if e.troubled
    }
    keepalives = {
        cid: [e.keepalive_sent_ms, e.keepalive_answered_ms]
        for cid, e in entries.items()
        if e.keepalive_sent_ms is not None or e.keepalive_answered_ms is not None
    }
    if not trouble and not keepalives and all(r is None for r in rates):
        return None
    health: dict[str, Any] = {"r": rates}
    if trouble:
        health["t"] = trouble
    if keepalives:
        health["k"] = keepalives
    return zlib.compress(json.dumps(health, separators=(",", ":")).encode(), 6)


def decode_entries(
    blob: bytes, written_at_ms: int, health_blob: bytes | None = None
) -> dict[str, PageEntry]:
    rows = json.loads(zlib.decompress(blob))
    rates, trouble, keepalives = _decode_health(health_blob)
    entries: dict[str, PageEntry] = {}
    for i, row in enumerate(rows):
        # A newer version may add fields to a row: this one reads the fields it knows.
        cid, epoch, seq_gen, seq, ago = row[:5]
        status, reconnects, last_error = trouble.get(cid, (STREAMING, 0, None))
        sent, answered = keepalives.get(cid, (None, None))
        entries[str(cid)] = PageEntry(
            epoch=int(epoch),
            seq_gen=int(seq_gen),
            seq=int(seq),
            advanced_at_ms=None if ago < 0 else written_at_ms - int(ago),
            rate=rates[i] if i < len(rates) else None,
            status=status,
            reconnects=reconnects,
            last_error=last_error,
            keepalive_sent_ms=sent,
            keepalive_answered_ms=answered,
        )
    return entries


_Trouble = tuple[str, int, str | None]


_Keepalive = tuple[int | None, int | None]


def _decode_health(
    blob: bytes | None,
) -> tuple[list[float | None], dict[str, _Trouble], dict[str, _Keepalive]]:
    """The rates, troubles and keepalive times of a health blob. Health is for people to
    read: one that cannot be read is ignored, never in the way of the checkpoints a
    takeover needs."""
    if not blob:
        return [], {}, {}
    try:
        health = json.loads(zlib.decompress(blob))
        rates = [None if r is None else float(r) for r in health.get("r") or []]
        trouble = {
            str(cid): (str(status), int(reconnects), None if error is None else str(error))
            for cid, (status, reconnects, error) in (health.get("t") or {}).items()
        }
        keepalives = {
            str(cid): (_ms_or_none(sent), _ms_or_none(answered))
            for cid, (sent, answered) in (health.get("k") or {}).items()
        }
    except (ValueError, TypeError, AttributeError, zlib.error):
        return [], {}, {}
    return rates, trouble, keepalives


def _ms_or_none(value: Any) -> int | None:
    return None if value is None else int(value)


def round_rate(rate: float) -> float:
    """Two significant digits (12.34 -> 12, 0.456 -> 0.46): what a view needs, and
    rates that round alike compare equal, so a steady stream's page does not change
    for noise alone."""
    if rate <= 0:
        return 0
    rounded = float(f"{rate:.2g}")
    return int(rounded) if rounded.is_integer() else rounded


def page_item(
    worker_id: str,
    session_gen: int,
    entries: Mapping[str, PageEntry],
    written_at_ms: int,
    number: int = 0,
) -> dict[str, Any]:
    """The page as a DynamoDB item (typed attributes); ``number``: its place among the
    pages of its session (:func:`page_put_condition`)."""
    item = {
        **{k: to_attribute(v) for k, v in schema.page_key(worker_id, session_gen).items()},
        schema.PAGE_WRITTEN_AT_MS: to_attribute(written_at_ms),
        schema.PAGE_NUMBER: to_attribute(number),
        schema.PAGE_ENTRIES: {"B": encode_entries(entries, written_at_ms)},
    }
    health = encode_health(entries)
    if health is not None:
        item[schema.PAGE_HEALTH] = {"B": health}
    return item


def page_put_condition(number: int) -> dict[str, Any]:
    """A page never replaces a newer one, by the number its writer gave it (a late
    write of an older page would move resume points back: more duplicates, never a
    loss, but for nothing). Not by its wall time: a writer whose wall clock stepped
    back would have every page refused until its clock caught up, and a takeover
    would then resume from the last page before the step."""
    return {
        "ConditionExpression": "attribute_not_exists(#no) OR #no < :no",
        "ExpressionAttributeNames": {"#no": schema.PAGE_NUMBER},
        "ExpressionAttributeValues": {":no": to_attribute(number)},
    }


def page_from_dynamodb(raw: Mapping[str, Any]) -> CheckpointPage:
    """The page of a raw item; raises :class:`MalformedItemError` for one that cannot
    be read (a takeover then resumes from the item's own checkpoint)."""

    def malformed(problem: str) -> MalformedItemError:
        return MalformedItemError(key_text(raw), f"malformed checkpoint page: {problem}")

    try:
        written = int(raw[schema.PAGE_WRITTEN_AT_MS]["N"])
    except (KeyError, TypeError, ValueError):
        raise malformed("written_at_ms is not an integer") from None
    blob = raw.get(schema.PAGE_ENTRIES, {}).get("B")
    if blob is None:
        raise malformed("entries is not binary")
    health = raw.get(schema.PAGE_HEALTH, {}).get("B")
    try:
        entries = decode_entries(bytes(blob), written, None if health is None else bytes(health))
    except (ValueError, TypeError, IndexError, zlib.error):
        raise malformed("entries cannot be read") from None
    return CheckpointPage(written, entries)


def resume_seq(
    item_epoch: int, item_seq_gen: int, item_last_seq: int, entry: PageEntry | None
) -> int:
    """Where a takeover resumes: the page entry's seq when it belongs to the item's
    current hold (same epoch) and stream (same ``seq_gen``) and is ahead of the
    item's own checkpoint; otherwise the item's ``last_seq``."""
    if entry is None or entry.epoch != item_epoch or entry.seq_gen != item_seq_gen:
        return item_last_seq
    return max(item_last_seq, entry.seq)


def page_advance_ms(item_epoch: int, item_seq_gen: int, entry: PageEntry | None) -> int | None:
    """When a takeover's stream last advanced, by the dead session's page: the entry's
    time when the entry belongs to the item's hold and stream (as for
    :func:`resume_seq`); None otherwise (the item's own, if any, is used instead)."""
    if entry is None or entry.epoch != item_epoch or entry.seq_gen != item_seq_gen:
        return None
    return entry.advanced_at_ms
