"""Helpers shared by the router tests: event fixtures from JSON files, and a snapshot
of everything the router can change (table items and start-queue depth), so a test
can assert that a refused request changed nothing."""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from wsfleet.start_messages import StartMessage, parse_body

EVENTS_DIR = Path(__file__).parent / "events"


@cache
def _load(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((EVENTS_DIR / f"{name}.json").read_text())
    return loaded


def load_event(name: str) -> dict[str, Any]:
    """A fresh copy of ``tests/router/events/<name>.json`` (tests may change it)."""
    return copy.deepcopy(_load(name))


def event_names(prefix: str = "") -> list[str]:
    return sorted(p.stem for p in EVENTS_DIR.glob(f"{prefix}*.json"))


def with_query(event: dict[str, Any], **query: str) -> dict[str, Any]:
    """``event`` with its query string replaced (as API Gateway would send it)."""
    from urllib.parse import urlencode

    changed = copy.deepcopy(event)
    changed["rawQueryString"] = urlencode(query)
    if query:
        changed["queryStringParameters"] = dict(query)
    else:
        changed.pop("queryStringParameters", None)
    return changed


def with_body(event: dict[str, Any], body: Any) -> dict[str, Any]:
    changed = copy.deepcopy(event)
    changed["body"] = body if isinstance(body, str) else json.dumps(body)
    changed["isBase64Encoded"] = False
    return changed


def response_json(response: dict[str, Any]) -> Any:
    return json.loads(response["body"])


def assert_error(response: dict[str, Any], status: int, code: str | None = None) -> dict[str, str]:
    """The response is a refusal with ``{"error": str, "message": str}`` and nothing else."""
    assert response["statusCode"] == status, response
    body = response_json(response)
    assert isinstance(body, dict), body
    assert set(body) == {"error", "message"}, body
    assert isinstance(body["error"], str), body
    assert isinstance(body["message"], str), body
    assert body["message"], body
    if code is not None:
        assert body["error"] == code, body
    return body


@dataclass(frozen=True)
class StateSnapshot:
    """All items of the table (as stored) and the number of messages on the queue."""

    items: tuple[str, ...]
    queued: int


def snapshot(ddb: Any, sqs: Any, table: str, queue_url: str) -> StateSnapshot:
    items: list[str] = []
    args: dict[str, Any] = {"TableName": table, "ConsistentRead": True}
    while True:
        page = ddb.scan(**args)
        items.extend(json.dumps(item, sort_keys=True) for item in page.get("Items", []))
        if "LastEvaluatedKey" not in page:
            break
        args["ExclusiveStartKey"] = page["LastEvaluatedKey"]
    attributes = sqs.get_queue_attributes(
        QueueUrl=queue_url,
        AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
    )["Attributes"]
    queued = int(attributes["ApproximateNumberOfMessages"]) + int(
        attributes["ApproximateNumberOfMessagesNotVisible"]
    )
    return StateSnapshot(tuple(sorted(items)), queued)


def drain_start_messages(sqs: Any, queue_url: str) -> list[StartMessage]:
    """Receive (and delete) every message on the queue, parsed."""
    messages: list[StartMessage] = []
    while True:
        batch = sqs.receive_message(
            QueueUrl=queue_url, MaxNumberOfMessages=10, WaitTimeSeconds=0
        ).get("Messages", [])
        if not batch:
            return messages
        for message in batch:
            messages.append(parse_body(message["Body"]))
            sqs.delete_message(QueueUrl=queue_url, ReceiptHandle=message["ReceiptHandle"])
