"""A session's checkpoint page: the packed entries, the item, its put condition, and
where a takeover resumes from."""

from __future__ import annotations

import json
import zlib

import pytest

from tests.unit.expressions import holds
from wsfleet.checkpoint_page import (
    CheckpointPage,
    PageEntry,
    decode_entries,
    encode_entries,
    page_advance_ms,
    page_from_dynamodb,
    page_item,
    page_put_condition,
    resume_seq,
    round_rate,
)

WRITTEN = 1_000_000
ENTRIES = {
    "c1": PageEntry(epoch=3, seq_gen=0, seq=41, advanced_at_ms=WRITTEN - 250),
    "c2": PageEntry(epoch=1, seq_gen=2, seq=0, advanced_at_ms=None),  # nothing handled yet
    "c3": PageEntry(epoch=9, seq_gen=1, seq=7, advanced_at_ms=WRITTEN),  # moved at the write
}


def test_entries_are_packed_as_rows_of_json_then_zlib():
    rows = json.loads(zlib.decompress(encode_entries(ENTRIES, WRITTEN)))
    assert rows == [["c1", 3, 0, 41, 250], ["c2", 1, 2, 0, -1], ["c3", 9, 1, 7, 0]]


def test_the_stored_bytes_are_compact_json_at_zlibs_default_level():
    """The exact bytes: the JSON with no spaces, compressed at level 6 (whose zlib
    header is 78 9c; levels 7 to 9 would write 78 da)."""
    blob = encode_entries({"c1": ENTRIES["c1"]}, WRITTEN)
    assert zlib.decompress(blob) == b'[["c1",3,0,41,250]]'
    assert blob == zlib.compress(b'[["c1",3,0,41,250]]', 6)
    assert blob[:2] == b"\x78\x9c"


@pytest.mark.parametrize(
    "entries",
    [ENTRIES, {}, {"c1": PageEntry(0, 0, 0, None)}, {"c1": PageEntry(2, 3, 10**12, 1)}],
    ids=["several", "empty", "zeros", "large"],
)
def test_entries_round_trip(entries):
    assert decode_entries(encode_entries(entries, WRITTEN), WRITTEN) == entries


def test_a_move_after_the_write_time_reads_back_as_the_write_time():
    """A clock that stepped back between the move and the write: never 'in the future'."""
    ahead = {"c1": PageEntry(epoch=1, seq_gen=0, seq=5, advanced_at_ms=WRITTEN + 40)}
    decoded = decode_entries(encode_entries(ahead, WRITTEN), WRITTEN)
    assert decoded["c1"].advanced_at_ms == WRITTEN


def test_the_move_time_is_kept_relative_to_the_write():
    """What is stored is 'ms before the write', so the page reads back against its
    own written_at_ms."""
    blob = encode_entries({"c1": ENTRIES["c1"]}, WRITTEN)
    assert decode_entries(blob, WRITTEN + 1_000)["c1"].advanced_at_ms == WRITTEN + 750


def test_a_page_packs_a_full_worker_small():
    """500 connections fit in a few KB of item (one write unit per started KB)."""
    many = {
        f"conn-{i:04d}": PageEntry(
            epoch=i % 7 + 1, seq_gen=i % 3, seq=1000 + i, advanced_at_ms=WRITTEN - i
        )
        for i in range(500)
    }
    blob = encode_entries(many, WRITTEN)
    assert len(blob) < 16_000
    assert decode_entries(blob, WRITTEN) == many


def test_page_item_shape():
    item = page_item("worker-a", 7, ENTRIES, WRITTEN, 12)
    assert set(item) == {"Pk", "Sk", "written_at_ms", "page_no", "entries"}
    assert item["page_no"] == {"N": "12"}
    assert item["Pk"] == {"S": "PAGE#worker-a#7"}
    assert item["Sk"] == {"S": "PAGE"}
    assert item["written_at_ms"] == {"N": str(WRITTEN)}
    assert item["entries"] == {"B": encode_entries(ENTRIES, WRITTEN)}


@pytest.mark.parametrize("as_type", [bytes, bytearray, memoryview])
def test_a_page_reads_back_from_its_item(as_type):
    item = page_item("worker-a", 7, ENTRIES, WRITTEN)
    item["entries"] = {"B": as_type(item["entries"]["B"])}
    assert page_from_dynamodb(item) == CheckpointPage(written_at_ms=WRITTEN, entries=ENTRIES)


def test_page_put_condition_exactly():
    assert page_put_condition(12) == {
        "ConditionExpression": "attribute_not_exists(#no) OR #no < :no",
        "ExpressionAttributeNames": {"#no": "page_no"},
        "ExpressionAttributeValues": {":no": {"N": "12"}},
    }


@pytest.mark.parametrize(
    ("stored", "written_at", "replaced"),
    [
        (None, WRITTEN, True),  # the first page of the session
        (7, WRITTEN, True),
        (11, WRITTEN, True),
        (12, WRITTEN, False),  # the same write again: nothing to do
        (13, WRITTEN, False),  # a late write of an older page
        (11, WRITTEN + 3_600_000, True),  # the wall times decide nothing
        (13, WRITTEN - 3_600_000, False),
    ],
)
def test_a_page_never_replaces_a_newer_one(stored, written_at, replaced):
    condition = page_put_condition(12)
    item = None if stored is None else page_item("worker-a", 7, {}, written_at, stored)
    assert (
        holds(
            condition["ConditionExpression"],
            item,
            condition["ExpressionAttributeNames"],
            condition["ExpressionAttributeValues"],
        )
        is replaced
    )


# Item: epoch 5, seq_gen 2, last_seq 100.
@pytest.mark.parametrize(
    ("entry", "resume"),
    [
        (None, 100),  # nothing on the page
        (PageEntry(epoch=5, seq_gen=2, seq=130, advanced_at_ms=None), 130),  # page ahead
        (PageEntry(epoch=5, seq_gen=2, seq=101, advanced_at_ms=None), 101),
        (PageEntry(epoch=5, seq_gen=2, seq=100, advanced_at_ms=None), 100),
        (PageEntry(epoch=5, seq_gen=2, seq=90, advanced_at_ms=None), 100),  # behind the item
        (PageEntry(epoch=4, seq_gen=2, seq=130, advanced_at_ms=None), 100),  # an older hold
        (PageEntry(epoch=6, seq_gen=2, seq=130, advanced_at_ms=None), 100),
        (PageEntry(epoch=5, seq_gen=1, seq=130, advanced_at_ms=None), 100),  # an older stream
        (PageEntry(epoch=5, seq_gen=3, seq=130, advanced_at_ms=None), 100),
        (PageEntry(epoch=4, seq_gen=1, seq=130, advanced_at_ms=None), 100),
    ],
)
def test_where_a_takeover_resumes(entry, resume):
    assert resume_seq(5, 2, 100, entry) == resume


@pytest.mark.parametrize(
    ("entry", "advanced"),
    [
        (None, None),
        (PageEntry(epoch=5, seq_gen=2, seq=130, advanced_at_ms=WRITTEN - 40), WRITTEN - 40),
        (PageEntry(epoch=5, seq_gen=2, seq=130, advanced_at_ms=None), None),
        (PageEntry(epoch=4, seq_gen=2, seq=130, advanced_at_ms=WRITTEN - 40), None),
        (PageEntry(epoch=5, seq_gen=1, seq=130, advanced_at_ms=WRITTEN - 40), None),
    ],
)
def test_when_a_takeovers_stream_last_moved_by_the_page(entry, advanced):
    """Only an entry of the item's hold and stream says (as for the resume point)."""
    assert page_advance_ms(5, 2, entry) == advanced


# --- health: rates for every entry, the rest only for the troubled ones ----------------

HEALTHY = {
    "c1": PageEntry(3, 0, 41, WRITTEN - 250, rate=9.8),
    "c2": PageEntry(1, 2, 0, None, rate=0),
}
TROUBLED = {
    **HEALTHY,
    "c3": PageEntry(
        9, 1, 7, WRITTEN, rate=0, status="backing_off", reconnects=4, last_error="HTTP 503"
    ),
    "c4": PageEntry(
        2, 0, 5, None, rate=None, status="streaming", reconnects=1, last_error="connection lost"
    ),
}


def health_of(item: dict) -> object:
    return json.loads(zlib.decompress(item["health"]["B"]))


def test_a_healthy_page_says_only_the_rates_in_the_entries_order():
    item = page_item("w-1", 4, HEALTHY, WRITTEN)
    assert health_of(item) == {"r": [9.8, 0]}


def test_only_the_troubled_entries_are_named_in_the_health():
    item = page_item("w-1", 4, TROUBLED, WRITTEN)
    compact = zlib.decompress(item["health"]["B"])
    assert b", " not in compact  # compact separators
    assert b": " not in compact
    assert health_of(item) == {
        "r": [9.8, 0, 0, None],
        "t": {"c3": ["backing_off", 4, "HTTP 503"], "c4": ["streaming", 1, "connection lost"]},
    }


KEPT_ALIVE = {
    **HEALTHY,
    "c5": PageEntry(
        4, 0, 12, WRITTEN, rate=1.5, keepalive_sent_ms=WRITTEN - 900, keepalive_answered_ms=None
    ),
    "c6": PageEntry(
        4,
        0,
        13,
        WRITTEN,
        rate=2,
        keepalive_sent_ms=WRITTEN - 400,
        keepalive_answered_ms=WRITTEN - 380,
    ),
}


def test_the_keepalive_times_are_named_only_for_the_connections_that_have_one():
    item = page_item("w-1", 4, KEPT_ALIVE, WRITTEN)
    assert health_of(item) == {
        "r": [9.8, 0, 1.5, 2],
        "k": {"c5": [WRITTEN - 900, None], "c6": [WRITTEN - 400, WRITTEN - 380]},
    }
    assert page_from_dynamodb(item).entries == KEPT_ALIVE


def test_a_page_with_nothing_to_say_of_health_has_no_health_attribute():
    assert "health" not in page_item("w-1", 4, ENTRIES, WRITTEN)


@pytest.mark.parametrize(
    "entries", [HEALTHY, TROUBLED, ENTRIES], ids=["healthy", "troubled", "bare"]
)
def test_health_round_trips_through_the_item(entries):
    assert page_from_dynamodb(page_item("w-1", 4, entries, WRITTEN)).entries == entries


@pytest.mark.parametrize(
    "health",
    [
        b"not zlib",
        zlib.compress(b"[1,2]"),
        zlib.compress(b'{"t": {"c1": 5}}'),
        zlib.compress(b'{"r": "x"}'),
        zlib.compress(b'{"k": {"c1": ["x", 1]}}'),
    ],
    ids=["not zlib", "not an object", "bad trouble", "bad rates", "bad keepalive"],
)
def test_a_health_attribute_that_cannot_be_read_leaves_the_checkpoints_readable(health):
    item = page_item("w-1", 4, HEALTHY, WRITTEN) | {"health": {"B": health}}
    entries = page_from_dynamodb(item).entries
    assert {cid: (e.epoch, e.seq_gen, e.seq) for cid, e in entries.items()} == {
        "c1": (3, 0, 41),
        "c2": (1, 2, 0),
    }
    assert all(e.rate is None and not e.troubled for e in entries.values())


def test_a_page_from_a_writer_that_knew_no_health_reads_as_streaming():
    """The rows alone (an older worker's page during a rolling deploy)."""
    item = page_item("w-1", 4, ENTRIES, WRITTEN)
    assert all(
        (e.status, e.reconnects, e.last_error, e.rate) == ("streaming", 0, None, None)
        for e in page_from_dynamodb(item).entries.values()
    )


@pytest.mark.parametrize(
    ("rate", "rounded"),
    [
        (0, 0),
        (-1, 0),
        (12.34, 12),
        (9.96, 10),
        (0.456, 0.46),
        (1234.5, 1200),
        (1.0, 1),
        (0.001234, 0.0012),
    ],
)
def test_rates_keep_two_significant_digits(rate, rounded):
    assert round_rate(rate) == rounded
    assert type(round_rate(rate)) is type(rounded)
