import json
from typing import Any

import pytest

from worker.plugins import PluginError
from worker.upstream_protocol import (
    JsonSeqProtocol,
    LiveProtocol,
    Message,
    OpenFrameError,
    Reply,
    Unreadable,
    is_resumable,
    load_protocol,
    open_frames,
    protocol_for,
    reader,
    with_query,
)
from wsfleet.protocol_specs import InvalidProtocolError, parse_spec

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


# --- the open hook and plug-ins without it --------------------------------------------------


class BarePlugin:
    """A plug-in written before the open hook: resume_url and decode only."""

    def resume_url(self, ws_url: str, last_seq: int) -> str:
        return ws_url

    def decode(self, data: str | bytes) -> Message | Reply | Unreadable:
        return Message(1, data)


def test_a_plugin_without_the_new_members_sends_nothing_and_resumes():
    plugin = BarePlugin()
    assert open_frames(plugin, 41, {"token": "t"}) == []
    assert is_resumable(plugin)


def test_a_plugin_subclassing_json_seq_without_init_still_opens():
    class Sub(JsonSeqProtocol):
        def __init__(self) -> None:  # no super().__init__()
            pass

    assert open_frames(Sub(), 3, {}) == []


def built(raw: dict[str, Any]) -> Any:
    return protocol_for(parse_spec(raw).to_item(), default=BarePlugin())


def test_a_connection_without_a_spec_speaks_the_workers_default():
    default = BarePlugin()
    assert protocol_for(None, default) is default


def test_every_connection_gets_its_own_instance():
    stored = parse_spec({"name": "live"}).to_item()
    assert protocol_for(stored, BarePlugin()) is not protocol_for(stored, BarePlugin())


@pytest.mark.parametrize(
    "stored",
    [
        "not json",
        '{"name":"carrier-pigeon","options":{}}',
        '{"name":"json-field","options":{}}',  # no sequence pointer
    ],
)
def test_a_stored_spec_that_does_not_validate_is_refused(stored):
    with pytest.raises(InvalidProtocolError):
        protocol_for(stored, BarePlugin())


def test_json_seq_from_a_spec_reads_and_resumes_as_the_default_one():
    p = built({"name": "json-seq"})
    assert isinstance(p, JsonSeqProtocol)
    assert p.resume_url("wss://h/f?a=1", 9) == "wss://h/f?a=1&from_seq=10"
    assert p.decode('{"seq": 3}') == Message(3, {"seq": 3})
    assert open_frames(p, 9, {}) == []
    assert is_resumable(p)


def test_json_seq_subscribe_frame_is_rendered_at_open():
    p = built(
        {
            "name": "json-seq",
            "options": {
                "subscribe": {"op": "sub", "from": "${from_seq}", "key": "${secret:api_key}"}
            },
        }
    )
    (frame,) = open_frames(p, 41, {"api_key": "k-1"})
    assert json.loads(frame) == {"op": "sub", "from": 42, "key": "k-1"}


def test_a_subscribe_naming_a_secret_field_that_is_missing_fails_the_open_without_values():
    p = built({"name": "live", "options": {"subscribe": {"key": "${secret:api_key}"}}})
    with pytest.raises(OpenFrameError, match="api_key") as refused:
        open_frames(p, 0, {"other": "value-that-must-not-show"})
    assert "value-that-must-not-show" not in str(refused.value)


# --- json-field ----------------------------------------------------------------------------

FIELD = {"name": "json-field", "options": {"sequence": "/meta/n"}}


@pytest.mark.parametrize(
    ("frame", "expected"),
    [
        ('{"meta": {"n": 7}, "v": 1}', Message(7, {"meta": {"n": 7}, "v": 1})),
        (b'{"meta": {"n": 1}}', Message(1, {"meta": {"n": 1}})),
        ('{"meta": {"n": 0}}', Unreadable("no integer >= 1 at /meta/n")),
        ('{"meta": {"n": "7"}}', Unreadable("no integer >= 1 at /meta/n")),
        ('{"meta": {"n": true}}', Unreadable("no integer >= 1 at /meta/n")),
        ('{"meta": {"n": 2.5}}', Unreadable("no integer >= 1 at /meta/n")),
        ('{"meta": {}}', Unreadable("no integer >= 1 at /meta/n")),
        ('{"seq": 3}', Unreadable("no integer >= 1 at /meta/n")),
        ("[1, 2]", Unreadable("no integer >= 1 at /meta/n")),
        ("5", Unreadable("no integer >= 1 at /meta/n")),
        ("\x00not json{", Unreadable("not JSON")),
        (b"\xff\xfe", Unreadable("not JSON")),
        ("[" * 100_000, Unreadable("not JSON")),
        ('{"type": "ping"}', Unreadable("no integer >= 1 at /meta/n")),  # no app pings
    ],
)
def test_json_field_decode(frame, expected):
    assert built(FIELD).decode(frame) == expected


def test_json_field_pointer_into_an_array_and_escapes():
    p = built({"name": "json-field", "options": {"sequence": "/a~1b/1"}})
    assert p.decode('{"a/b": [0, 9]}') == Message(9, {"a/b": [0, 9]})


def test_json_field_payload_is_the_value_at_its_pointer():
    p = built({"name": "json-field", "options": {"sequence": "/n", "payload": "/data"}})
    assert p.decode('{"n": 2, "data": {"px": 1.5}}') == Message(2, {"px": 1.5})
    assert p.decode('{"n": 2, "data": null}') == Message(2, None)
    assert p.decode('{"n": 2}') == Unreadable("nothing at /data")


@pytest.mark.parametrize(
    ("options", "url", "resumable", "frame"),
    [
        ({}, "wss://h/f?a=1", False, None),
        ({"resume": "none"}, "wss://h/f?a=1", False, None),
        (
            {"resume": "query", "resume_param": "after"},
            "wss://h/f?a=1&after=42",
            True,
            None,
        ),
        (
            {"resume": "subscribe", "subscribe": {"op": "sub", "since": "${last_seq}"}},
            "wss://h/f?a=1",
            True,
            {"op": "sub", "since": 41},
        ),
        (
            {"resume": "none", "subscribe": {"op": "sub"}},
            "wss://h/f?a=1",
            False,
            {"op": "sub"},
        ),
    ],
    ids=["default", "none", "query", "subscribe", "none+subscribe"],
)
def test_json_field_resumes_as_its_options_say(options, url, resumable, frame):
    p = built({"name": "json-field", "options": {"sequence": "/n", **options}})
    assert p.resume_url("wss://h/f?a=1", 41) == url
    assert is_resumable(p) is resumable
    frames = open_frames(p, 41, {})
    assert [json.loads(f) for f in frames] == ([] if frame is None else [frame])


def test_json_field_query_resume_replaces_a_parameter_already_there():
    p = built(
        {
            "name": "json-field",
            "options": {"sequence": "/n", "resume": "query", "resume_param": "s"},
        }
    )
    assert p.resume_url("wss://h/f?s=3&b=2", 9) == "wss://h/f?b=2&s=10"


# --- live ------------------------------------------------------------------------------------


def test_live_numbers_each_message_from_the_checkpoint_and_resumes_nothing():
    p = built({"name": "live"})
    assert isinstance(p, LiveProtocol)
    assert not is_resumable(p)
    assert p.resume_url("wss://h/f?a=1", 0) == "wss://h/f?a=1"  # nothing to ask for
    assert p.decode('{"px": 1}') == Message(1, {"px": 1})
    assert p.decode('"tick"') == Message(2, "tick")
    assert p.decode("not json") == Unreadable("not JSON")  # not numbered
    assert p.decode("[3]") == Message(3, [3])
    # A reconnect (or a new owner) numbers on from the checkpoint it has.
    assert p.resume_url("wss://h/f", 57) == "wss://h/f"
    assert p.decode("{}") == Message(58, {})


def test_live_subscribe_frame():
    p = built({"name": "live", "options": {"subscribe": ["sub", "${secret:token}"]}})
    assert open_frames(p, 9, {"token": "t"}) == ['["sub","t"]']


@pytest.mark.parametrize(
    ("url", "params", "expected"),
    [
        ("wss://h/f", {}, "wss://h/f"),
        ("wss://h/f", {"token": "a b"}, "wss://h/f?token=a+b"),
        ("wss://h/f?x=1&token=old", {"token": "new"}, "wss://h/f?x=1&token=new"),
        ("wss://h/f?from_seq=3", {"k": "v"}, "wss://h/f?from_seq=3&k=v"),
    ],
)
def test_with_query(url, params, expected):
    assert with_query(url, params) == expected
