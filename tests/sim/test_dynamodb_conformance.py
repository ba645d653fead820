"""The simulated DynamoDB (sim/dynamodb.py) answers as DynamoDB Local does.

Each case is a short sequence of client calls on the project's own table (created by
``local_stack.resources.create_connection_table`` on both). It runs once against
DynamoDB Local and once against the engine, through :class:`SimDynamoDBClient`; the
answers are compared call by call, then the tables item by item:

- a response without ``ResponseMetadata`` and ``ConsumedCapacity`` (DynamoDB Local
  adds it to some answers unasked), exactly: items, ``Count``, ``ScannedCount``,
  ``LastEvaluatedKey``, ``Attributes``;
- an error by its class (``ConditionalCheckFailedException``, or ``ClientError`` where
  botocore models none), code, message (whitespace aside) and everything else in
  ``error.response``: ``Item`` after a failed condition, ``CancellationReasons`` with
  their ``Item`` and the ``Message`` of a cancelled transaction;
- a scan's items in any order: DynamoDB visits partitions by a hash of their key, and
  the engine's hash is not DynamoDB Local's. Its pages must have the same sizes.

Then the shipped stores (lease, session, desired state, the router's listing) run the
same script on both, and what each call returned and the tables left must be equal.

DynamoDB Local differs from DynamoDB in a few places the engine follows DynamoDB in
(docs/TESTING.md, "The simulated DynamoDB"), and the cases stay clear of them:
numbers written by an update or nested in a list or map are stored as written, not in
canonical form; two operations on one item in a transaction with conditions are
reported as a failed condition rather than refused.
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from botocore.exceptions import ClientError

from lambdas.router.listing import list_connections
from local_stack.fleet import scan_raw
from local_stack.resources import create_connection_table
from sim.dynamodb import DynamoDBEngine, SimDynamoDBClient
from tests.support.stores import STORE_TIMING, T0, URL
from wsfleet import schema
from wsfleet.checkpoint_page import PageEntry
from wsfleet.desired_state import DesiredStateStore
from wsfleet.item import to_attribute
from wsfleet.lease_store import LeaseStore
from wsfleet.session_store import SessionStore

TABLE = "<table>"
"""Stands for the table's name in a case; each run has a table of its own."""


@dataclass(frozen=True)
class Call:
    operation: str
    params: dict[str, Any]
    unordered: bool = False
    """A scan: items in any order; only whether there is a LastEvaluatedKey counts."""
    pages: bool = False
    """Follow LastEvaluatedKey to the end and compare every page."""


def c(operation: str, *, unordered: bool = False, pages: bool = False, **params: Any) -> Call:
    return Call(operation, params, unordered, pages)


def key(cid: str) -> dict[str, Any]:
    return {"Pk": {"S": f"CONN#{cid}"}, "Sk": {"S": "CONN"}}


def typed(**attributes: Any) -> dict[str, Any]:
    return {name: to_attribute(value) for name, value in attributes.items()}


def conn(cid: str, **attributes: Any) -> dict[str, Any]:
    return {**key(cid), **typed(**attributes)}


def put(item: dict[str, Any], **params: Any) -> Call:
    return c("put_item", TableName=TABLE, Item=item, **params)


def get(k: dict[str, Any], **params: Any) -> Call:
    return c("get_item", TableName=TABLE, Key=k, ConsistentRead=True, **params)


def update(k: dict[str, Any], expression: str | None, names=None, values=None, **params) -> Call:
    args: dict[str, Any] = {"TableName": TABLE, "Key": k, **params}
    if expression is not None:
        args["UpdateExpression"] = expression
    if names is not None:
        args["ExpressionAttributeNames"] = names
    if values is not None:
        args["ExpressionAttributeValues"] = values
    return Call("update_item", args)


def query(index: str | None, condition: str, names, values, **params) -> Call:
    args: dict[str, Any] = {
        "TableName": TABLE,
        "KeyConditionExpression": condition,
        "ExpressionAttributeNames": names,
        "ExpressionAttributeValues": values,
        **params,
    }
    if index is not None:
        args["IndexName"] = index
    return Call("query", args)


def paged(call: Call) -> Call:
    return Call(call.operation, call.params, call.unordered, pages=True)


N1 = {":v": {"N": "1"}}
A = {"#a": "a"}


# --- the cases -------------------------------------------------------------------------------


def items_and_reads() -> list[Call]:
    item = {
        **key("a"),
        "desired_state": {"S": "STARTED"},
        "last_seq": {"N": "007"},
        "ratio": {"N": "1.50"},
        "big": {"N": "1e3"},
        "zero": {"N": "-0"},
        "blob": {"B": b"\x00\xff"},
        "tags": {"SS": ["z", "a", "m"]},
        "nums": {"NS": ["10", "9", "-1", "0.5"]},
        "blobs": {"BS": [b"b", b"a"]},
        "flag": {"BOOL": True},
        "nothing": {"NULL": True},
        "listing": {"L": [{"S": "x"}, {"N": "1"}, {"NULL": True}]},
        "meta": {"M": {"k": {"S": "v"}, "n": {"N": "2"}, "s": {"SS": ["b", "a"]}}},
        "empty": {"S": ""},
    }
    return [
        put(item),
        get(key("a")),
        c("get_item", TableName=TABLE, Key=key("a")),
        get(
            key("a"),
            ProjectionExpression="#t, #s, #gone",
            ExpressionAttributeNames={"#t": "tags", "#s": "last_seq", "#gone": "gone"},
        ),
        get(key("a"), ProjectionExpression="#gone", ExpressionAttributeNames={"#gone": "gone"}),
        get(key("b")),
        put(conn("a", n=1), ReturnValues="ALL_OLD"),
        put(conn("a", n=2), ReturnValues="ALL_NEW"),
        get(key("a")),
    ]


def conditional_puts() -> list[Call]:
    absent = {"ConditionExpression": "attribute_not_exists(#pk)"}
    pk = {"ExpressionAttributeNames": {"#pk": "Pk"}}
    return [
        put(conn("a", n=1), **absent, **pk),
        put(conn("a", n=2), **absent, **pk, ReturnValuesOnConditionCheckFailure="ALL_OLD"),
        put(conn("a", n=2), **absent, **pk),
        put(conn("a", n=3), **absent, **pk, ReturnValuesOnConditionCheckFailure="NONE"),
        put(
            conn("b", n=1),
            ConditionExpression="#n = :v",
            ExpressionAttributeNames={"#n": "n"},
            ExpressionAttributeValues=N1,
            ReturnValuesOnConditionCheckFailure="ALL_OLD",
        ),
        put(
            conn("a", n=5),
            ConditionExpression="#n = :v",
            ExpressionAttributeNames={"#n": "n"},
            ExpressionAttributeValues=N1,
            ReturnValues="ALL_OLD",
        ),
        get(key("a")),
    ]


def update_return_values() -> list[Call]:
    names = {"#x": "x", "#y": "y"}
    return [
        update(key("a"), "SET #x = :v", {"#x": "x"}, N1, ReturnValues="ALL_OLD"),
        update(
            key("a"), "SET #y = :v", {"#y": "y"}, {":v": {"S": "s"}}, ReturnValues="UPDATED_NEW"
        ),
        update(
            key("a"), "SET #x = :v REMOVE #y", names, {":v": {"N": "2"}}, ReturnValues="UPDATED_OLD"
        ),
        update(key("a"), "REMOVE #y", {"#y": "y"}, ReturnValues="UPDATED_NEW"),
        update(key("a"), "REMOVE #y", {"#y": "y"}, ReturnValues="UPDATED_OLD"),
        update(key("a"), "SET #y = :v", {"#y": "y"}, N1, ReturnValues="ALL_NEW"),
        update(key("a"), "SET #y = :v", {"#y": "y"}, N1, ReturnValues="NONE"),
        update(key("a"), "SET #y = :v", {"#y": "y"}, N1),
        update(key("b"), "REMOVE #z", {"#z": "z"}, ReturnValues="ALL_NEW"),
        update(key("a"), "SET #y = :v", {"#y": "y"}, N1, ReturnValues="BOGUS"),
        update(
            key("a"),
            "SET #y = :v",
            {"#y": "y"},
            N1,
            ConditionExpression="#y = :v",
            ReturnValuesOnConditionCheckFailure="ALL_NEW",
        ),
        get(key("a")),
        get(key("b")),
    ]


def update_actions() -> list[Call]:
    names = {"#n": "n", "#m": "m", "#s": "s", "#ns": "ns", "#c": "c"}
    return [
        put(
            {
                **key("a"),
                "n": {"N": "5"},
                "s": {"SS": ["p", "q"]},
                "ns": {"NS": ["1", "2"]},
                "b": {"S": "xyz"},
                "l": {"L": [{"S": "x"}]},
            }
        ),
        update(
            key("a"),
            "SET #n = #n + :one, #m = if_not_exists(#m, :zero) ADD #s :more, #c :one "
            "DELETE #ns :two",
            names,
            {
                ":one": {"N": "1"},
                ":zero": {"N": "0"},
                ":more": {"SS": ["r", "a"]},
                ":two": {"NS": ["2"]},
            },
            ReturnValues="ALL_NEW",
        ),
        update(
            key("a"),
            "SET #n = :ten - #n, #m = if_not_exists(#m, :one)",
            {"#n": "n", "#m": "m"},
            {":ten": {"N": "10"}, ":one": {"N": "1"}},
            ReturnValues="UPDATED_NEW",
        ),
        update(
            key("a"),
            "DELETE #s :all",
            {"#s": "s"},
            {":all": {"SS": ["a", "p", "q", "r"]}},
            ReturnValues="ALL_NEW",
        ),
        update(
            key("a"),
            "ADD #s :v",
            {"#s": "s"},
            {":v": {"SS": ["z", "b"]}},
            ReturnValues="UPDATED_NEW",
        ),
        update(
            key("a"),
            "ADD #ns :v",
            {"#ns": "ns"},
            {":v": {"NS": ["10", "9", "-3"]}},
            ReturnValues="UPDATED_NEW",
        ),
        update(
            key("a"),
            "ADD #bs :v",
            {"#bs": "bs"},
            {":v": {"BS": [b"y", b"x"]}},
            ReturnValues="UPDATED_NEW",
        ),
        update(key("a"), "ADD #n :v", {"#n": "n"}, {":v": {"N": "-7"}}, ReturnValues="UPDATED_NEW"),
        update(
            key("a"),
            "SET #l = list_append(#l, :more)",
            {"#l": "l"},
            {":more": {"L": [{"S": "y"}]}},
            ReturnValues="UPDATED_NEW",
        ),
        update(
            key("a"),
            "SET #c = :v",
            {"#c": "c", "#b": "b", "#s": "s", "#n": "n"},
            {
                ":v": {"N": "9"},
                ":p": {"S": "xy"},
                ":m": {"S": "z"},
                ":three": {"N": "3"},
                ":lo": {"N": "-5"},
                ":hi": {"N": "9"},
                ":x": {"N": "-2"},
            },
            ConditionExpression="begins_with(#b, :p) AND contains(#s, :m) AND size(#b) = :three "
            "AND #n BETWEEN :lo AND :hi AND #n IN (:lo, :x) AND NOT #c > :v",
            ReturnValues="UPDATED_OLD",
        ),
        update(
            key("a"),
            "SET #c = :v",
            {"#c": "c", "#b": "b"},
            {":v": {"N": "9"}, ":p": {"S": "y"}},
            ConditionExpression="begins_with(#b, :p) or contains(#b, :p) and #c <> :v",
            ReturnValuesOnConditionCheckFailure="ALL_OLD",
        ),
        update(
            key("a"),
            "SET #c = :v",
            {"#c": "c", "#nope": "nope"},
            {":v": {"N": "9"}, ":t": {"S": "N"}},
            ConditionExpression="attribute_type(#c, :t) AND #nope <> :v AND NOT #nope = :v",
        ),
        get(key("a")),
    ]


def lease_like_conditions() -> list[Call]:
    take = {
        "UpdateExpression": "SET #owner = :me REMOVE #free ADD #epoch :one",
        "ConditionExpression": "#state = :started AND attribute_not_exists(#owner)",
        "ExpressionAttributeNames": {
            "#owner": "lease_owner",
            "#free": "free_shard",
            "#epoch": "lease_epoch",
            "#state": "desired_state",
        },
        "ExpressionAttributeValues": {
            ":me": {"S": "w1"},
            ":one": {"N": "1"},
            ":started": {"S": "STARTED"},
        },
        "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
    }
    return [
        put(conn("a", desired_state="STARTED", free_shard="FREE#1", lease_epoch=0)),
        c("update_item", TableName=TABLE, Key=key("a"), ReturnValues="ALL_OLD", **take),
        c("update_item", TableName=TABLE, Key=key("a"), ReturnValues="ALL_OLD", **take),
        c("update_item", TableName=TABLE, Key=key("gone"), **take),
        update(
            key("a"),
            "SET #x = #missing",
            {"#x": "x", "#missing": "missing", "#owner": "lease_owner"},
            ConditionExpression="attribute_not_exists(#owner)",
        ),
        update(
            key("a"),
            "ADD #owner :v",
            {"#owner": "lease_owner"},
            N1,
            ConditionExpression="attribute_not_exists(#owner)",
        ),
        get(key("a")),
    ]


def deletes() -> list[Call]:
    exists = {
        "ConditionExpression": "attribute_exists(#pk)",
        "ExpressionAttributeNames": {"#pk": "Pk"},
    }
    return [
        put(conn("a", n=1)),
        c(
            "delete_item",
            TableName=TABLE,
            Key=key("a"),
            ConditionExpression="#n = :v",
            ExpressionAttributeNames={"#n": "n"},
            ExpressionAttributeValues={":v": {"N": "2"}},
            ReturnValuesOnConditionCheckFailure="ALL_OLD",
        ),
        c("delete_item", TableName=TABLE, Key=key("a"), ReturnValues="ALL_OLD", **exists),
        c("delete_item", TableName=TABLE, Key=key("a"), ReturnValues="ALL_OLD"),
        c(
            "delete_item",
            TableName=TABLE,
            Key=key("a"),
            ReturnValuesOnConditionCheckFailure="ALL_OLD",
            **exists,
        ),
        c("delete_item", TableName=TABLE, Key=key("a"), ReturnValues="ALL_NEW"),
        get(key("a")),
    ]


def expression_errors() -> list[Call]:
    def u(expression, names=A, values=N1, **params):
        return update(key("a"), expression, names, values, **params)

    return [
        put(conn("a", a=5, b="xyz", s={"p"})),
        u("SET #a = :v", {"#a": "a", "#b": "b"}),
        u("SET #a = :v", A, {**N1, ":x": {"N": "1"}, ":w": {"N": "2"}}),
        u("SET #a = :w"),
        u("SET #x = :v"),
        u("SET #a = :v, #a = :v"),
        u("SET #a = :v REMOVE #a"),
        u("SET #a = :v SET #b = :v", {"#a": "a", "#b": "b"}),
        u("REMOVE #a REMOVE #b", {"#a": "a", "#b": "b"}, None),
        u("SET #k = :v", {"#k": "Pk"}, {":v": {"S": "x"}}),
        u("REMOVE #k", {"#k": "Sk"}, None),
        u("SET #a = :v", A, N1, ConditionExpression="#a = :v :v"),
        u("SET #a = :v", A, N1, ConditionExpression="#a := :v"),
        u("PUT #a = :v"),
        u("SET #a = :v", A, N1, ConditionExpression="#a = "),
        u("SET #a = :v,"),
        u("", None, None),
        u("SET #a = #c", {"#a": "a", "#c": "c"}, None),
        u("SET #a = #c + :v", {"#a": "a", "#c": "c"}),
        u("ADD #b :v", {"#b": "b"}),
        u("ADD #s :v", {"#s": "s"}, {":v": {"SS": ["a", "a"]}}),
        u("ADD #s :v", {"#s": "s"}, {":v": {"S": "a"}}),
        u("DELETE #s :v", {"#s": "s"}, {":v": {"NS": ["1"]}}),
        u("DELETE #b :v", {"#b": "b"}, {":v": {"SS": ["1"]}}),
        u("SET #a = #a - :v", A, {":v": {"S": "1"}}),
        u("SET #a = :v", {}),
        u("SET #a = :v", A, {}),
        u("SET #a = :v", {"#a": "a", "b": "b"}),
        u("SET #a = :v", A, {**N1, "w": {"N": "1"}}),
        u(
            "SET #a = :v",
            {"#a": "a", "#s": "s"},
            {":v": {"SS": ["x"]}},
            ConditionExpression="#s < :v",
        ),
        u(
            "SET #a = :v",
            A,
            {**N1, ":hi": {"N": "9"}},
            ConditionExpression="#a BETWEEN :hi AND :v",
        ),
        u("SET #a = :v", A, N1, ConditionExpression="attribute_exists(:v)"),
        u("SET #a = :v", A, N1, ConditionExpression="begins_with(#a, :v)"),
        u("SET #a = size(#a)", A, None),
        u("SET #a = :v", A, {**N1, ":t": {"S": "Q"}}, ConditionExpression="attribute_type(#a, :t)"),
        u("SET #a = :v", A, {":v": {"N": "abc"}}),
        u("SET #a = :v", A, {":v": {"N": "1e200"}}),
        u("SET #a = :v", A, {":v": {"N": "1.00000000000000000000000000000000000000001"}}),
        u("SET #a = :v", A, {":v": {"SS": []}}),
        u("SET #a = :v", A, {":v": {"NS": ["1", "1.0"]}}),
        u("SET #a = :v", A, {**N1, ":e": {}}),
        u("SET #a = :v", A, {":v": {"S": "6", "N": "1"}}),
        u("SET #a = :v", A, {":v": {"NULL": False}}),
        put(conn("b", x=1), ExpressionAttributeNames=A),
        get(key("a"), ProjectionExpression="#v"),
        get(key("a"), ProjectionExpression="#a, #a", ExpressionAttributeNames=A),
        get(key("a")),
    ]


def key_errors() -> list[Call]:
    return [
        get({"Pk": {"S": "CONN#a"}}),
        get({**key("a"), "z": {"S": "x"}}),
        get({"Pk": {"S": "CONN#a"}, "Zk": {"S": "CONN"}}),
        get({"Pk": {"N": "1"}, "Sk": {"S": "CONN"}}),
        get({"Pk": {"S": ""}, "Sk": {"S": "CONN"}}),
        get({"Pk": {"S": "x" * 2049}, "Sk": {"S": "CONN"}}),
        put({"Pk": {"S": "CONN#a"}}),
        put({"Pk": {"N": "1"}, "Sk": {"S": "CONN"}}),
        put({"Pk": {"S": "x"}, "Sk": {"S": "a" * 1025}}),
        put({**key("a"), "owner_key": {"N": "1"}}),
        put({**key("a"), "owner_key": {"S": ""}}),
        put({**key("a"), "owner_key": {"S": "o" * 2049}}),
        put({**key("a"), "x": {"SS": ["a", "a"]}}),
        put({**key("a"), "x": {"NS": []}}),
        put({**key("a"), "x": {"BS": [b"a", b"a"]}}),
        put({**key("a"), "x": {"N": "1e-131"}}),
        put({**key("a"), "x": {"N": " 1"}}),
        put({**key("a"), "big": {"S": "o" * 409_600}}),
        put({**key("a"), "big": {"S": "o" * 409_590}}),
        update(key("a"), "SET #o = :v", {"#o": "owner_key"}, N1),
        update(key("a"), "SET #o = :v", {"#o": "owner_key"}, {":v": {"S": ""}}),
        update(key("a"), "ADD #o :v", {"#o": "free_shard"}, N1),
        update({"Pk": {"S": ""}, "Sk": {"S": "CONN"}}, "SET #o = :v", {"#o": "x"}, N1),
        c("get_item", TableName="no-such-table", Key=key("a")),
        c("put_item", TableName="no-such-table", Item=key("a")),
        c("batch_get_item", RequestItems={"no-such-table": {"Keys": [key("a")]}}),
        c(
            "query",
            TableName="no-such-table",
            KeyConditionExpression="#p = :p",
            ExpressionAttributeNames={"#p": "Pk"},
            ExpressionAttributeValues={":p": {"S": "x"}},
        ),
    ]


def _counter(cid: str, amount: str = "1", **body: Any) -> dict[str, Any]:
    return {
        "Update": {
            "TableName": TABLE,
            "Key": key(cid),
            "UpdateExpression": "ADD #n :v",
            "ExpressionAttributeNames": {"#n": "n"},
            "ExpressionAttributeValues": {":v": {"N": amount}},
            **body,
        }
    }


def _set_if(cid: str, expected: str, **body: Any) -> dict[str, Any]:
    return {
        "Update": {
            "TableName": TABLE,
            "Key": key(cid),
            "UpdateExpression": "SET #n = :two",
            "ConditionExpression": "#n = :one",
            "ExpressionAttributeNames": {"#n": "n"},
            "ExpressionAttributeValues": {":two": {"N": "2"}, ":one": {"N": expected}},
            **body,
        }
    }


def transactions() -> list[Call]:
    def t(*actions: dict[str, Any], **params: Any) -> Call:
        return c("transact_write_items", TransactItems=list(actions), **params)

    absent = {
        "ConditionExpression": "attribute_not_exists(#p)",
        "ExpressionAttributeNames": {"#p": "Pk"},
    }
    exists = {
        "ConditionExpression": "attribute_exists(#p)",
        "ExpressionAttributeNames": {"#p": "Pk"},
    }
    old = {"ReturnValuesOnConditionCheckFailure": "ALL_OLD"}
    return [
        put(conn("a", n=1)),
        put(conn("b", n=1)),
        put(conn("c", n=1)),
        t(_set_if("a", "1"), _set_if("b", "1")),
        t(
            _set_if("a", "1"),
            _set_if("b", "1", **old),
            _set_if("c", "1"),
            _set_if("zz", "1", **old),
        ),
        get(key("c")),
        t({"ConditionCheck": {"TableName": TABLE, "Key": key("c"), **absent, **old}}),
        t({"ConditionCheck": {"TableName": TABLE, "Key": key("q"), **exists, **old}}),
        t(
            {"Put": {"TableName": TABLE, "Item": conn("d", n=1), **absent}},
            {"Delete": {"TableName": TABLE, "Key": key("a"), **exists, **old}},
            {"ConditionCheck": {"TableName": TABLE, "Key": key("b"), **exists}},
        ),
        t(
            {"Put": {"TableName": TABLE, "Item": conn("d", n=9), **absent, **old}},
            {"Delete": {"TableName": TABLE, "Key": key("a"), **exists, **old}},
        ),
        get(key("d")),
        t(_counter("c"), ClientRequestToken="token-1"),
        t(_counter("c"), ClientRequestToken="token-1"),
        get(key("c")),
        t(_counter("c", "2"), ClientRequestToken="token-1"),
        t(_counter("c"), _counter("b"), ClientRequestToken="token-1"),
        t(_set_if("c", "1"), ClientRequestToken="token-2"),
        put(conn("c", n=1)),
        t(_set_if("c", "1"), ClientRequestToken="token-2"),
        t(_set_if("c", "1"), ClientRequestToken="token-2"),
        get(key("c")),
        t(_counter("c"), _counter("c", "2")),
        t(
            {"Put": {"TableName": TABLE, "Item": conn("c", n=1)}},
            {"Put": {"TableName": TABLE, "Item": conn("c", n=2)}},
        ),
        t(_counter("b"), {"ConditionCheck": {"TableName": TABLE, "Key": key("b"), **exists}}),
        t(
            _counter("b"),
            {
                "Update": {
                    "TableName": TABLE,
                    "Key": key("c"),
                    "UpdateExpression": "ADD #n :s",
                    "ExpressionAttributeNames": {"#n": "n"},
                    "ExpressionAttributeValues": {":s": {"SS": ["x"]}},
                }
            },
        ),
        t(_set_if("b", "1", ConditionExpression="#n = :zz")),
        t({"ConditionCheck": {"TableName": "no-such-table", "Key": key("b"), **exists}}),
        get(key("b")),
    ]


def _connections() -> list[Call]:
    """Seven connections: w1 owns four (two owner shards), two wait in the unowned
    index, one is stopped; and a session item and a page beside them."""
    owned = {"desired_state": "STARTED", "lease_owner": "w1", "owner_session_gen": 1}
    return [
        put(conn("c1", **owned, owner_key="w1#1#0", ws_url="u1", last_seq=10, lease_epoch=1)),
        put(conn("c2", **owned, owner_key="w1#1#0", ws_url="u2", last_seq=20, lease_epoch=2)),
        put(conn("c3", **owned, owner_key="w1#1#1", ws_url="u3", last_seq=30, lease_epoch=3)),
        put(conn("c4", **owned, owner_key="w1#1#0", ws_url="u4", last_seq=40, lease_epoch=1)),
        put(conn("c5", desired_state="STARTED", free_shard="FREE#1", ws_url="u5")),
        put(conn("c6", desired_state="STARTED", free_shard="FREE#1", ws_url="u6")),
        put(conn("c7", desired_state="STOPPED", ws_url="u7", expires_at=99)),
        put({"Pk": {"S": "SESSIONS#1"}, "Sk": {"S": "w1#1"}, "state": {"S": "ALIVE"}}),
        put({"Pk": {"S": "PAGE#w1#1"}, "Sk": {"S": "PAGE"}, "written_at_ms": {"N": "5"}}),
    ]


def _by_owner(condition="#o = :o", names=None, values=None, **params) -> Call:
    return query(
        "by-owner",
        condition,
        {"#o": "owner_key", **(names or {})},
        {":o": {"S": "w1#1#0"}, **(values or {})},
        **params,
    )


def index_queries() -> list[Call]:
    p = {"#p": "Pk"}
    return [
        *_connections(),
        _by_owner(),
        paged(_by_owner(Limit=2)),
        paged(_by_owner(Limit=3)),
        _by_owner(Limit=1, ScanIndexForward=False),
        _by_owner(
            Limit=2,
            ScanIndexForward=False,
            ExclusiveStartKey={"owner_key": {"S": "w1#1#0"}, **key("c4")},
        ),
        _by_owner("#o = :o AND begins_with(#p, :p)", p, {":p": {"S": "CONN#c2"}}),
        _by_owner(
            "#o = :o AND #p BETWEEN :a AND :b", p, {":a": {"S": "CONN#c1"}, ":b": {"S": "CONN#c2"}}
        ),
        _by_owner("#p > :p AND #o = :o", p, {":p": {"S": "CONN#c1"}}),
        _by_owner("(#o = :o) AND (#p <= :p)", p, {":p": {"S": "CONN#c2"}}),
        _by_owner(":o = #o AND :p < #p", p, {":p": {"S": "CONN#c2"}}),
        _by_owner(Select="COUNT"),
        _by_owner(
            names={"#s": "last_seq"},
            values={":s": {"N": "15"}},
            FilterExpression="#s >= :s",
            Limit=2,
        ),
        _by_owner(names={"#s": "last_seq", "#e": "lease_epoch"}, ProjectionExpression="#s, #e"),
        _by_owner(names={"#u": "ws_url"}, ProjectionExpression="#u"),
        _by_owner(names={"#u": "ws_url"}, FilterExpression="attribute_exists(#u)"),
        _by_owner(Select="ALL_ATTRIBUTES"),
        _by_owner(ConsistentRead=True),
        _by_owner(ExclusiveStartKey=key("c1")),
        paged(
            query(
                "by-desired-state",
                "#s = :s",
                {"#s": "desired_state"},
                {":s": {"S": "STARTED"}},
                Limit=2,
            )
        ),
        query("by-desired-state", "#s = :s", {"#s": "desired_state"}, {":s": {"S": "STOPPED"}}),
        query("unowned", "#f = :f", {"#f": "free_shard"}, {":f": {"S": "FREE#1"}}),
        update(
            key("c5"),
            "SET #owner = :me, #okey = :okey REMOVE #free",
            {"#owner": "lease_owner", "#okey": "owner_key", "#free": "free_shard"},
            {":me": {"S": "w1"}, ":okey": {"S": "w1#1#0"}},
        ),
        query("unowned", "#f = :f", {"#f": "free_shard"}, {":f": {"S": "FREE#1"}}),
        _by_owner(),
        query("unowned", "#f = :f", {"#f": "free_shard"}, {":f": {"S": "FREE#2"}}),
        query("nope", "#f = :f", {"#f": "free_shard"}, {":f": {"S": "FREE#1"}}),
        query("unowned", "#p = :p", {"#p": "Pk"}, {":p": {"S": "x"}}),
        query("unowned", "#f = :f AND #f = :f", {"#f": "free_shard"}, {":f": {"S": "FREE#1"}}),
        query("unowned", "#f = :f OR #f = :f", {"#f": "free_shard"}, {":f": {"S": "FREE#1"}}),
        query("unowned", "#f <> :f", {"#f": "free_shard"}, {":f": {"S": "FREE#1"}}),
        query("unowned", "begins_with(#f, :f)", {"#f": "free_shard"}, {":f": {"S": "FREE"}}),
        query("unowned", "#f = :f", {"#f": "free_shard"}, {":f": {"N": "1"}}),
    ]


def table_queries() -> list[Call]:
    def session(sk: str, **attributes: Any) -> Call:
        return put({"Pk": {"S": "SESSIONS#1"}, "Sk": {"S": sk}, **typed(**attributes)})

    def q(condition: str = "#p = :p", values=None, **params: Any) -> Call:
        names = {"#p": "Pk"}
        if (
            "#s" in condition
            or "#s" in params.get("ProjectionExpression", "")
            or "#s" in params.get("FilterExpression", "")
        ):
            names["#s"] = "Sk"
        for extra in ("#st",):
            if extra in params.get("FilterExpression", "") + params.get("ProjectionExpression", ""):
                names[extra] = "state"
        return query(
            None, condition, names, {":p": {"S": "SESSIONS#1"}, **(values or {})}, **params
        )

    return [
        session("w#1", state="ALIVE"),
        session("w#0", state="DEAD"),
        session("a#0", state="ALIVE"),
        session("b#5", state="DEAD"),
        session("w#10", state="ALIVE"),
        put({"Pk": {"S": "SESSIONS#2"}, "Sk": {"S": "z#1"}}),
        q(),
        q(ScanIndexForward=False),
        q("#p = :p AND #s = :s", {":s": {"S": "w#0"}}),
        q("#p = :p AND #s < :s", {":s": {"S": "w#0"}}),
        q("#p = :p AND #s <= :s", {":s": {"S": "w#0"}}),
        q("#p = :p AND #s > :s", {":s": {"S": "w#0"}}),
        q("#p = :p AND #s >= :s", {":s": {"S": "w#0"}}),
        q("#p = :p AND #s BETWEEN :a AND :b", {":a": {"S": "b"}, ":b": {"S": "w#1"}}),
        q("#p = :p AND begins_with(#s, :s)", {":s": {"S": "w#1"}}),
        q("#p = :p AND begins_with(#s, :s)", {":s": {"S": "w#1"}}, ScanIndexForward=False),
        paged(q(Limit=2)),
        paged(q(Limit=1, ScanIndexForward=False)),
        paged(q(Limit=5)),
        q(Select="COUNT"),
        q(FilterExpression="#st = :st", values={":st": {"S": "DEAD"}}, Limit=3),
        q(ProjectionExpression="#s, #st"),
        q(ExclusiveStartKey={"Pk": {"S": "SESSIONS#1"}}),
        q(ExclusiveStartKey={"Pk": {"S": "SESSIONS#2"}, "Sk": {"S": "a"}}),
        q(
            "#p = :p AND #s = :s",
            {":s": {"S": "w#0"}},
            ExclusiveStartKey={"Pk": {"S": "SESSIONS#1"}, "Sk": {"S": "b"}},
        ),
        q("#p = :p AND #s > :s", {":s": {"N": "1"}}),
        q("#p = :p AND #s BETWEEN :a AND :b", {":a": {"S": "w"}, ":b": {"S": "b"}}),
        q("#s = :s", {":s": {"S": "w#0"}}),
        c("query", TableName=TABLE),
    ]


def batch_reads() -> list[Call]:
    def b(keys: list[dict[str, Any]], **request: Any) -> Call:
        return c("batch_get_item", RequestItems={TABLE: {"Keys": keys, **request}})

    return [
        put(conn("a", n=1, s="x")),
        put(conn("b", n=2, s="y")),
        put(conn("c", n=3, s="z")),
        b([key("c"), key("zz"), key("a")], ConsistentRead=True),
        b([key("zz")]),
        b([key("b")], ProjectionExpression="#n", ExpressionAttributeNames={"#n": "n"}),
        b([key("a"), key("a")]),
        b([key(str(n)) for n in range(101)], ConsistentRead=True),
        b([{"Pk": {"S": "x"}}]),
        c("batch_get_item", RequestItems={}),
    ]


def scans() -> list[Call]:
    connection_filter = {
        "FilterExpression": "#sk = :c AND begins_with(#pk, :p)",
        "ExpressionAttributeNames": {"#sk": "Sk", "#pk": "Pk"},
        "ExpressionAttributeValues": {":c": {"S": "CONN"}, ":p": {"S": "CONN#"}},
    }
    return [
        *_connections(),
        c("scan", unordered=True, TableName=TABLE),
        c("scan", unordered=True, pages=True, TableName=TABLE, Limit=3),
        c("scan", unordered=True, pages=True, TableName=TABLE, Limit=9),
        c("scan", unordered=True, pages=True, TableName=TABLE, Limit=4, **connection_filter),
        c("scan", TableName=TABLE, Select="COUNT", ConsistentRead=True),
        c(
            "scan",
            unordered=True,
            pages=True,
            TableName=TABLE,
            IndexName="by-desired-state",
            Limit=2,
        ),
        c("scan", unordered=True, TableName=TABLE, IndexName="by-owner"),
        c("scan", TableName=TABLE, IndexName="by-owner", ConsistentRead=True),
        c("scan", TableName=TABLE, ExclusiveStartKey={"Pk": {"S": "x"}}),
    ]


CASES: dict[str, Callable[[], list[Call]]] = {
    "items_and_reads": items_and_reads,
    "conditional_puts": conditional_puts,
    "update_return_values": update_return_values,
    "update_actions": update_actions,
    "lease_like_conditions": lease_like_conditions,
    "deletes": deletes,
    "expression_errors": expression_errors,
    "key_errors": key_errors,
    "transactions": transactions,
    "index_queries": index_queries,
    "table_queries": table_queries,
    "batch_reads": batch_reads,
    "scans": scans,
}


# --- running a case on a client --------------------------------------------------------------


def _with_table(value: Any, table: str) -> Any:
    if isinstance(value, dict):
        return {_with_table(k, table): _with_table(v, table) for k, v in value.items()}
    if isinstance(value, list):
        return [_with_table(v, table) for v in value]
    return table if value == TABLE else value


def _order(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=repr)


def _normalised(response: dict[str, Any], *, unordered: bool) -> dict[str, Any]:
    answer = {
        k: v for k, v in response.items() if k not in ("ResponseMetadata", "ConsumedCapacity")
    }
    if "Responses" in answer:
        answer["Responses"] = {
            t: sorted(items, key=_order) for t, items in answer["Responses"].items()
        }
    if unordered:
        if "Items" in answer:
            answer["Items"] = sorted(answer["Items"], key=_order)
        if "LastEvaluatedKey" in answer:
            answer["LastEvaluatedKey"] = "present"
    return answer


def _outcome(call: Callable[[], dict[str, Any]], *, unordered: bool) -> Any:
    try:
        response = call()
    except ClientError as error:
        details = {k: v for k, v in error.response.items() if k != "ResponseMetadata"}
        details["Error"] = {
            "Code": error.response["Error"]["Code"],
            "Message": re.sub(r"\s+", " ", error.response["Error"]["Message"]).strip(),
        }
        if "Message" in details:
            details["Message"] = re.sub(r"\s+", " ", details["Message"]).strip()
        return ("error", type(error).__name__, details)
    return ("ok", _normalised(response, unordered=unordered))


def _pages(client: Any, step: Call, params: dict[str, Any]) -> Any:
    pages = []
    while True:
        outcome = _outcome(lambda p=params: getattr(client, step.operation)(**p), unordered=False)
        if outcome[0] != "ok":
            pages.append(outcome)
            break
        page = outcome[1]
        pages.append(page)
        if "LastEvaluatedKey" not in page or len(pages) > 50:
            break
        params = {**params, "ExclusiveStartKey": page["LastEvaluatedKey"]}
    if not step.unordered:
        return ("pages", pages)
    items = sorted((i for p in pages for i in p.get("Items", [])), key=_order)
    return (
        "pages",
        len(pages),
        [p.get("ScannedCount") for p in pages],
        sum(p.get("Count", 0) for p in pages),
        items,
    )


def run_case(client: Any, table: str, steps: list[Call]) -> list[Any]:
    outcomes = []
    for step in steps:
        params = _with_table(step.params, table)
        if step.pages:
            outcomes.append((step.operation, _pages(client, step, params)))
        else:
            outcomes.append(
                (
                    step.operation,
                    _outcome(
                        lambda p=params, s=step: getattr(client, s.operation)(**p),
                        unordered=step.unordered,
                    ),
                )
            )
    return outcomes


def table_contents(client: Any, table: str) -> list[dict[str, Any]]:
    return sorted(scan_raw(client, table), key=lambda item: (item["Pk"]["S"], item["Sk"]["S"]))


@dataclass
class Simulated:
    engine: DynamoDBEngine = field(default_factory=DynamoDBEngine)
    ticks: Iterator[int] = field(default_factory=itertools.count)

    def client(self) -> SimDynamoDBClient:
        return SimDynamoDBClient(self.engine, now=lambda: next(self.ticks) * 0.001)


@pytest.fixture
def simulated(table) -> SimDynamoDBClient:
    """The engine, with a table of the same name and definition as the fixture's."""
    client = Simulated().client()
    create_connection_table(client, table)
    return client


def _differences(local: list[Any], simulated: list[Any], steps: list[Call]) -> list[str]:
    found = []
    for n, (want, got) in enumerate(zip(local, simulated, strict=True)):
        if want != got:
            found.append(
                f"call {n} {steps[n].operation} {_order(steps[n].params)[:300]}\n"
                f"  DynamoDB Local: {want!r}\n  engine:         {got!r}"
            )
    return found


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_engine_answers_as_dynamodb_local(case, ddb, table, simulated):
    steps = CASES[case]()
    local = run_case(ddb, table, steps)
    engine = run_case(simulated, table, steps)
    differences = _differences(local, engine, steps)
    assert not differences, "\n".join(differences)
    assert table_contents(simulated, table) == table_contents(ddb, table)


# --- the shipped stores on both --------------------------------------------------------------


def counting_tokens() -> Callable[[int], str]:
    """Lease tokens, transaction tokens and notice nonces that count up from the same
    start on each backend (the stores take their token source as an argument)."""
    counter = itertools.count()
    return lambda n=16: f"{next(counter):0{2 * n}x}"


def store_script(client: Any, table: str) -> list[Any]:
    """A life of a small fleet through the shipped stores: what each call returned."""
    tokens = counting_tokens()
    control = DesiredStateStore(client, table, tokens=tokens)
    store = LeaseStore(client, table, STORE_TIMING, tokens=tokens)
    sessions = SessionStore(client, table, STORE_TIMING)
    ids = [f"c{n}" for n in range(8)]
    out: list[Any] = [
        sessions.open("w1", 1, T0, capacity=10),
        sessions.open("w1", 1, T0, capacity=10),
    ]
    out.append(sessions.open("w2", 1, T0, capacity=10))
    out += [control.start(cid, URL, T0 + 1) for cid in ids]
    out.append(control.start("c0", URL, T0 + 1))
    out.append(control.start("c0", URL + "x", T0 + 1))
    out.append(sorted(store.find_unowned(schema.free_shards(), limit=100)))
    leases = [store.acquire(cid, "w1", 1, T0 + 2) for cid in ids[:6]]
    out += leases
    out.append(store.acquire("c0", "w2", 1, T0 + 2))
    out.append(store.acquire("nope", "w2", 1, T0 + 2))
    out.append(sorted(store.find_unowned(schema.free_shards(), limit=100)))
    out.append(sorted(i.connection_id for i in store.owned_by("w1", 1)))
    out.append(store.owned_page("w1#1#0", None, 1))
    out.append(control.stop("c1", T0 + 3))
    out.append(sessions.renew("w1", 1, T0 + 4, connections=6))
    renewed = sessions.renew("w1", 1, T0 + 5, connections=5, acted_on=["nothing"])
    out.append(renewed)
    out.append(store.release(leases[1], 7, T0 + 6))  # type: ignore[arg-type]
    out.append(store.release(leases[2], None, T0 + 6))  # type: ignore[arg-type]
    out.append(store.release(leases[2], None, T0 + 6))  # type: ignore[arg-type]
    out.append(store.park(leases[3], 9, "bad upstream", T0 + 7))  # type: ignore[arg-type]
    out.append(control.start("c3", URL, T0 + 8))
    out.append(store.record_failing_since(leases[4], T0 + 8, T0 + 8))  # type: ignore[arg-type]
    out.append(store.clear_failing_since(leases[4], T0 + 9))  # type: ignore[arg-type]
    entries = {
        cid: PageEntry(epoch=1, seq_gen=0, seq=n * 10, advanced_at_ms=T0)
        for n, cid in enumerate(ids)
    }
    out.append(sessions.write_page("w1", 1, entries, T0 + 10, 2))
    out.append(sessions.write_page("w1", 1, entries, T0 + 9, 1))
    out.append(sessions.read_page("w1", 1))
    lapsed = T0 + STORE_TIMING.lease_ms + 100
    w1 = sessions.get_session("w1", 1)
    assert w1 is not None
    out.append(sessions.reap(w1, "w2", lapsed))
    out.append(sessions.reap(w1, "w2", lapsed))
    out.append(sessions.renew("w1", 1, lapsed, connections=1))
    page = sessions.read_page("w1", 1)
    owned = store.owned_by("w1", 1)
    first, rest = owned[:1], owned[1:]
    out += [store.take_over(item, "w2", 1, page, lapsed + 1) for item in first]
    out.append(store.take_over_many(rest, "w2", 1, page, lapsed + 2, latency_ms=3))
    out.append(store.get_many(ids))
    out.append(sorted((s.worker_id, s.session_gen, s.state) for s in sessions.list_sessions()))
    dead = sessions.get_session("w1", 1)
    assert dead is not None
    out.append(sessions.notify("w2", 1, "c9 start 1 n"))
    out.append(sessions.offer("w2", 1, ["c8 offer 1 a", "c7 offer 1 b"]))
    out.append(sessions.retire("w2", 1, lapsed + 3))
    out.append(sessions.forget(dead))
    out.append(sessions.forget(dead))
    return out


def listing_script(client: Any, table: str) -> list[Any]:
    """The router's listing, every page, by state (a query) and of everything (a scan,
    whose pages may split differently: only their union is compared)."""
    out: list[Any] = []
    for state in (schema.STARTED, schema.STOPPED):
        token = None
        while True:
            page = list_connections(client, table, state=state, limit=3, next_token=token)
            out.append((state, [i.connection_id for i in page.items], page.next_token))
            token = page.next_token
            if token is None:
                break
    everything: list[str] = []
    token = None
    for _ in range(50):
        page = list_connections(client, table, state=None, limit=3, next_token=token)
        everything += [i.connection_id for i in page.items]
        token = page.next_token
        if token is None:
            break
    out.append(sorted(everything))
    return out


def test_the_shipped_stores_leave_the_same_tables(ddb, table, simulated):
    local = store_script(ddb, table)
    local += listing_script(ddb, table)
    engine = store_script(simulated, table)
    engine += listing_script(simulated, table)
    for n, (want, got) in enumerate(zip(local, engine, strict=True)):
        assert got == want, f"store call {n}"
    assert table_contents(simulated, table) == table_contents(ddb, table)
