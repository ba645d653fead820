"""Paging tokens: opaque, bound to the listing that issued them, and impossible to
turn into a malformed DynamoDB request."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from lambdas.router.listing import MAX_TOKEN_CHARS, InvalidTokenError, decode_token, encode_token

TABLE_KEY = {"Pk": {"S": "CONN#feed-1"}}
INDEX_KEY = {
    "Pk": {"S": "CONN#feed-1"},
    "desired_state": {"S": "STARTED"},
    "lease_expires_at_ms": {"N": "1795953600000"},
}


def forged(payload: Any) -> str:
    raw = json.dumps(payload).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


@pytest.mark.parametrize(
    ("key", "state"),
    [
        (TABLE_KEY, None),
        (INDEX_KEY, "STARTED"),
        ({**INDEX_KEY, "desired_state": {"S": "STOPPED"}}, "STOPPED"),
        ({**INDEX_KEY, "lease_expires_at_ms": {"N": "0"}}, "STARTED"),
        ({"Pk": {"S": "CONN#" + "x" * 128}}, None),
        ({"Pk": {"S": "CONN#a.b_c:d-e"}}, None),
    ],
)
def test_round_trip(key: dict[str, Any], state: str | None) -> None:
    token = encode_token(key, state)
    assert len(token) <= MAX_TOKEN_CHARS
    assert all(c.isalnum() or c in "-_" for c in token)  # safe in a query string
    assert decode_token(token, state) == key


def test_a_token_is_bound_to_its_state_filter() -> None:
    started = encode_token(INDEX_KEY, "STARTED")
    unfiltered = encode_token(TABLE_KEY, None)
    for token, state in [(started, None), (started, "STOPPED"), (unfiltered, "STARTED")]:
        with pytest.raises(InvalidTokenError):
            decode_token(token, state)


@pytest.mark.parametrize(
    ("token", "state"),
    [
        ("", None),
        ("not a token", None),
        ("!!!!", None),
        ("bm90LWpzb24", None),  # "not-json"
        (forged([1, 2]), None),
        (forged("text"), None),
        (forged(None), None),
        (forged({"k": {"Pk": "CONN#feed-1"}}), "STARTED"),  # no state where one is expected
        (forged({"k": {"Pk": "CONN#feed-1"}, "s": "STOPPED"}), None),
        (forged({"k": "CONN#feed-1", "s": None}), None),
        (forged({"k": {}, "s": None}), None),
        (forged({"k": {"Pk": 7}, "s": None}), None),
        (forged({"k": {"Pk": True}, "s": None}), None),
        (forged({"k": {"Pk": "feed-1"}, "s": None}), None),  # missing prefix
        (forged({"k": {"Pk": "CONN#"}, "s": None}), None),  # empty id
        (forged({"k": {"Pk": "CONN#bad id"}, "s": None}), None),
        (forged({"k": {"Pk": "CONN#" + "x" * 129}, "s": None}), None),
        (forged({"k": {"Pk": "CONN#a", "extra": "x"}, "s": None}), None),
        (forged({"k": {"Other": "CONN#a"}, "s": None}), None),
        (forged({"k": {"Pk": {"S": "CONN#a"}}, "s": None}), None),  # typed, not plain
        (
            forged(
                {
                    "k": {"Pk": "CONN#a", "desired_state": "STARTED", "lease_expires_at_ms": "1"},
                    "s": "STARTED",
                }
            ),
            "STARTED",
        ),
        (
            forged(
                {
                    "k": {"Pk": "CONN#a", "desired_state": "STARTED", "lease_expires_at_ms": 1.5},
                    "s": "STARTED",
                }
            ),
            "STARTED",
        ),
        (
            forged(
                {
                    "k": {"Pk": "CONN#a", "desired_state": "STOPPED", "lease_expires_at_ms": 1},
                    "s": "STARTED",
                }
            ),
            "STARTED",
        ),
        (forged({"k": {"Pk": "CONN#a"}, "s": None}) + "x" * MAX_TOKEN_CHARS, None),
    ],
)
def test_tampered_tokens_are_refused(token: str, state: str | None) -> None:
    with pytest.raises(InvalidTokenError):
        decode_token(token, state)


def test_flipping_any_character_never_yields_a_bad_key() -> None:
    token = encode_token(INDEX_KEY, "STARTED")
    alphabet = "AZaz09-_"
    for i in range(len(token)):
        for replacement in alphabet:
            if replacement == token[i]:
                continue
            tampered = token[:i] + replacement + token[i + 1 :]
            try:
                key = decode_token(tampered, "STARTED")
            except InvalidTokenError:
                continue
            # Whatever decodes is still a well-formed key of this listing.
            assert set(key) == set(INDEX_KEY)
            assert key["desired_state"] == {"S": "STARTED"}
            assert key["Pk"]["S"].startswith("CONN#")
