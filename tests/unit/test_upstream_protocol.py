import json

import pytest

from worker.plugins import PluginError
from worker.upstream_protocol import (
    JsonSeqProtocol,
    Message,
    Reply,
    Unreadable,
    load_protocol,
    reader,
)

P = JsonSeqProtocol()


@pytest.mark.parametrize(
    ("url", "last_seq", "expected"),
    [
        ("wss://h/feed", 0, "wss://h/feed?from_seq=1"),
        ("wss://h/feed?a=1", 41, "wss://h/feed?a=1&from_seq=42"),
        ("wss://h/feed?from_seq=3&a=1", 9, "wss://h/feed?a=1&from_seq=10"),
        ("ws://127.0.0.1:8765/x?rate=5", 0, "ws://127.0.0.1:8765/x?rate=5&from_seq=1"),
    ],
)
def test_resume_url(url, last_seq, expected):
    assert P.resume_url(url, last_seq) == expected


@pytest.mark.parametrize(
    ("frame", "expected"),
    [
        ('{"seq": 1, "v": 2}', Message(1, {"seq": 1, "v": 2})),
        (b'{"seq": 7}', Message(7, {"seq": 7})),
        ('{"seq": 0}', Unreadable("no integer seq >= 1")),
        ('{"seq": "3"}', Unreadable("no integer seq >= 1")),
        ('{"seq": true}', Unreadable("no integer seq >= 1")),
        ('{"seq": 1.5}', Unreadable("no integer seq >= 1")),
        ('{"v": 1}', Unreadable("no integer seq >= 1")),
        ("[1, 2]", Unreadable("not a JSON object")),
        ("\x00not json{", Unreadable("not JSON")),
        (b"\xff\xfe", Unreadable("not JSON")),
    ],
)
def test_decode(frame, expected):
    assert P.decode(frame) == expected


def test_application_ping_is_answered_with_pong():
    reply = P.decode('{"type": "ping", "id": 5}')
    assert isinstance(reply, Reply)
    assert json.loads(reply.data) == {"type": "pong", "id": 5}


def test_load_protocol():
    assert isinstance(load_protocol("json-seq"), JsonSeqProtocol)
    assert isinstance(load_protocol("worker.upstream_protocol:JsonSeqProtocol"), JsonSeqProtocol)
    with pytest.raises(PluginError, match="UPSTREAM_PROTOCOL"):
        load_protocol("no-colon")
    with pytest.raises(PluginError, match="cannot import"):
        load_protocol("no_such_module_xyz:make")
    with pytest.raises(PluginError, match="not a protocol"):
        load_protocol("builtins:dict")


@pytest.mark.parametrize(
    "frame",
    ['{"seq": 1, "v": 2}', b'{"seq": 7}', '{"seq": true}', "[1, 2]", '{"type": "ping"}', "x"],
)
def test_read_is_decode_with_a_message_as_seq_and_payload(frame):
    """The runner's per-message path reads without making a Message."""
    read, decoded = P.read(frame), P.decode(frame)
    if isinstance(decoded, Message):
        assert read == (decoded.seq, decoded.payload)
    else:
        assert read == decoded


def test_the_runner_reads_a_plug_in_through_its_decode():
    class Plain:
        def resume_url(self, ws_url: str, last_seq: int) -> str:
            return ws_url

        def decode(self, data: str | bytes) -> Message:
            return Message(1, data)

    plain = Plain()
    assert reader(plain)("x") == Message(1, "x")
    assert reader(P) == P.read
