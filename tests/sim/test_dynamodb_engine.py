"""The simulated DynamoDB on its own (no server): the eventual consistency faults,
the bounded history, transaction tokens over time, determinism, and the client
wrapper. What it answers is checked against DynamoDB Local in
test_dynamodb_conformance.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError, ParamValidationError

from local_stack.resources import create_connection_table
from sim import expressions
from sim.dynamodb import IDEMPOTENCY_WINDOW_S, DynamoDBEngine, SimDynamoDBClient

TABLE = "connections"
REPO = Path(__file__).resolve().parents[2]


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def key(cid: str) -> dict[str, Any]:
    return {"Pk": {"S": f"CONN#{cid}"}, "Sk": {"S": "CONN"}}


def session_key(sk: str) -> dict[str, Any]:
    return {"Pk": {"S": "SESSIONS#1"}, "Sk": {"S": sk}}


@pytest.fixture
def engine() -> DynamoDBEngine:
    engine = DynamoDBEngine(history_seconds=10.0)
    create_connection_table(SimDynamoDBClient(engine, now=lambda: 0.0), TABLE)
    return engine


def call(engine: DynamoDBEngine, operation: str, now: float, **params: Any) -> dict[str, Any]:
    faults = {k: params.pop(k) for k in ("stale_by", "index_lag") if k in params}
    return engine.call(operation, {"TableName": TABLE, **params}, now=now, **faults)


def put(engine: DynamoDBEngine, now: float, item: dict[str, Any]) -> None:
    call(engine, "put_item", now, Item=item)


def set_n(engine: DynamoDBEngine, now: float, k: dict[str, Any], n: int) -> None:
    call(
        engine,
        "update_item",
        now,
        Key=k,
        UpdateExpression="SET #n = :n",
        ExpressionAttributeNames={"#n": "n"},
        ExpressionAttributeValues={":n": {"N": str(n)}},
    )


def n_of(answer: dict[str, Any]) -> int | None:
    item = answer.get("Item")
    return None if item is None else int(item["n"]["N"])


def unowned(engine: DynamoDBEngine, now: float, lag: float, shard: str = "FREE#1") -> list[str]:
    answer = call(
        engine,
        "query",
        now,
        IndexName="unowned",
        KeyConditionExpression="#f = :f",
        ExpressionAttributeNames={"#f": "free_shard"},
        ExpressionAttributeValues={":f": {"S": shard}},
        index_lag=lag,
    )
    return [item["Pk"]["S"] for item in answer["Items"]]


# --- stale reads -----------------------------------------------------------------------------


def test_a_stale_read_answers_with_the_version_of_that_time_and_a_strong_one_with_the_latest(
    engine,
):
    put(engine, 1.0, {**key("a"), "n": {"N": "1"}})
    set_n(engine, 5.0, key("a"), 2)
    read = {"Key": key("a")}
    assert n_of(call(engine, "get_item", 6.0, **read, stale_by=3.0)) == 1  # as of 3.0
    assert n_of(call(engine, "get_item", 6.0, **read, stale_by=1.0)) == 2  # as of 5.0
    assert n_of(call(engine, "get_item", 6.0, **read, stale_by=0.5)) == 2
    assert n_of(call(engine, "get_item", 6.0, **read, ConsistentRead=True, stale_by=3.0)) == 2
    assert call(engine, "get_item", 6.0, **read, stale_by=5.5) == {}  # before it existed
    call(engine, "delete_item", 7.0, Key=key("a"))
    assert n_of(call(engine, "get_item", 7.5, **read, stale_by=1.0)) == 2  # still there at 6.5
    assert call(engine, "get_item", 7.5, **read, stale_by=0.4) == {}
    assert call(engine, "get_item", 7.5, **read) == {}


def test_a_stale_batch_read_table_query_and_scan(engine):
    put(engine, 1.0, {**key("a"), "n": {"N": "1"}})
    put(engine, 1.0, {**session_key("w#1"), "n": {"N": "1"}})
    set_n(engine, 4.0, key("a"), 2)
    put(engine, 4.0, {**session_key("w#2"), "n": {"N": "1"}})
    call(engine, "delete_item", 4.0, Key=session_key("w#1"))

    def batch(**request: Any) -> list[int]:
        answer = engine.call(
            "batch_get_item",
            {"RequestItems": {TABLE: {"Keys": [key("a")], **request}}},
            now=5.0,
            stale_by=2.0,
        )
        assert answer["UnprocessedKeys"] == {}
        return [int(i["n"]["N"]) for i in answer["Responses"][TABLE]]

    assert batch() == [1]
    assert batch(ConsistentRead=True) == [2]

    def sessions(**params: Any) -> list[str]:
        answer = call(
            engine,
            "query",
            5.0,
            KeyConditionExpression="#p = :p",
            ExpressionAttributeNames={"#p": "Pk"},
            ExpressionAttributeValues={":p": {"S": "SESSIONS#1"}},
            stale_by=2.0,
            **params,
        )
        return [i["Sk"]["S"] for i in answer["Items"]]

    assert sessions() == ["w#1"]  # as of 3.0: the first session only
    assert sessions(ConsistentRead=True) == ["w#2"]
    scanned = call(engine, "scan", 5.0, stale_by=2.0)["Items"]
    assert sorted((i["Pk"]["S"], i["Sk"]["S"], i["n"]["N"]) for i in scanned) == [
        ("CONN#a", "CONN", "1"),
        ("SESSIONS#1", "w#1", "1"),
    ]


# --- index lag -------------------------------------------------------------------------------


def test_a_lagged_index_misses_a_new_entry_and_shows_it_once_the_lag_has_passed(engine):
    put(
        engine, 10.0, {**key("a"), "desired_state": {"S": "STARTED"}, "free_shard": {"S": "FREE#1"}}
    )
    assert unowned(engine, 10.0, lag=0.0) == ["CONN#a"]  # no lag: the latest
    assert unowned(engine, 10.5, lag=1.0) == []
    assert unowned(engine, 11.0, lag=1.0) == ["CONN#a"]
    # Taken (out of the sparse index) at 12: a lagged index still lists it for a second.
    call(
        engine,
        "update_item",
        12.0,
        Key=key("a"),
        UpdateExpression="SET #o = :o REMOVE #f",
        ExpressionAttributeNames={"#o": "owner_key", "#f": "free_shard"},
        ExpressionAttributeValues={":o": {"S": "w1#1#0"}},
    )
    assert unowned(engine, 12.0, lag=0.0) == []
    assert unowned(engine, 12.5, lag=1.0) == ["CONN#a"]
    assert unowned(engine, 13.0, lag=1.0) == []


def test_a_lagged_index_answers_with_the_items_as_they_were(engine):
    """An entry of a lagged INCLUDE index carries the projected attributes of then,
    in index order, paged as usual."""
    for n, cid in enumerate(["c", "a", "b"]):
        put(
            engine,
            1.0,
            {**key(cid), "owner_key": {"S": "w1#1#0"}, "last_seq": {"N": str(n)}},
        )
    call(
        engine,
        "update_item",
        5.0,
        Key=key("a"),
        UpdateExpression="SET #s = :s",
        ExpressionAttributeNames={"#s": "last_seq"},
        ExpressionAttributeValues={":s": {"N": "99"}},
    )
    put(engine, 5.0, {**key("d"), "owner_key": {"S": "w1#1#0"}, "last_seq": {"N": "7"}})

    def page(lag: float, start: dict[str, Any] | None = None) -> dict[str, Any]:
        params: dict[str, Any] = {
            "IndexName": "by-owner",
            "KeyConditionExpression": "#o = :o",
            "ExpressionAttributeNames": {"#o": "owner_key"},
            "ExpressionAttributeValues": {":o": {"S": "w1#1#0"}},
            "Limit": 2,
            "index_lag": lag,
        }
        if start:
            params["ExclusiveStartKey"] = start
        return call(engine, "query", 6.0, **params)

    first = page(2.0)
    assert [(i["Pk"]["S"], i["last_seq"]["N"]) for i in first["Items"]] == [
        ("CONN#a", "1"),
        ("CONN#b", "2"),
    ]
    rest = page(2.0, first["LastEvaluatedKey"])
    assert [(i["Pk"]["S"], i["last_seq"]["N"]) for i in rest["Items"]] == [("CONN#c", "0")]
    now = page(0.0)
    assert [(i["Pk"]["S"], i["last_seq"]["N"]) for i in now["Items"]] == [
        ("CONN#a", "99"),
        ("CONN#b", "2"),
    ]


def test_index_lag_leaves_table_reads_alone_and_stale_by_leaves_index_reads_alone(engine):
    put(engine, 1.0, {**key("a"), "n": {"N": "1"}, "free_shard": {"S": "FREE#1"}})
    set_n(engine, 5.0, key("a"), 2)
    assert n_of(call(engine, "get_item", 5.5, Key=key("a"), index_lag=5.0)) == 2
    put(engine, 6.0, {**key("b"), "free_shard": {"S": "FREE#1"}})
    answer = call(
        engine,
        "query",
        6.5,
        IndexName="unowned",
        KeyConditionExpression="#f = :f",
        ExpressionAttributeNames={"#f": "free_shard"},
        ExpressionAttributeValues={":f": {"S": "FREE#1"}},
        stale_by=5.0,
    )
    assert [i["Pk"]["S"] for i in answer["Items"]] == ["CONN#a", "CONN#b"]


# --- the history -----------------------------------------------------------------------------


def test_the_history_keeps_what_the_window_can_see_and_no_more(engine):
    for second in range(100):
        set_n(engine, float(second), key("a"), second)
    # Versions written in the last 10 s, and the one before them.
    assert engine.versions_kept(TABLE) == 11
    for back in range(11):
        answer = call(engine, "get_item", 99.0, Key=key("a"), stale_by=float(back))
        assert n_of(answer) == 99 - back
    with pytest.raises(ValueError, match="history_seconds"):
        call(engine, "get_item", 99.0, Key=key("a"), stale_by=10.5)
    with pytest.raises(ValueError, match="backwards"):
        call(engine, "get_item", 98.0, Key=key("a"))


def test_deleted_items_are_forgotten_once_no_read_can_see_them(engine):
    for n in range(600):
        put(engine, 0.0, {**key(f"x{n}"), "n": {"N": "1"}})
    for n in range(600):
        call(engine, "delete_item", 1.0, Key=key(f"x{n}"))
    assert engine.versions_kept(TABLE) == 1200
    assert n_of(call(engine, "get_item", 5.0, Key=key("x7"), stale_by=4.5)) == 1
    # The next sweep after the window: every 1024 writes.
    for n in range(1024 - 1200 % 1024):
        set_n(engine, 20.0, key("live"), n)
    assert engine.versions_kept(TABLE) == 1  # the live item's newest version only
    assert call(engine, "get_item", 20.0, Key=key("x7"), stale_by=10.0) == {}


# --- transactions over time ------------------------------------------------------------------


def test_a_transaction_token_is_remembered_for_ten_minutes(engine):
    add = {
        "TransactItems": [
            {
                "Update": {
                    "TableName": TABLE,
                    "Key": key("a"),
                    "UpdateExpression": "ADD #n :one",
                    "ExpressionAttributeNames": {"#n": "n"},
                    "ExpressionAttributeValues": {":one": {"N": "1"}},
                }
            }
        ],
        "ClientRequestToken": "t",
    }
    engine.call("transact_write_items", add, now=0.0)
    engine.call("transact_write_items", add, now=IDEMPOTENCY_WINDOW_S - 1)
    assert n_of(call(engine, "get_item", IDEMPOTENCY_WINDOW_S - 1, Key=key("a"))) == 1
    engine.call("transact_write_items", add, now=IDEMPOTENCY_WINDOW_S + 1)
    assert n_of(call(engine, "get_item", IDEMPOTENCY_WINDOW_S + 1, Key=key("a"))) == 2


def test_a_cancelled_transaction_writes_nothing_and_names_each_items_reason(engine):
    put(engine, 0.0, {**key("a"), "n": {"N": "1"}})
    put(engine, 0.0, {**key("b"), "n": {"N": "1"}})

    def check(cid: str, expected: str) -> dict[str, Any]:
        return {
            "Update": {
                "TableName": TABLE,
                "Key": key(cid),
                "UpdateExpression": "ADD #n :one",
                "ConditionExpression": "#n = :e",
                "ExpressionAttributeNames": {"#n": "n"},
                "ExpressionAttributeValues": {":one": {"N": "1"}, ":e": {"N": expected}},
                "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
            }
        }

    with pytest.raises(ClientError) as cancelled:
        engine.call(
            "transact_write_items", {"TransactItems": [check("a", "1"), check("b", "5")]}, now=1.0
        )
    reasons = cancelled.value.response["CancellationReasons"]  # type: ignore[typeddict-item]
    assert reasons == [
        {"Code": "None"},
        {
            "Code": "ConditionalCheckFailed",
            "Message": "The conditional request failed",
            "Item": {**key("b"), "n": {"N": "1"}},
        },
    ]
    assert n_of(call(engine, "get_item", 1.0, Key=key("a"))) == 1


# --- determinism and parsing -----------------------------------------------------------------

_DETERMINISM_SCRIPT = textwrap.dedent(
    """
    import json
    from local_stack.resources import create_connection_table
    from sim.dynamodb import DynamoDBEngine, SimDynamoDBClient

    engine = DynamoDBEngine()
    client = SimDynamoDBClient(engine, now=lambda: 1.0)
    create_connection_table(client, "t")
    for n in range(40):
        client.put_item(
            TableName="t",
            Item={
                "Pk": {"S": f"CONN#{n}"},
                "Sk": {"S": "CONN"},
                "desired_state": {"S": "STARTED"},
                "owner_key": {"S": f"w#1#{n % 3}"},
                "tags": {"SS": [f"t{n % 5}", "a", "z", f"m{n}"]},
                "last_seq": {"N": str(n)},
            },
        )
    out = [
        client.scan(TableName="t", Limit=7),
        client.query(
            TableName="t",
            IndexName="by-owner",
            KeyConditionExpression="#o = :o",
            ExpressionAttributeNames={"#o": "owner_key"},
            ExpressionAttributeValues={":o": {"S": "w#1#1"}},
        ),
    ]
    print(json.dumps(out))
    """
)


def _run_with_hash_seed(seed: str) -> str:
    env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-c", _DETERMINISM_SCRIPT],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return done.stdout


def test_answers_do_not_depend_on_string_hashing():
    """Scans, queries, attribute order and set members come out the same, byte for
    byte, whatever PYTHONHASHSEED is."""
    first = _run_with_hash_seed("1")
    assert first == _run_with_hash_seed("2")
    scan, index = json.loads(first)
    assert len(scan["Items"]) == 7
    assert [i["Pk"]["S"] for i in index["Items"]] == sorted(i["Pk"]["S"] for i in index["Items"])


def test_the_same_expression_is_parsed_once():
    condition = "#state = :started AND attribute_not_exists(#owner)"
    assert expressions.parse_condition(condition) is expressions.parse_condition(condition)
    assert expressions.parse_update("SET #a = :v") is expressions.parse_update("SET #a = :v")


# --- the client ------------------------------------------------------------------------------


def test_the_client_raises_what_a_boto3_client_raises(engine):
    clock = Clock()
    client = SimDynamoDBClient(engine, now=clock)
    client.put_item(TableName=TABLE, Item={**key("a"), "n": {"N": "1"}})
    with pytest.raises(client.exceptions.ConditionalCheckFailedException) as failed:
        client.put_item(
            TableName=TABLE,
            Item=key("a"),
            ConditionExpression="attribute_not_exists(#p)",
            ExpressionAttributeNames={"#p": "Pk"},
            ReturnValuesOnConditionCheckFailure="ALL_OLD",
        )
    assert failed.value.response["Item"] == {**key("a"), "n": {"N": "1"}}  # type: ignore[typeddict-item]
    assert str(failed.value) == (
        "An error occurred (ConditionalCheckFailedException) when calling the PutItem "
        "operation: The conditional request failed"
    )
    with pytest.raises(ParamValidationError):
        client.get_item(TableName=TABLE, Key=key("a"), Bogus=1)
    with pytest.raises(ClientError) as missing:
        client.get_item(TableName="nope", Key=key("a"))
    assert isinstance(missing.value, client.exceptions.ResourceNotFoundException)


def test_returned_items_are_copies(engine):
    client = SimDynamoDBClient(engine, now=lambda: 0.0)
    client.put_item(TableName=TABLE, Item={**key("a"), "tags": {"SS": ["x"]}})
    got = client.get_item(TableName=TABLE, Key=key("a"))["Item"]
    got["tags"]["SS"].append("y")
    got["Pk"]["S"] = "changed"
    assert client.get_item(TableName=TABLE, Key=key("a"))["Item"]["tags"] == {"SS": ["x"]}


@pytest.mark.parametrize(
    ("operation", "params"),
    [
        ("get_item", {"Key": key("a"), "ReturnConsumedCapacity": "TOTAL"}),
        (
            "update_item",
            {
                "Key": key("a"),
                "UpdateExpression": "SET a = :v",
                "ExpressionAttributeValues": {":v": {"N": "1"}},
            },
        ),
        (
            "update_item",
            {
                "Key": key("a"),
                "UpdateExpression": "SET #a.b = :v",
                "ExpressionAttributeNames": {"#a": "a"},
                "ExpressionAttributeValues": {":v": {"N": "1"}},
            },
        ),
        ("scan", {"Segment": 0, "TotalSegments": 2}),
        ("get_item", {"Key": key("a"), "AttributesToGet": ["a"]}),
    ],
)
def test_what_is_not_simulated_is_refused_loudly(engine, operation, params):
    with pytest.raises(NotImplementedError):
        call(engine, operation, 0.0, **params)
