"""The feed's pure rules: query validation and deterministic message content."""

from __future__ import annotations

import json

import pytest

from local_stack.feed import (
    MAX_PAD_BYTES,
    OVERSIZE_BYTES,
    FeedRequest,
    FeedRequestError,
    feed_value,
    key_matches,
    key_source,
    message,
    oversize_frame,
    parse_request,
)


def test_defaults_come_from_the_path_and_the_server_rate() -> None:
    assert parse_request("/feed-a", default_rate=5.0) == FeedRequest(
        feed="feed-a", from_seq=1, rate=5.0
    )


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("/feed-a?from_seq=42", FeedRequest(feed="feed-a", from_seq=42, rate=5.0)),
        ("/feed-a?rate=0", FeedRequest(feed="feed-a", rate=0.0)),
        ("/feed-a?rate=12.5", FeedRequest(feed="feed-a", rate=12.5)),
        ("/feed-a?count=10", FeedRequest(feed="feed-a", rate=5.0, count=10)),
        ("/feed-a?count=0", FeedRequest(feed="feed-a", rate=5.0, count=0)),
        ("/feed-a?drop_after=3", FeedRequest(feed="feed-a", rate=5.0, drop_after=3)),
        ("/feed-a?close_after=0", FeedRequest(feed="feed-a", rate=5.0, close_after=0)),
        ("/feed-a?garbage_after=2", FeedRequest(feed="feed-a", rate=5.0, garbage_after=2)),
        ("/feed-a?oversize_after=1", FeedRequest(feed="feed-a", rate=5.0, oversize_after=1)),
        ("/feed-a?gap_after=4", FeedRequest(feed="feed-a", rate=5.0, gap_after=4)),
        ("/feed-a?mute_after=5", FeedRequest(feed="feed-a", rate=5.0, mute_after=5)),
        ("/feed-a?refuse=404", FeedRequest(feed="feed-a", rate=5.0, refuse=404)),
        ("/feed-a?refuse=503", FeedRequest(feed="feed-a", rate=5.0, refuse=503)),
        ("/feed-a?require_key=1", FeedRequest(feed="feed-a", rate=5.0, require_key=True)),
        ("/feed-a?require_key=0", FeedRequest(feed="feed-a", rate=5.0)),
        ("/feed-a?subscribe=true", FeedRequest(feed="feed-a", rate=5.0, subscribe=True)),
        ("/feed-a?seq_field=n", FeedRequest(feed="feed-a", rate=5.0, seq_field="n")),
        ("/feed-a?seq_field=meta.n", FeedRequest(feed="feed-a", rate=5.0, seq_field="meta.n")),
        ("/feed-a?live=1&rate=2", FeedRequest(feed="feed-a", rate=2.0, live=True)),
        ("/feed-a?pad=2048", FeedRequest(feed="feed-a", rate=5.0, pad=2048)),
        ("/feed-a?pad=0", FeedRequest(feed="feed-a", rate=5.0, pad=0)),
        (f"/feed-a?pad={MAX_PAD_BYTES}", FeedRequest(feed="feed-a", rate=5.0, pad=MAX_PAD_BYTES)),
        (
            "/feed-a?pad=100&seq_field=meta.n",
            FeedRequest(feed="feed-a", rate=5.0, pad=100, seq_field="meta.n"),
        ),
        (
            "/a%20b/c?from_seq=7&rate=1&count=9&gap_after=1&close_after=2",
            FeedRequest(feed="a b/c", from_seq=7, rate=1.0, count=9, gap_after=1, close_after=2),
        ),
    ],
)
def test_valid_queries(path: str, expected: FeedRequest) -> None:
    assert parse_request(path, default_rate=5.0) == expected


@pytest.mark.parametrize(
    ("path", "complaint"),
    [
        ("/", "missing feed name"),
        ("/?from_seq=2", "missing feed name"),
        ("/feed-a?from_seq=0", "from_seq"),
        ("/feed-a?from_seq=-1", "from_seq"),
        ("/feed-a?from_seq=1.5", "from_seq"),
        ("/feed-a?from_seq=+3", "from_seq"),
        ("/feed-a?from_seq=", "from_seq"),
        ("/feed-a?from_seq=abc", "from_seq"),
        ("/feed-a?rate=-1", "rate"),
        ("/feed-a?rate=nan", "rate"),
        ("/feed-a?rate=inf", "rate"),
        ("/feed-a?rate=fast", "rate"),
        ("/feed-a?count=-2", "count"),
        ("/feed-a?drop_after=x", "drop_after"),
        ("/feed-a?mute_after=-1", "mute_after"),
        ("/feed-a?drop_afer=3", "unknown parameter 'drop_afer'"),
        ("/feed-a?count=3&count=4", "given twice"),
        ("/feed-a?count", "malformed query"),
        ("/feed-a?refuse=200", "refuse"),
        ("/feed-a?refuse=600", "refuse"),
        ("/feed-a?refuse=499", "refuse"),
        ("/feed-a?refuse=x", "refuse"),
        ("/feed-a?require_key=yes", "require_key must be 1 or 0"),
        ("/feed-a?subscribe=2", "subscribe must be 1 or 0"),
        ("/feed-a?seq_field=", "seq_field"),
        ("/feed-a?seq_field=1n", "seq_field"),
        ("/feed-a?seq_field=a.b.c.d", "seq_field"),
        ("/feed-a?seq_field=value", "seq_field"),
        ("/feed-a?seq_field=feed.n", "seq_field"),
        ("/feed-a?live=1&rate=0", "live needs a rate > 0"),
        ("/feed-a?pad=-1", "pad must be an integer >= 0"),
        ("/feed-a?pad=2k", "pad must be an integer >= 0"),
        ("/feed-a?pad=", "pad must be an integer >= 0"),
        (f"/feed-a?pad={MAX_PAD_BYTES + 1}", "pad must be at most"),
        ("/feed-a?pad=10&pad=20", "given twice"),
        ("/feed-a?pad=100&seq_field=pad", "seq_field must not be pad"),
        ("/feed-a?pad=100&seq_field=pad.n", "seq_field must not be pad"),
    ],
)
def test_invalid_queries(path: str, complaint: str) -> None:
    with pytest.raises(FeedRequestError, match=complaint):
        parse_request(path, default_rate=5.0)


def test_message_carries_seq_feed_time_and_a_value_fixed_by_feed_and_seq() -> None:
    decoded = json.loads(message("feed-a", 7, now_ms=1_700_000_000_123))
    assert decoded == {
        "seq": 7,
        "feed": "feed-a",
        "sent_at_ms": 1_700_000_000_123,
        "value": feed_value("feed-a", 7),
    }


def test_message_is_deterministic_apart_from_the_timestamp() -> None:
    first = json.loads(message("feed-a", 3, now_ms=1))
    again = json.loads(message("feed-a", 3, now_ms=2))
    assert first["value"] == again["value"]
    assert {k: v for k, v in first.items() if k != "sent_at_ms"} == {
        k: v for k, v in again.items() if k != "sent_at_ms"
    }


def test_values_differ_across_seqs_and_feeds() -> None:
    values = {feed_value("feed-a", seq) for seq in range(1, 101)}
    assert len(values) == 100
    assert feed_value("feed-a", 1) != feed_value("feed-b", 1)


def test_oversize_frame_is_exactly_two_mib() -> None:
    frame = oversize_frame()
    assert len(frame.encode()) == OVERSIZE_BYTES == 2 * 1024 * 1024
    assert "seq" not in json.loads(frame)


@pytest.mark.parametrize("size", [200, 2048, 65_536])
def test_pad_fills_the_frame_to_that_many_bytes(size: int) -> None:
    text = message("feed-a", 7, now_ms=1_700_000_000_123, pad=size)
    assert len(text.encode()) == size
    decoded = json.loads(text)
    filler = decoded.pop("pad")
    assert filler == "x" * len(filler)
    assert decoded == json.loads(message("feed-a", 7, now_ms=1_700_000_000_123))


def test_pad_leaves_a_message_already_that_long_as_it_is() -> None:
    plain = message("feed-a", 7, now_ms=5)
    assert message("feed-a", 7, now_ms=5, pad=len(plain)) == plain
    assert message("feed-a", 7, now_ms=5, pad=0) == plain
    # The smallest padded frame: the field with no filler at all.
    smallest = len(plain) + len(',"pad":""')
    assert json.loads(message("feed-a", 7, now_ms=5, pad=smallest))["pad"] == ""


def test_pad_keeps_the_number_where_seq_field_says() -> None:
    decoded = json.loads(message("feed-a", 7, now_ms=5, seq_field="meta.n", pad=300))
    assert decoded["meta"] == {"n": 7}
    assert set(decoded) == {"meta", "feed", "sent_at_ms", "value", "pad"}


@pytest.mark.parametrize(
    ("seq_field", "expected"),
    [
        ("n", {"n": 7}),
        ("meta.n", {"meta": {"n": 7}}),
        ("a.b.c", {"a": {"b": {"c": 7}}}),
    ],
)
def test_message_carries_its_number_where_seq_field_says(seq_field, expected) -> None:
    decoded = json.loads(message("feed-a", 7, now_ms=5, seq_field=seq_field))
    assert decoded == expected | {
        "feed": "feed-a",
        "sent_at_ms": 5,
        "value": feed_value("feed-a", 7),
    }
    assert "seq" not in decoded


@pytest.mark.parametrize(
    ("given", "expected", "matches"),
    [
        ("k", "k", True),
        ("k", "K", False),
        (None, "k", False),
        ("", "k", False),
        ("k", None, False),  # a feed without a key admits nobody
        (None, None, False),
    ],
)
def test_key_matches(given, expected, matches) -> None:
    assert key_matches(given, expected) is matches


def test_a_key_file_is_read_at_every_handshake(tmp_path) -> None:
    path = tmp_path / "key"
    source = key_source(key_file=path)
    assert source() is None  # not there yet
    path.write_text("one\n")
    assert source() == "one"
    path.write_text("two")
    assert source() == "two"
    assert key_source(key="fixed")() == "fixed"
    assert key_source()() is None
