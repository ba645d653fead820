"""The envelope the sinks write: its exact bytes, reading them back, and what reading
refuses."""

from __future__ import annotations

import json

import pytest

from wsfleet.envelope import KEYS, Envelope, EnvelopeError

ENVELOPE = Envelope("btc-eth", 3, 1, 42, 1767225604100, {"price": "64211.37", "n": [1, 2.5]})
FOLLOWING = Envelope("btc-eth", 3, 1, 43, 1767225604100, "next", prev_seq=42)


def test_the_bytes_are_compact_json_with_the_six_keys_in_order():
    assert ENVELOPE.to_bytes() == (
        b'{"connection_id":"btc-eth","epoch":3,"seq_gen":1,"seq":42,'
        b'"received_at":1767225604100,"payload":{"price":"64211.37","n":[1,2.5]}}'
    )
    assert tuple(json.loads(ENVELOPE.to_bytes())) == KEYS


def test_prev_seq_is_written_after_seq_when_there_is_one():
    assert FOLLOWING.to_bytes() == (
        b'{"connection_id":"btc-eth","epoch":3,"seq_gen":1,"seq":43,"prev_seq":42,'
        b'"received_at":1767225604100,"payload":"next"}'
    )
    assert ENVELOPE.prev_seq is None
    assert b"prev_seq" not in ENVELOPE.to_bytes()


@pytest.mark.parametrize(
    "envelope",
    [
        ENVELOPE,
        FOLLOWING,
        Envelope("c-1", 1, 0, 1, 0, None, prev_seq=0),
        Envelope("c-1", 1, 0, 10**30, 0, None, prev_seq=10**30 - 7),  # a gap in the call
    ],
)
def test_an_envelope_with_or_without_prev_seq_reads_back_the_same(envelope):
    assert Envelope.from_bytes(envelope.to_bytes()) == envelope
    assert Envelope.from_bytes(envelope.to_bytes(ascii_only=True)) == envelope


@pytest.mark.parametrize(
    "payload",
    [
        None,
        0,
        "text",
        [],
        {"nested": {"deep": [True, False, None]}},
        "Grüße, 東京, 🚀",
        "lone \ud800 surrogate",
        "\ufffe\uffff",
        -1.5e300,
    ],
)
def test_every_json_payload_reads_back_the_same(payload):
    envelope = Envelope("c-1", 1, 0, 1, 0, payload)
    assert Envelope.from_bytes(envelope.to_bytes()) == envelope
    assert Envelope.from_bytes(envelope.to_bytes(ascii_only=True)) == envelope
    envelope.to_bytes().decode("utf-8")  # valid UTF-8, whatever the payload
    assert envelope.to_bytes(ascii_only=True).isascii()


def test_text_outside_ascii_is_written_as_itself_unless_utf8_cannot_hold_it():
    assert "東京".encode() in Envelope("c", 1, 0, 1, 0, "東京").to_bytes()
    assert b"\\u6771" in Envelope("c", 1, 0, 1, 0, "東京").to_bytes(ascii_only=True)
    assert b"\\ud800" in Envelope("c", 1, 0, 1, 0, "\ud800").to_bytes()


@pytest.mark.parametrize(
    ("payload", "why"),
    [(float("nan"), "Out of range float"), ({"x": {1, 2}}, "set is not JSON serializable")],
)
def test_a_payload_json_cannot_hold_is_refused_naming_the_message(payload, why):
    with pytest.raises(EnvelopeError, match=f"c-9 seq_gen 2 seq 7 cannot be written.*{why}"):
        Envelope("c-9", 1, 2, 7, 0, payload).to_bytes()


def test_a_newline_after_the_envelope_is_allowed():
    assert Envelope.from_bytes(ENVELOPE.to_bytes() + b"\n") == ENVELOPE
    assert Envelope.from_bytes(bytearray(ENVELOPE.to_bytes())) == ENVELOPE


def with_field(**changes: object) -> bytes:
    fields = json.loads(ENVELOPE.to_bytes())
    fields.update(changes)
    return json.dumps(fields).encode()


def without(name: str) -> bytes:
    fields = json.loads(ENVELOPE.to_bytes())
    del fields[name]
    return json.dumps(fields).encode()


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (b"\xff\xfe", "UTF-8"),
        (b'{"connection_id": ', "not JSON"),
        (b"[1, 2]", "a JSON object, got list"),
        (with_field(payload=float("nan")), "NaN is not a JSON value"),
        (without("seq_gen"), "missing: seq_gen$"),
        (without("received_at"), "missing: received_at$"),
        (with_field(extra=1), "unexpected: extra$"),
        (with_field(connection_id=""), "connection_id must be"),
        (with_field(connection_id="a b"), "connection_id must be"),
        (with_field(connection_id=7), "connection_id must be"),
        (with_field(epoch="3"), "epoch must be an integer from 0 to 10\\*\\*38 - 1, got '3'"),
        (with_field(seq_gen=True), "seq_gen must be an integer from 0 to 10\\*\\*38 - 1, got True"),
        (with_field(seq=-1), "seq must be an integer from 0 to 10\\*\\*38 - 1, got -1"),
        (with_field(seq=4.0), "seq must be an integer from 0 to 10\\*\\*38 - 1, got 4.0"),
        (
            with_field(received_at=None),
            "received_at must be an integer from 0 to 10\\*\\*38 - 1, got None",
        ),
        (with_field(prev_seq=42), r"prev_seq must be an integer >= 0 and below seq \(42\), got 42"),
        (with_field(prev_seq=43), "prev_seq must be .* got 43$"),
        (with_field(prev_seq=-1), "prev_seq must be .* got -1$"),
        (with_field(prev_seq=None), "prev_seq must be .* got None$"),
        (with_field(prev_seq="41"), "prev_seq must be .* got '41'$"),
        (with_field(prev_seq=41.0), "prev_seq must be .* got 41.0$"),
        (with_field(prev_seq=False), "prev_seq must be .* got False$"),
        (with_field(prev=41), "unexpected: prev$"),
    ],
)
def test_what_is_not_an_envelope_is_refused_saying_why(data, why):
    with pytest.raises(EnvelopeError, match=why):
        Envelope.from_bytes(data)


def test_a_string_is_not_bytes():
    with pytest.raises(EnvelopeError, match="bytes, got str"):
        Envelope.from_bytes(ENVELOPE.to_bytes().decode())  # type: ignore[arg-type]


def test_an_envelope_error_is_a_value_error_and_the_key_names_the_message():
    assert issubclass(EnvelopeError, ValueError)
    copy = Envelope("btc-eth", 4, 1, 42, 1767225609999, "other worker, later")
    assert copy.key == ENVELOPE.key == ("btc-eth", 1, 42)
