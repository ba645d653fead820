"""The orjson decoder gives handlers what ``json.loads`` gives them, but for the one
documented difference (integers past 64 bits)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from worker import json_decoding
from wsfleet import accelerators

fast = json_decoding.decoder(json_decoding.ORJSON)

INT64 = st.integers(min_value=-(2**63), max_value=2**64 - 1)
scalars = st.none() | st.booleans() | INT64 | st.floats(allow_nan=False) | st.text()
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(), inner, max_size=5),
    max_leaves=30,
)


def same(a: Any, b: Any) -> bool:
    """Equal with the same types all the way down (``1 == 1.0 == True`` is not enough)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b) or (isinstance(a, float) and repr(a) == repr(b))


@given(values, st.booleans(), st.booleans())
def test_any_json_value_decodes_as_the_standard_library_decodes_it(value, ascii_only, as_bytes):
    text = json.dumps(value, ensure_ascii=ascii_only)
    data: str | bytes = text.encode() if as_bytes else text
    assert same(fast(data), json.loads(data))


@pytest.mark.parametrize(
    "data",
    [
        "NaN",
        "[Infinity, -Infinity]",
        "1e400",
        '{"x": -1e999}',
        '"\\ud800"',
        '{"a": 1, "a": 2}',
        '{"seq": 1, "p": 0.1}',
        "[" * 1100 + "]" * 1100,
        json.dumps({"seq": 3, "text": "é"}).encode("utf-16"),
        b"\xef\xbb\xbf" + b'{"seq": 1}',
    ],
    ids=[
        "nan",
        "infinity",
        "float-overflow",
        "negative-overflow",
        "lone-surrogate",
        "duplicate-key",
        "plain",
        "deep",
        "utf-16",
        "utf-8-bom",
    ],
)
def test_what_orjson_refuses_is_decoded_by_the_standard_library(data):
    try:
        expected: Any = json.loads(data)
    except (ValueError, RecursionError) as error:
        with pytest.raises(type(error)):
            fast(data)
        return
    assert same(fast(data), expected)


@pytest.mark.parametrize("data", ["{", "seq", b"\xff\xfe\xfd", ""])
def test_what_neither_reads_is_a_value_error(data):
    with pytest.raises((json.JSONDecodeError, UnicodeDecodeError)):
        json.loads(data)
    with pytest.raises((json.JSONDecodeError, UnicodeDecodeError)):
        fast(data)


def test_the_documented_difference_integers_past_64_bits_decode_to_float():
    assert fast(str(2**64)) == float(2**64)
    assert type(fast(str(2**64))) is float
    assert json.loads(str(2**64)) == 2**64
    assert type(fast(str(2**64 - 1))) is int
    assert type(fast(str(-(2**63)))) is int


def test_unknown_and_missing_decoders_are_refused(monkeypatch):
    with pytest.raises(ValueError, match="unknown JSON decoder"):
        json_decoding.decoder("simdjson")
    monkeypatch.setattr(accelerators, "installed", lambda name: name == json_decoding.JSON)
    with pytest.raises(ValueError, match="orjson is not installed"):
        json_decoding.decoder(json_decoding.ORJSON)
    assert json_decoding.decoder(json_decoding.JSON) is json.loads


def test_use_switches_the_process_decoder():
    before = json_decoding.loads
    try:
        json_decoding.use(json_decoding.JSON)
        assert json_decoding.loads is json.loads
    finally:
        json_decoding.loads = before
