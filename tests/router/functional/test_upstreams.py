"""Credentials by reference and protocol specs over real HTTP, through the local
adapter, against DynamoDB Local and moto's SQS: refusals change nothing, the triple
(URL, protocol, auth) decides the outcome by conditional writes, and a new protocol
resets the checkpoint where new credentials keep it."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from lambdas.router.service import ConnectionConflictError, ConnectionService
from lambdas.router.settings import RouterSettings
from local_stack.resources import Queues
from local_stack.services import local_client
from tests.router.fixtures import drain_start_messages, snapshot
from tests.router.functional.test_http_api import checkpoint, park
from tests.router.local_api import Answer, local_router, request
from tests.support.timing import scaled
from wsfleet.desired_state import StartOutcome
from wsfleet.item_io import get_connection
from wsfleet.protocol_specs import MAX_SPEC_BYTES, parse_spec
from wsfleet.start_messages import StartMessage

pytestmark = pytest.mark.timeout(scaled(120))

FEED = "ws://127.0.0.1:8765/quotes"
SECRET = "websocket-fleet/feeds/acme"
ROTATED = "websocket-fleet/feeds/acme-2"
SUBSCRIBE = {"op": "subscribe", "token": "${secret:token}", "from": "${from_seq}"}
FIELD = {
    "name": "json-field",
    "options": {"sequence": "/seq", "resume": "subscribe", "subscribe": SUBSCRIBE},
}
LIVE = {"name": "live", "options": {"subscribe": {"op": "subscribe", "key": "${secret:key}"}}}


def start(api: str, connection_id: str, ws_url: str = FEED, **fields: Any) -> Answer:
    return request(
        api, "POST", "/connections", {"connection_id": connection_id, "ws_url": ws_url} | fields
    )


def test_an_authenticated_feed_is_stored_and_shown_everywhere(
    api: str, ddb: Any, sqs: Any, table: str, queues: Queues
) -> None:
    created = start(api, "quotes", auth={"secret": SECRET}, protocol=FIELD)

    assert (created.status, created.body["outcome"]) == (201, "created")
    assert (created.body["auth"], created.body["protocol"]) == ({"secret": SECRET}, FIELD)
    item = get_connection(ddb, table, "quotes")
    assert item is not None
    assert (item.auth_secret, item.protocol) == (SECRET, parse_spec(FIELD).to_item())
    got = request(api, "GET", "/connections/quotes").body
    listed = request(api, "GET", "/connections").body["connections"]
    by_state = request(api, "GET", "/connections?state=STARTED").body["connections"]
    for view in (got, *listed, *by_state):
        assert (view["auth"], view["protocol"]) == ({"secret": SECRET}, FIELD)
    assert drain_start_messages(sqs, queues.queue_url) == [StartMessage("start", "quotes")]


REFUSALS = [
    ({"auth": {"secret": "prod/database/root"}}, "invalid_auth", "under 'websocket-fleet/'"),
    (
        {"auth": {"secret": "arn:aws:secretsmanager:eu-west-1:123456789012:secret:prod/x-AbC1"}},
        "invalid_auth",
        "under 'websocket-fleet/'",
    ),
    ({"auth": {"secret": "websocket-fleet/no spaces"}}, "invalid_auth", "secret name"),
    ({"auth": {"secret": ["websocket-fleet/a"]}}, "invalid_auth", "auth.secret"),
    ({"protocol": {"name": "binary-seq"}}, "invalid_protocol", "must be one of"),
    (
        {"protocol": {"name": "live", "options": {"subscribe": {"pad": "x" * MAX_SPEC_BYTES}}}},
        "invalid_protocol",
        "more than 4096",
    ),
    ({"protocol": {"name": "json-field", "options": {}}}, "invalid_protocol", "is required"),
    ({"protocol": {"name": "json-seq", "options": {"seq": "/s"}}}, "invalid_protocol", "unknown"),
    ({"protocol": {"name": "json-seq", "version": 2}}, "invalid_protocol", "version"),
]


@pytest.mark.parametrize(("fields", "code", "says"), REFUSALS)
def test_refused_references_and_specs_are_400_and_change_nothing(
    api: str,
    ddb: Any,
    sqs: Any,
    table: str,
    queues: Queues,
    fields: dict[str, Any],
    code: str,
    says: str,
) -> None:
    # A stopped connection with a checkpoint, which a refused restart must not touch.
    assert start(api, "kept", auth={"secret": SECRET}, protocol=FIELD).status == 201
    checkpoint(ddb, table, "kept", 25)
    assert request(api, "DELETE", "/connections/kept").status == 202
    drain_start_messages(sqs, queues.queue_url)
    before = snapshot(ddb, sqs, table, queues.queue_url)

    for connection_id in ("kept", "new-one"):
        answer = start(api, connection_id, **fields)
        assert answer.status == 400, answer
        assert answer.body == {"error": code, "message": answer.body["message"]}
        assert says in answer.body["message"], answer.body

    assert snapshot(ddb, sqs, table, queues.queue_url) == before
    assert request(api, "GET", "/connections/new-one").status == 404


@pytest.fixture
def api_without_prefix(
    monkeypatch: pytest.MonkeyPatch,
    table: str,
    queues: Queues,
    dynamodb_endpoint: str,
    moto_endpoint: str,
) -> Iterator[str]:
    with local_router(
        monkeypatch,
        table=table,
        queue_url=queues.queue_url,
        dynamodb_endpoint=dynamodb_endpoint,
        sqs_endpoint=moto_endpoint,
        secret_prefix=None,
    ) as url:
        yield url


def test_without_a_prefix_every_reference_is_refused(
    api_without_prefix: str, ddb: Any, sqs: Any, table: str, queues: Queues
) -> None:
    before = snapshot(ddb, sqs, table, queues.queue_url)
    refused = start(api_without_prefix, "quotes", auth={"secret": SECRET})
    assert (refused.status, refused.body["error"]) == (400, "invalid_auth")
    assert "ALLOWED_SECRET_PREFIX is not set" in refused.body["message"]
    assert snapshot(ddb, sqs, table, queues.queue_url) == before
    assert start(api_without_prefix, "quotes", protocol=FIELD).status == 201


def test_the_triple_decides_while_started(
    api: str, ddb: Any, sqs: Any, table: str, queues: Queues
) -> None:
    assert start(api, "quotes", auth={"secret": SECRET}, protocol=FIELD).status == 201
    drain_start_messages(sqs, queues.queue_url)
    before = snapshot(ddb, sqs, table, queues.queue_url)

    same = start(api, "quotes", auth={"secret": SECRET}, protocol=FIELD)
    assert (same.status, same.body["outcome"]) == (200, "already_started")
    for fields in (
        {"auth": {"secret": SECRET}, "protocol": LIVE},
        {"auth": {"secret": ROTATED}, "protocol": FIELD},
        {"protocol": FIELD},
        {"auth": {"secret": SECRET}},
    ):
        conflict = start(api, "quotes", **fields)
        assert (conflict.status, conflict.body["error"]) == (409, "conflict"), fields

    assert snapshot(ddb, sqs, table, queues.queue_url) == before


@pytest.mark.parametrize(
    ("fields", "last_seq", "seq_gen"),
    [
        ({"auth": {"secret": SECRET}, "protocol": FIELD}, 25, 0),  # the same triple
        ({"auth": {"secret": ROTATED}, "protocol": FIELD}, 25, 0),  # new credentials alone
        ({"protocol": FIELD}, 25, 0),  # credentials dropped
        ({"auth": {"secret": SECRET}, "protocol": LIVE}, 0, 1),  # a new protocol
        ({"auth": {"secret": SECRET}}, 0, 1),  # back to the worker's default protocol
    ],
    ids=["same", "new-auth", "no-auth", "new-protocol", "default-protocol"],
)
def test_a_restart_resets_the_checkpoint_for_a_new_protocol_only(
    api: str,
    ddb: Any,
    sqs: Any,
    table: str,
    queues: Queues,
    fields: dict[str, Any],
    last_seq: int,
    seq_gen: int,
) -> None:
    assert start(api, "quotes", auth={"secret": SECRET}, protocol=FIELD).status == 201
    checkpoint(ddb, table, "quotes", 25)
    assert request(api, "DELETE", "/connections/quotes").status == 202
    drain_start_messages(sqs, queues.queue_url)

    again = start(api, "quotes", **fields)

    assert (again.status, again.body["outcome"]) == (201, "restarted")
    assert (again.body["last_seq"], again.body["start_gen"], again.body["epoch"]) == (
        last_seq,
        2,
        1,
    )
    assert again.body["auth"] == fields.get("auth")
    assert again.body["protocol"] == fields.get("protocol")
    item = get_connection(ddb, table, "quotes")
    assert item is not None
    assert item.seq_gen == seq_gen
    assert item.auth_secret == fields.get("auth", {}).get("secret")
    assert drain_start_messages(sqs, queues.queue_url) == [StartMessage("start", "quotes")]


def test_a_parked_connection_is_re_armed_with_a_new_protocol_from_the_start(
    api: str, ddb: Any, sqs: Any, table: str, queues: Queues
) -> None:
    assert start(api, "quotes", auth={"secret": SECRET}, protocol=FIELD).status == 201
    park(ddb, table, "quotes", 25, "secret is not a JSON object with headers/query")
    shown = request(api, "GET", "/connections/quotes").body
    assert (shown["status"], shown["auth"]) == ("failed", {"secret": SECRET})

    kept = start(api, "quotes", auth={"secret": ROTATED}, protocol=FIELD)  # new auth: resumes
    assert (kept.status, kept.body["last_seq"], kept.body["parked_reason"]) == (201, 25, None)
    park(ddb, table, "quotes", 30, "HTTP 401 from upstream")
    reset = start(api, "quotes", auth={"secret": ROTATED}, protocol=LIVE)  # new protocol: reset
    assert (reset.status, reset.body["last_seq"], reset.body["protocol"]) == (201, 0, LIVE)


def test_racing_starts_with_different_triples_create_once(
    ddb: Any, sqs: Any, table: str, queues: Queues, dynamodb_endpoint: str, moto_endpoint: str
) -> None:
    """20 services (as 20 Lambda containers), each with its own clients, start the same
    id at once with one of three triples: one creates, those with its triple are
    already started, the others conflict."""
    settings = RouterSettings.from_env(
        {
            "TABLE_NAME": table,
            "QUEUE_URL": queues.queue_url,
            "ALLOWED_UPSTREAM_HOSTS": "127.0.0.1",
            "ALLOW_INSECURE_WS": "true",
            "ALLOWED_SECRET_PREFIX": "websocket-fleet/",
        }
    )
    clients = [
        (local_client("dynamodb", dynamodb_endpoint), local_client("sqs", moto_endpoint))
        for _ in range(20)
    ]
    services = [ConnectionService(dynamodb=d, sqs=q, settings=settings) for d, q in clients]
    triples: list[tuple[dict[str, Any] | None, str | None]] = [
        (FIELD, SECRET),
        (LIVE, SECRET),
        (FIELD, ROTATED),
    ] * 7
    barrier = threading.Barrier(len(services), timeout=scaled(30))

    def race(service: ConnectionService, triple: tuple[dict[str, Any] | None, str | None]) -> Any:
        barrier.wait()
        protocol, auth = triple
        try:
            return service.start("contested", FEED, protocol=protocol, auth_secret=auth).outcome
        except ConnectionConflictError:
            return StartOutcome.CONFLICT

    try:
        with ThreadPoolExecutor(max_workers=len(services)) as pool:
            outcomes = list(pool.map(race, services, triples[: len(services)]))
    finally:
        for dynamodb, queue in clients:
            dynamodb.close()
            queue.close()

    counts = Counter(outcomes)
    assert counts[StartOutcome.CREATED] == 1
    winner = triples[outcomes.index(StartOutcome.CREATED)]
    same = sum(1 for t in triples[: len(services)] if t == winner) - 1
    assert counts[StartOutcome.ALREADY_STARTED] == same
    assert counts[StartOutcome.CONFLICT] == len(services) - 1 - same
    item = get_connection(ddb, table, "contested")
    assert item is not None
    assert (item.protocol, item.auth_secret) == (parse_spec(winner[0]).to_item(), winner[1])
    assert drain_start_messages(sqs, queues.queue_url) == [StartMessage("start", "contested")]
