"""Protocol specs as a start carries them: what validates, what is refused and why,
the stored form, templates and JSON pointers."""

from __future__ import annotations

import pytest

from wsfleet.protocol_specs import (
    MAX_SPEC_BYTES,
    InvalidProtocolError,
    ProtocolSpec,
    parse_spec,
    render_template,
    resolve_pointer,
    secret_fields,
    spec_from_item,
)

SUBSCRIBE = {
    "op": "subscribe",
    "channel": "trades",
    "from": "${from_seq}",
    "key": "${secret:api_key}",
}


@pytest.mark.parametrize(
    ("raw", "resumable"),
    [
        ({"name": "json-seq"}, True),
        ({"name": "json-seq", "options": {}}, True),
        ({"name": "json-seq", "options": {"subscribe": {"op": "hello"}}}, True),
        ({"name": "json-field", "options": {"sequence": "/sequence"}}, False),
        (
            {
                "name": "json-field",
                "options": {"sequence": "/s", "resume": "query", "resume_param": "since"},
            },
            True,
        ),
        (
            {
                "name": "json-field",
                "options": {
                    "sequence": "/data/0/n",
                    "payload": "/data",
                    "resume": "subscribe",
                    "subscribe": SUBSCRIBE,
                },
            },
            True,
        ),
        ({"name": "json-field", "options": {"sequence": "/a~1b/c~0d", "resume": "none"}}, False),
        ({"name": "live"}, False),
        ({"name": "live", "options": {"subscribe": ["sub", "${secret:token}"]}}, False),
        ({"name": "json-seq", "options": {"inflate": "gzip"}}, True),
        ({"name": "json-field", "options": {"sequence": "/s", "inflate": "auto"}}, False),
        ({"name": "live", "options": {"inflate": "deflate"}}, False),
    ],
)
def test_valid_specs(raw, resumable):
    spec = parse_spec(raw)
    assert spec.name == raw["name"]
    assert dict(spec.options) == raw.get("options", {})
    assert spec.resumable is resumable
    assert spec_from_item(spec.to_item()) == spec


@pytest.mark.parametrize(
    ("raw", "says"),
    [
        ("json-seq", "must be an object"),
        ({"name": "json-seq", "extra": 1}, "unknown keys: ['extra']"),
        ({"name": "protobuf"}, "name must be one of ['json-seq', 'json-field', 'live']"),
        ({"name": "my.module:factory"}, "name must be one of"),
        ({}, "name must be one of"),
        ({"name": "json-seq", "options": []}, "options must be an object"),
        (
            {"name": "json-seq", "options": {"sequence": "/s"}},
            "json-seq options: unknown ['sequence']",
        ),
        ({"name": "json-field"}, '"sequence" (a JSON pointer) is required'),
        (
            {"name": "live", "options": {"inflate": "brotli"}},
            "live options: inflate must be one of ['gzip', 'zlib', 'deflate', 'auto']",
        ),
        ({"name": "json-field", "options": {"sequence": "seq"}}, "must be a JSON pointer"),
        ({"name": "json-field", "options": {"sequence": "/a~2"}}, "must be a JSON pointer"),
        ({"name": "json-field", "options": {"sequence": 3}}, "must be a JSON pointer"),
        ({"name": "json-field", "options": {"sequence": "/s", "payload": ""}}, "payload must be"),
        (
            {"name": "json-field", "options": {"sequence": "/s", "resume": "magic"}},
            "resume must be",
        ),
        ({"name": "json-field", "options": {"sequence": "/s", "resume": "query"}}, "resume_param"),
        (
            {
                "name": "json-field",
                "options": {"sequence": "/s", "resume": "query", "resume_param": "a b"},
            },
            "resume_param",
        ),
        (
            {"name": "json-field", "options": {"sequence": "/s", "resume_param": "since"}},
            'goes with resume "query"',
        ),
        (
            {"name": "json-field", "options": {"sequence": "/s", "resume": "subscribe"}},
            'needs a "subscribe" frame',
        ),
        (
            {
                "name": "json-field",
                "options": {"sequence": "/s", "resume": "subscribe", "subscribe": {"op": "sub"}},
            },
            'needs a "subscribe" frame',
        ),
        ({"name": "live", "options": {"subscribe": {"from": "${from_seq}"}}}, "no meaning"),
        ({"name": "live", "options": {"subscribe": {"x": "${env:HOME}"}}}, "unknown placeholder"),
        ({"name": "live", "options": {"sequence": "/s"}}, "live options: unknown"),
        ({"name": "live", "options": {"subscribe": "x" * MAX_SPEC_BYTES}}, "more than 4096"),
        # JSON as Python reads it admits these; stored, they would not be JSON any more
        ({"name": "live", "options": {"subscribe": {"x": float("nan")}}}, "finite"),
        ({"name": "json-seq", "options": {"subscribe": [float("-inf")]}}, "finite"),
    ],
)
def test_invalid_specs_say_why(raw, says):
    with pytest.raises(InvalidProtocolError, match=None) as caught:
        parse_spec(raw)
    assert says in str(caught.value)


def test_the_stored_form_is_compact_and_sorted():
    spec = ProtocolSpec("json-field", {"sequence": "/s", "resume": "none"})
    assert spec.to_item() == '{"name":"json-field","options":{"resume":"none","sequence":"/s"}}'
    assert spec_from_item(None) is None
    with pytest.raises(InvalidProtocolError, match="not JSON"):
        spec_from_item("{")


def test_templates_fill_seqs_and_secret_fields_only_where_a_whole_string_says_so():
    filled = render_template(
        {**SUBSCRIBE, "note": "from ${from_seq} on", "list": ["${last_seq}", 7]},
        last_seq=41,
        secret={"api_key": "k-123"},
    )
    assert filled == {
        "op": "subscribe",
        "channel": "trades",
        "from": 42,
        "key": "k-123",
        "note": "from ${from_seq} on",
        "list": [41, 7],
    }
    assert secret_fields(SUBSCRIBE) == {"api_key"}


def test_a_missing_secret_field_is_named_not_shown():
    with pytest.raises(KeyError, match="api_key"):
        render_template(SUBSCRIBE, last_seq=0, secret={"other": "s3cret"})


@pytest.mark.parametrize(
    ("pointer", "value"),
    [
        ("/sequence", 7),
        ("/data/items/1/n", 2),
        ("/a~1b", "slash"),
        ("/m~0n", "tilde"),
        ("/", "empty key"),
    ],
)
def test_json_pointers(pointer, value):
    document = {
        "sequence": 7,
        "data": {"items": [{"n": 1}, {"n": 2}]},
        "a/b": "slash",
        "m~n": "tilde",
        "": "empty key",
    }
    assert resolve_pointer(document, pointer) == value


@pytest.mark.parametrize("pointer", ["/missing", "/data/items/2", "/data/items/x", "/sequence/x"])
def test_absent_pointers_raise_lookup_error(pointer):
    with pytest.raises(LookupError):
        resolve_pointer({"sequence": 7, "data": {"items": [1, 2]}}, pointer)
