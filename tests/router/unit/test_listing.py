"""Paging tokens: opaque, bound to the listing that issued them, and impossible to
turn into a malformed DynamoDB request."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from lambdas.router.listing import (
    MAX_TOKEN_CHARS,
    SCAN_CALLS_PER_PAGE,
    InvalidTokenError,
    decode_token,
    encode_token,
    list_connections,
)

TABLE_KEY = {"Pk": {"S": "CONN#feed-1"}, "Sk": {"S": "CONN"}}
INDEX_KEY = {"Pk": {"S": "CONN#feed-1"}, "Sk": {"S": "CONN"}, "desired_state": {"S": "STARTED"}}
SESSION_KEY = {"Pk": {"S": "SESSIONS#2"}, "Sk": {"S": "worker-7#3"}}
PAGE_KEY = {"Pk": {"S": "PAGE#worker-7#3"}, "Sk": {"S": "PAGE"}}


def from_typed(key: dict[str, Any]) -> dict[str, str]:
    return {name: value["S"] for name, value in key.items()}


def forged(payload: Any) -> str:
    raw = json.dumps(payload).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


@pytest.mark.parametrize(
    ("key", "state"),
    [
        (TABLE_KEY, None),
        (INDEX_KEY, "STARTED"),
        ({**INDEX_KEY, "desired_state": {"S": "STOPPED"}}, "STOPPED"),
        ({"Pk": {"S": "CONN#" + "x" * 128}, "Sk": {"S": "CONN"}}, None),
        ({"Pk": {"S": "CONN#a.b_c:d-e"}, "Sk": {"S": "CONN"}}, None),
        # A scan skips sessions and pages, but may stop at one.
        (SESSION_KEY, None),
        ({"Pk": {"S": "SESSIONS#0"}, "Sk": {"S": "w#1"}}, None),
        (PAGE_KEY, None),
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
        (forged({"k": {"Pk": "CONN#feed-1", "Sk": "CONN"}}), "STARTED"),  # no state given
        (forged({"k": {"Pk": "CONN#feed-1", "Sk": "CONN"}, "s": "STOPPED"}), None),
        (forged({"k": "CONN#feed-1", "s": None}), None),
        (forged({"k": {}, "s": None}), None),
        (forged({"k": {"Pk": "CONN#a"}, "s": None}), None),  # no sort key (an old token)
        (forged({"k": {"Pk": 7, "Sk": "CONN"}, "s": None}), None),
        (forged({"k": {"Pk": True, "Sk": "CONN"}, "s": None}), None),
        (forged({"k": {"Pk": "CONN#a", "Sk": 1}, "s": None}), None),
        (forged({"k": {"Pk": "feed-1", "Sk": "CONN"}, "s": None}), None),  # missing prefix
        (forged({"k": {"Pk": "CONN#", "Sk": "CONN"}, "s": None}), None),  # empty id
        (forged({"k": {"Pk": "CONN#bad id", "Sk": "CONN"}, "s": None}), None),
        (forged({"k": {"Pk": "CONN#" + "x" * 129, "Sk": "CONN"}, "s": None}), None),
        (forged({"k": {"Pk": "CONN#a", "Sk": "PAGE"}, "s": None}), None),
        (forged({"k": {"Pk": "CONN#a", "Sk": "CONN", "extra": "x"}, "s": None}), None),
        (forged({"k": {"Other": "CONN#a", "Sk": "CONN"}, "s": None}), None),
        (forged({"k": {"Pk": {"S": "CONN#a"}, "Sk": {"S": "CONN"}}, "s": None}), None),  # typed
        (forged({"k": {"Pk": "SESSIONS#9", "Sk": "w#1"}, "s": None}), None),  # no such shard
        (forged({"k": {"Pk": "SESSIONS#1", "Sk": ""}, "s": None}), None),
        (forged({"k": {"Pk": "SESSIONS#1", "Sk": "x" * 1025}, "s": None}), None),  # too long
        (forged({"k": {"Pk": "SESSIONS#1", "Sk": "\ud800"}, "s": None}), None),  # not Unicode
        (forged({"k": {"Pk": "PAGE#", "Sk": "PAGE"}, "s": None}), None),
        (forged({"k": {"Pk": "PAGE#w#1", "Sk": "CONN"}, "s": None}), None),
        (forged({"k": {"Pk": "OTHER#x", "Sk": "CONN"}, "s": None}), None),
        # Sessions and pages are never in the index: only connection keys are.
        (
            forged({"k": {**from_typed(SESSION_KEY), "desired_state": "STARTED"}, "s": "STARTED"}),
            "STARTED",
        ),
        (
            forged({"k": {**from_typed(PAGE_KEY), "desired_state": "STARTED"}, "s": "STARTED"}),
            "STARTED",
        ),
        (
            forged(  # the index key before sessions: its sort key was the lease expiry
                {
                    "k": {"Pk": "CONN#a", "desired_state": "STARTED", "lease_expires_at_ms": 1},
                    "s": "STARTED",
                }
            ),
            "STARTED",
        ),
        (
            forged(
                {
                    "k": {"Pk": "CONN#a", "Sk": "CONN", "desired_state": "STOPPED"},
                    "s": "STARTED",
                }
            ),
            "STARTED",
        ),
        (forged({"k": {"Pk": "CONN#a", "Sk": "CONN"}, "s": None}) + "x" * MAX_TOKEN_CHARS, None),
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
            assert key["Sk"] == {"S": "CONN"}


class ScanningTable:
    """A table that scans like DynamoDB: items in a fixed order, ``Limit`` counting the
    items evaluated (filtered ones included), ``LastEvaluatedKey`` the last evaluated."""

    def __init__(self, keys: list[tuple[str, str]]) -> None:
        self.items = [{"Pk": {"S": pk}, "Sk": {"S": sk}} for pk, sk in keys]
        self.limits: list[int] = []

    def scan(self, **args: Any) -> dict[str, Any]:
        assert args["FilterExpression"] == "#sk = :connection AND begins_with(#pk, :prefix)"
        assert args["ExpressionAttributeNames"] == {"#sk": "Sk", "#pk": "Pk"}
        assert args["ExpressionAttributeValues"] == {
            ":connection": {"S": "CONN"},
            ":prefix": {"S": "CONN#"},
        }
        self.limits.append(args["Limit"])
        start = args.get("ExclusiveStartKey")
        at = 0 if start is None else self.items.index(start) + 1
        evaluated = self.items[at : at + args["Limit"]]
        page: dict[str, Any] = {
            "Items": [
                i for i in evaluated if i["Sk"]["S"] == "CONN" and i["Pk"]["S"].startswith("CONN#")
            ]
        }
        if at + args["Limit"] < len(self.items):
            page["LastEvaluatedKey"] = evaluated[-1]
        return page


def conn(n: int) -> tuple[str, str]:
    return (f"CONN#c{n}", "CONN")


def listed(table: ScanningTable, limit: int) -> tuple[list[list[str]], list[dict[str, str]]]:
    """Every page of an unfiltered listing, and the keys its tokens stood for."""
    pages: list[list[str]] = []
    keys: list[dict[str, str]] = []
    token: str | None = None
    for _ in range(100):
        page = list_connections(table, "t", state=None, limit=limit, next_token=token)  # type: ignore[arg-type]
        pages.append([item.connection_id for item in page.items])
        token = page.next_token
        if token is None:
            return pages, keys
        keys.append(from_typed(decode_token(token, None)))
    raise AssertionError("the listing does not end")


def test_a_scan_fills_a_page_past_sessions_and_pages_without_overflowing_it() -> None:
    table = ScanningTable(
        [conn(1), ("SESSIONS#0", "w#1"), conn(2), ("PAGE#w#1", "PAGE"), conn(3), conn(4), conn(5)]
    )
    pages, keys = listed(table, 3)
    assert pages == [["c1", "c2", "c3"], ["c4", "c5"]]
    assert table.limits == [3, 1, 1, 3]  # each call asks only for what the page lacks
    assert keys == [{"Pk": "CONN#c3", "Sk": "CONN"}]


def test_a_run_of_sessions_ends_a_page_early_at_a_session_key_and_loses_nothing() -> None:
    sessions = [(f"SESSIONS#{n % 4}", f"w-{n}#1") for n in range(SCAN_CALLS_PER_PAGE + 2)]
    table = ScanningTable([conn(1), *sessions, conn(2)])
    pages, keys = listed(table, 2)
    assert pages[0] == ["c1"]  # short: the scan calls of one page ran out among sessions
    # The first call evaluated c1 and one session, each later call one more session.
    assert keys[0] == dict(zip(("Pk", "Sk"), sessions[SCAN_CALLS_PER_PAGE - 1], strict=True))
    assert [cid for page in pages for cid in page] == ["c1", "c2"]
    assert all(len(page) <= 2 for page in pages)
