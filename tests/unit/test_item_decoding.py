"""The fast path of attribute decoding gives what the general deserializer gives."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from boto3.dynamodb.types import TypeDeserializer
from hypothesis import given
from hypothesis import strategies as st

from wsfleet.item import _plain, from_attributes, to_attribute

_general = TypeDeserializer()

scalars = st.one_of(
    st.text(),
    st.integers(min_value=-(10**30), max_value=10**30),
    st.decimals(
        allow_nan=False, allow_infinity=False, places=3, min_value=-(10**6), max_value=10**6
    ),
    st.booleans(),
    st.none(),
    st.binary(min_size=1, max_size=8),
)
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=8,
)


@given(st.dictionaries(st.text(min_size=1, max_size=6), values, max_size=6))
def test_decoding_matches_the_general_deserializer(item: dict[str, Any]) -> None:
    raw = {name: to_attribute(value) for name, value in item.items()}
    expected = {name: _plain(_general.deserialize(value)) for name, value in raw.items()}
    assert from_attributes(raw) == expected


def test_numbers_that_are_not_plain_digits_take_the_general_path() -> None:
    raw = {"a": {"N": "-7"}, "b": {"N": "1.50"}, "c": {"N": "1E+2"}, "d": {"N": "007"}}
    assert from_attributes(raw) == {"a": -7, "b": 1.5, "c": 100, "d": 7}


def test_string_sets_and_decimals_keep_their_types() -> None:
    raw = {"s": {"SS": ["x", "y"]}, "n": {"N": "2.25"}}
    assert from_attributes(raw) == {"s": {"x", "y"}, "n": 2.25}
    assert isinstance(from_attributes({"n": {"N": "3"}})["n"], int)
    assert Decimal("2.25") == Decimal(str(from_attributes(raw)["n"]))
