"""DynamoDB's typed attribute values (``{"S": "x"}``, ``{"N": "5"}``, ``{"SS": [...]}``...)
as the simulated DynamoDB keeps them: checked, in canonical form, ordered and sized.

Every value the engine stores went through :func:`canonical_value`: numbers in
DynamoDB's canonical text (``"007"`` and ``"7.0"`` are stored as ``"7"``), binary as
``bytes``, set members sorted (strings by code point, which is UTF-8 byte order,
numbers by value, binary by bytes; DynamoDB Local returns sets in that order). Two
canonical values are equal exactly when ``==`` says so. Stored values are never
changed in place: an update builds new ones, and what leaves the engine is a copy
(:func:`copy_item`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from decimal import Context, Decimal, InvalidOperation
from functools import lru_cache
from typing import Any, Final

Attr = dict[str, Any]
"""One typed attribute value."""
Item = dict[str, Any]
"""An item: attribute name -> typed value."""

TYPES: Final = frozenset({"S", "N", "B", "SS", "NS", "BS", "M", "L", "NULL", "BOOL"})
SET_TYPES: Final = frozenset({"SS", "NS", "BS"})
ORDERED_TYPES: Final = frozenset({"S", "N", "B"})
"""The types ``<``, ``BETWEEN`` and key ordering apply to."""
LONG_NAMES: Final = {
    "S": "STRING",
    "N": "NUMBER",
    "B": "BINARY",
    "SS": "STRING_SET",
    "NS": "NUMBER_SET",
    "BS": "BINARY_SET",
    "M": "MAP",
    "L": "LIST",
    "NULL": "NULL",
    "BOOL": "BOOLEAN",
}
"""Type names as some DynamoDB messages spell them."""

MAX_ITEM_BYTES: Final = 400 * 1024
_PRECISION: Final = 38
_MAX_EXPONENT: Final = 125
_MIN_EXPONENT: Final = -130
_NUMBER_TEXT: Final = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")
NUMBERS: Final = Context(prec=80)
"""Wide enough for any sum or difference of two numbers DynamoDB accepts."""


class InvalidValueError(ValueError):
    """A value DynamoDB refuses; ``detail`` is the message DynamoDB gives for it
    (without the ``ExpressionAttributeValues contains invalid value:`` frame)."""

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


# --- numbers ---------------------------------------------------------------------------


@lru_cache(maxsize=65536)
def canonical_number(text: str) -> str:
    """DynamoDB's canonical text of a number: no exponent, no leading or trailing
    zeros, ``0`` for any zero. Refuses what DynamoDB refuses (not a number, more
    than 38 significant digits, a magnitude outside 1E-130 .. 9.99E+125)."""
    if not isinstance(text, str) or _NUMBER_TEXT.fullmatch(text) is None:
        raise InvalidValueError("A value provided cannot be converted into a number")
    try:
        number = Decimal(text)
    except InvalidOperation:  # pragma: no cover - the pattern admits only numbers
        raise InvalidValueError("A value provided cannot be converted into a number") from None
    if number.is_zero():
        return "0"
    number = number.normalize(NUMBERS)
    if len(number.as_tuple().digits) > _PRECISION:
        raise InvalidValueError("DynamoDB only supports precision up to 38 digits")
    if number.adjusted() > _MAX_EXPONENT:
        raise InvalidValueError(
            "Number overflow. Attempting to store a number with magnitude larger than "
            "supported range"
        )
    if number.adjusted() < _MIN_EXPONENT:
        raise InvalidValueError(
            "Number underflow. Attempting to store a number with magnitude smaller than "
            "supported range"
        )
    return format(number, "f")


def number_attr(number: Decimal) -> Attr:
    """A computed number (a sum, an ``ADD``) as a canonical ``N`` value."""
    return {"N": canonical_number(format(number, "f"))}


# --- checking and canonical form -------------------------------------------------------


def _binary(value: Any) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, bytearray):
        return bytes(value)
    if isinstance(value, str):  # botocore sends a str as its UTF-8 bytes
        return value.encode("utf-8")
    raise InvalidValueError("Supplied AttributeValue has an invalid binary value")


def _java_list(members: list[Any]) -> str:
    return "[" + ", ".join(str(m) for m in members) + "]"


def canonical_value(value: Any) -> Attr:
    """A checked, canonical copy of one typed value; :class:`InvalidValueError`
    with DynamoDB's message when DynamoDB would refuse it."""
    if not isinstance(value, Mapping) or not value:
        raise InvalidValueError(
            "Supplied AttributeValue is empty, must contain exactly one of the supported datatypes"
        )
    if len(value) != 1:
        raise InvalidValueError(
            "Supplied AttributeValue has more than one datatypes set, must contain exactly "
            "one of the supported datatypes"
        )
    ((kind, content),) = value.items()
    if kind == "S":
        if not isinstance(content, str):
            raise InvalidValueError("Supplied AttributeValue has an invalid string value")
        return {"S": content}
    if kind == "N":
        return {"N": canonical_number(content)}
    if kind == "B":
        return {"B": _binary(content)}
    if kind == "BOOL":
        if not isinstance(content, bool):
            raise InvalidValueError("Supplied AttributeValue has an invalid boolean value")
        return {"BOOL": content}
    if kind == "NULL":
        if content is not True:
            raise InvalidValueError(
                "One or more parameter values were invalid: Null attribute value types must "
                "have the value of true"
            )
        return {"NULL": True}
    if kind == "SS":
        members = list(content)
        if not members:
            raise InvalidValueError(
                "One or more parameter values were invalid: An string set  may not be empty"
            )
        if not all(isinstance(m, str) for m in members):
            raise InvalidValueError("Supplied AttributeValue has an invalid string set")
        if len(set(members)) != len(members):
            raise InvalidValueError(
                "One or more parameter values were invalid: Input collection "
                f"{_java_list(members)} contains duplicates"
            )
        return {"SS": sorted(members)}
    if kind == "NS":
        texts = list(content)
        if not texts:
            raise InvalidValueError(
                "One or more parameter values were invalid: An number set  may not be empty"
            )
        numbers = [canonical_number(t) for t in texts]
        if len(set(numbers)) != len(numbers):
            raise InvalidValueError("Input collection contains duplicates")
        return {"NS": sorted(numbers, key=Decimal)}
    if kind == "BS":
        blobs = [_binary(b) for b in content]
        if not blobs:
            raise InvalidValueError(
                "One or more parameter values were invalid: Binary sets should not be empty"
            )
        if len(set(blobs)) != len(blobs):
            raise InvalidValueError(
                "One or more parameter values were invalid: Input collection of type BS "
                "contains duplicates."
            )
        return {"BS": sorted(blobs)}
    if kind == "L":
        return {"L": [canonical_value(v) for v in content]}
    if kind == "M":
        return {"M": {str(k): canonical_value(v) for k, v in content.items()}}
    raise InvalidValueError(
        "Supplied AttributeValue is empty, must contain exactly one of the supported datatypes"
    )


def canonical_item(item: Mapping[str, Any]) -> Item:
    """A checked, canonical copy of an item (every attribute through
    :func:`canonical_value`)."""
    return {name: canonical_value(value) for name, value in item.items()}


# --- reading values --------------------------------------------------------------------


def type_of(value: Attr) -> str:
    for kind in value:
        return kind
    raise InvalidValueError("Supplied AttributeValue is empty")  # pragma: no cover


def ordered(value: Attr) -> str | Decimal | bytes:
    """The value of an ``S``, ``N`` or ``B`` attribute as Python compares it the way
    DynamoDB orders it."""
    for kind, content in value.items():
        if kind == "N":
            return Decimal(content)
        return content  # type: ignore[no-any-return]
    raise InvalidValueError("Supplied AttributeValue is empty")  # pragma: no cover


def copy_value(value: Attr) -> Attr:
    if "S" in value or "N" in value:  # most values: immutable content, one dict to copy
        return dict(value)
    for kind, content in value.items():
        if type(content) is list:
            if kind == "L":
                return {kind: [copy_value(v) for v in content]}
            return {kind: list(content)}
        if type(content) is dict:
            return {kind: {k: copy_value(v) for k, v in content.items()}}
        return {kind: content}
    return {}  # pragma: no cover


def copy_item(item: Mapping[str, Attr]) -> Item:
    """A copy the caller may change without touching what the engine stores."""
    return {
        name: dict(value) if "S" in value or "N" in value else copy_value(value)
        for name, value in item.items()
    }


def value_size(value: Attr) -> int:
    """Bytes a value counts toward the 400 KB item limit (DynamoDB's documented
    rule: strings and binary by length, numbers ~1 byte per two digits + 1)."""
    for kind, content in value.items():
        if kind == "S":
            return len(content.encode("utf-8"))
        if kind == "N":
            return _number_size(content)
        if kind == "B":
            return len(content)
        if kind in ("BOOL", "NULL"):
            return 1
        if kind == "SS":
            return sum(len(m.encode("utf-8")) for m in content)
        if kind == "NS":
            return sum(_number_size(m) for m in content)
        if kind == "BS":
            return sum(len(m) for m in content)
        if kind == "L":
            return 3 + sum(1 + value_size(v) for v in content)
        if kind == "M":
            return 3 + sum(1 + len(k.encode("utf-8")) + value_size(v) for k, v in content.items())
    return 0  # pragma: no cover


def _number_size(text: str) -> int:
    digits = len(text.replace("-", "").replace(".", "").strip("0")) or 1
    return (digits + 1) // 2 + 1


def item_size(item: Mapping[str, Attr]) -> int:
    return sum(len(name.encode("utf-8")) + value_size(v) for name, v in item.items())


def describe(value: Attr) -> str:
    """A value as DynamoDB's messages print it: ``{N:9}``."""
    ((kind, content),) = value.items()
    return f"{{{kind}:{content}}}"
