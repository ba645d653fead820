"""Starts that carry credentials by reference (``auth``) and a protocol spec
(``protocol``): validation by the shared rules (wsfleet.secret_refs,
wsfleet.protocol_specs), what is stored, the outcomes of the triple (URL, protocol,
auth), the view, and that no secret value ever reaches an answer, a log or the table."""

from __future__ import annotations

import io
import json
import logging
from typing import Any

import boto3
import pytest

from lambdas.router import main
from tests.router.fixtures import assert_error, load_event, response_json, with_body
from tests.router.unit.conftest import Router
from wsfleet.protocol_specs import InvalidProtocolError, parse_spec
from wsfleet.secret_refs import InvalidSecretRefError, check_secret_ref
from wsfleet.start_messages import StartMessage

URL = "wss://feeds.example.com/v2/quotes"
SECRET = "websocket-fleet/feeds/acme"
OTHER_SECRET = "websocket-fleet/feeds/acme-rotated"
SUBSCRIBE = {
    "op": "subscribe",
    "channel": "quotes",
    "token": "${secret:token}",
    "from": "${from_seq}",
}
FIELD = {
    "name": "json-field",
    "options": {
        "sequence": "/seq",
        "payload": "/data",
        "resume": "subscribe",
        "subscribe": SUBSCRIBE,
    },
}
LIVE = {"name": "live", "options": {}}


def post(router: Router, connection_id: str = "quotes-1", **fields: Any) -> dict[str, Any]:
    body = {"connection_id": connection_id, "ws_url": URL} | fields
    return router.invoke(with_body(load_event("post_create"), body))


def at(event: dict[str, Any], connection_id: str) -> dict[str, Any]:
    """A GET or DELETE fixture aimed at another connection."""
    event["rawPath"] = event["requestContext"]["http"]["path"] = f"/connections/{connection_id}"
    event["pathParameters"] = {"connection_id": connection_id}
    return event


def stop(router: Router, connection_id: str = "quotes-1") -> None:
    assert router.invoke(at(load_event("delete_found"), connection_id))["statusCode"] == 202


def stored(spec: dict[str, Any]) -> str:
    return parse_spec(spec).to_item()


# --- a start with both, and what it stores and shows -------------------------------------


def test_an_authenticated_subscribe_feed_is_created_and_shown(router: Router) -> None:
    response = router.call("post_authenticated")

    assert response["statusCode"] == 201, response
    body = response_json(response)
    assert body["auth"] == {"secret": SECRET}
    assert body["protocol"] == FIELD
    raw = router.raw_item("quotes-1")
    assert raw["auth_secret"] == {"S": SECRET}
    assert raw["protocol"] == {"S": stored(FIELD)}  # compact, keys sorted
    assert json.loads(raw["protocol"]["S"]) == FIELD
    item = router.item("quotes-1")
    assert item is not None
    assert (item.auth_secret, item.protocol) == (SECRET, stored(FIELD))
    assert router.start_messages() == [StartMessage("start", "quotes-1")]

    shown = response_json(router.invoke(at(load_event("get_found"), "quotes-1")))
    assert (shown["auth"], shown["protocol"]) == ({"secret": SECRET}, FIELD)
    listed = response_json(router.call("list_all"))["connections"]
    assert [(v["auth"], v["protocol"]) for v in listed] == [({"secret": SECRET}, FIELD)]


def test_an_arn_under_the_prefix_is_accepted(router: Router) -> None:
    arn = f"arn:aws:secretsmanager:eu-west-1:123456789012:secret:{SECRET}-AbC123"
    response = post(router, auth={"secret": arn})
    assert response["statusCode"] == 201, response
    assert response_json(response)["auth"] == {"secret": arn}
    assert router.raw_item("quotes-1")["auth_secret"] == {"S": arn}


def test_a_protocol_without_options_is_stored_with_empty_options(router: Router) -> None:
    response = post(router, protocol={"name": "json-seq"})
    assert response["statusCode"] == 201, response
    assert response_json(response)["protocol"] == {"name": "json-seq", "options": {}}
    assert router.raw_item("quotes-1")["protocol"] == {"S": '{"name":"json-seq","options":{}}'}


def test_a_start_without_either_stores_neither(router: Router) -> None:
    assert post(router)["statusCode"] == 201
    raw = router.raw_item("quotes-1")
    assert "auth_secret" not in raw
    assert "protocol" not in raw


# --- refusals: 400 with the validator's code and message, nothing written ---------------


def secret_message(ref: Any, prefix: str | None = "websocket-fleet/") -> str:
    with pytest.raises(InvalidSecretRefError) as refused:
        check_secret_ref(ref, prefix)
    return str(refused.value)


def protocol_message(raw: Any) -> str:
    with pytest.raises(InvalidProtocolError) as refused:
        parse_spec(raw)
    return str(refused.value)


REFUSED_REFS = [
    "prod/database/root",  # outside the prefix
    "websocket-fleet",  # the prefix without its slash
    "arn:aws:secretsmanager:eu-west-1:123456789012:secret:prod/db-AbC123",
    "websocket-fleet/has space",
    "websocket-fleet/" + "x" * 600,
    "",
]

REFUSED_SPECS: list[Any] = [
    {"name": "binary-seq"},  # unknown protocol
    {"name": "json-seq", "options": {"resume": "query"}},  # unknown option
    {"name": "json-field", "options": {"payload": "/data"}},  # sequence missing
    {"name": "json-field", "options": {"sequence": "seq"}},  # not a pointer
    {"name": "json-field", "options": {"sequence": "/seq", "resume": "subscribe"}},
    {"name": "live", "options": {"subscribe": {"from": "${from_seq}"}}},
    {"name": "json-seq", "options": {"subscribe": {"key": "${secret:}"}}},
    {"name": "live", "options": {"subscribe": {"blob": "x" * 5000}}},  # over 4096 bytes
    {"name": "live", "options": {"subscribe": {"n": float("nan")}}},  # not storable as JSON
    {"name": "json-seq", "options": {"subscribe": {"n": float("inf")}}},
]


@pytest.mark.parametrize("ref", REFUSED_REFS)
def test_a_refused_reference_is_a_400_with_the_validators_message(router: Router, ref: str) -> None:
    before = router.state()
    body = assert_error(post(router, auth={"secret": ref}), 400, "invalid_auth")
    assert body["message"] == secret_message(ref)
    assert router.state() == before
    assert router.item("quotes-1") is None


@pytest.mark.parametrize("spec", REFUSED_SPECS)
def test_a_refused_protocol_is_a_400_with_the_validators_message(
    router: Router, spec: dict[str, Any]
) -> None:
    before = router.state()
    body = assert_error(post(router, protocol=spec), 400, "invalid_protocol")
    assert body["message"] == protocol_message(spec)
    assert router.state() == before
    assert router.item("quotes-1") is None


@pytest.mark.parametrize(
    ("fields", "code"),
    [
        ({"auth": "websocket-fleet/feeds/acme"}, "invalid_auth"),
        ({"auth": {"secret": 7}}, "invalid_auth"),
        ({"auth": {}}, "invalid_auth"),
        ({"auth": {"secret": SECRET, "role": "admin"}}, "invalid_auth"),
        ({"protocol": "json-seq"}, "invalid_protocol"),
        ({"protocol": {"name": 1}}, "invalid_protocol"),
        ({"protocol": {"options": {}}}, "invalid_protocol"),
        ({"protocol": {"name": "json-seq", "options": []}}, "invalid_protocol"),
        ({"protocol": {"name": "json-seq", "version": 2}}, "invalid_protocol"),
        # more than one field wrong: the general code
        ({"auth": 1, "protocol": 1}, "validation_error"),
        ({"auth": 1, "ws_url": 1}, "validation_error"),
    ],
)
def test_a_malformed_auth_or_protocol_is_refused_with_its_code(
    router: Router, fields: dict[str, Any], code: str
) -> None:
    before = router.state()
    body = assert_error(post(router, **fields), 400, code)
    assert body["message"]
    assert router.state() == before


def test_without_a_prefix_no_reference_is_accepted(
    router: Router, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("ALLOWED_SECRET_PREFIX")
    main.service.cache_clear()
    before = router.state()

    body = assert_error(post(router, auth={"secret": SECRET}), 400, "invalid_auth")

    assert body["message"] == secret_message(SECRET, None)
    assert "ALLOWED_SECRET_PREFIX" in body["message"]
    assert router.state() == before
    # Starts without credentials are not affected.
    assert post(router, protocol=LIVE)["statusCode"] == 201


def test_a_refused_restart_leaves_the_stopped_item_as_it_was(router: Router) -> None:
    assert post(router, auth={"secret": SECRET}, protocol=FIELD)["statusCode"] == 201
    router.set_last_seq("quotes-1", 41)
    stop(router)
    router.start_messages()
    before = router.state()

    assert_error(post(router, auth={"secret": "prod/other"}, protocol=FIELD), 400, "invalid_auth")
    assert_error(
        post(router, auth={"secret": SECRET}, protocol={"name": "x"}), 400, "invalid_protocol"
    )

    assert router.state() == before
    item = router.item("quotes-1")
    assert item is not None
    assert (item.desired_state, item.last_seq, item.auth_secret) == ("STOPPED", 41, SECRET)


# --- the triple decides the outcome ------------------------------------------------------


def test_the_same_triple_again_is_200_and_changes_nothing(router: Router) -> None:
    assert post(router, auth={"secret": SECRET}, protocol=FIELD)["statusCode"] == 201
    router.start_messages()
    before = router.state()

    # The same spec, keys in another order, is the same protocol.
    reordered = {"options": dict(reversed(list(FIELD["options"].items()))), "name": "json-field"}
    response = post(router, auth={"secret": SECRET}, protocol=reordered)

    assert response["statusCode"] == 200
    assert response_json(response)["outcome"] == "already_started"
    assert router.state() == before
    assert router.start_messages() == []


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"auth": {"secret": SECRET}, "protocol": LIVE}, "protocol"),
        ({"protocol": FIELD}, "auth"),
        ({"auth": {"secret": OTHER_SECRET}, "protocol": FIELD}, "auth"),
        ({"auth": {"secret": SECRET}}, "protocol"),
        ({}, "protocol and auth"),
    ],
)
def test_another_protocol_or_auth_while_started_is_a_409_that_changes_nothing(
    router: Router, fields: dict[str, Any], named: str
) -> None:
    assert post(router, auth={"secret": SECRET}, protocol=FIELD)["statusCode"] == 201
    router.start_messages()
    before = router.state()

    body = assert_error(post(router, **fields), 409, "conflict")

    assert body["message"] == f"connection quotes-1 is running with another {named}; stop it first"
    assert router.state() == before


def test_a_restart_with_a_new_protocol_resets_the_checkpoint(router: Router) -> None:
    assert post(router, auth={"secret": SECRET}, protocol=FIELD)["statusCode"] == 201
    router.set_last_seq("quotes-1", 41)
    seq_gen = router.raw_item("quotes-1")["seq_gen"]["N"]
    stop(router)
    router.start_messages()

    response = post(router, auth={"secret": SECRET}, protocol=LIVE)

    assert response["statusCode"] == 201
    body = response_json(response)
    assert (body["outcome"], body["last_seq"], body["start_gen"]) == ("restarted", 0, 2)
    assert body["protocol"] == LIVE
    assert int(router.raw_item("quotes-1")["seq_gen"]["N"]) == int(seq_gen) + 1
    assert router.start_messages() == [StartMessage("start", "quotes-1")]


def test_a_restart_with_new_credentials_alone_keeps_the_checkpoint(router: Router) -> None:
    assert post(router, auth={"secret": SECRET}, protocol=FIELD)["statusCode"] == 201
    router.set_last_seq("quotes-1", 41)
    stop(router)

    response = post(router, auth={"secret": OTHER_SECRET}, protocol=FIELD)

    assert response["statusCode"] == 201
    body = response_json(response)
    assert (body["outcome"], body["last_seq"], body["start_gen"]) == ("restarted", 41, 2)
    assert body["auth"] == {"secret": OTHER_SECRET}
    assert router.raw_item("quotes-1")["seq_gen"] == {"N": "0"}


def test_a_restart_without_either_removes_both(router: Router) -> None:
    assert post(router, auth={"secret": SECRET}, protocol=FIELD)["statusCode"] == 201
    router.set_last_seq("quotes-1", 41)
    stop(router)

    response = post(router)

    assert response["statusCode"] == 201
    body = response_json(response)
    assert (body["auth"], body["protocol"], body["last_seq"]) == (None, None, 0)
    raw = router.raw_item("quotes-1")
    assert "auth_secret" not in raw
    assert "protocol" not in raw


# --- EventBridge: the same fields, the same rules ---------------------------------------


def test_a_start_event_with_auth_and_protocol(router: Router) -> None:
    result = router.call("eventbridge_start_authenticated")

    assert result == {"ok": True, "connection_id": "feed-eb-auth", "outcome": "created"}
    item = router.item("feed-eb-auth")
    assert item is not None
    assert item.auth_secret == SECRET
    detail = load_event("eventbridge_start_authenticated")["detail"]
    assert item.protocol == stored(detail["protocol"])
    assert router.call("eventbridge_start_authenticated")["outcome"] == "already_started"


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("eventbridge_start_refused_auth", "InvalidSecretRefError"),
        ("eventbridge_start_invalid_protocol", "InvalidProtocolError"),
    ],
)
def test_refused_start_events_change_nothing(router: Router, name: str, reason: str) -> None:
    before = router.state()
    result = router.call(name)
    assert result["ok"] is False
    assert result["error"].startswith(reason)
    assert router.state() == before


# --- no secret value anywhere ------------------------------------------------------------

SECRET_VALUE = "tok-3f9c1e7a-never-shown"


def test_no_secret_value_reaches_an_answer_a_log_or_the_table(
    router: Router, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The router never reads a secret: with a secret of that name in (moto's) Secrets
    Manager, its value appears in no answer, no log line (the records and the JSON
    lines the Powertools logger writes, botocore's debug output included) and no item,
    and the router never makes a Secrets Manager client."""
    secrets = boto3.client("secretsmanager", region_name="us-east-1")
    secrets.create_secret(
        Name=SECRET,
        SecretString=json.dumps(
            {
                "headers": {"X-API-Key": SECRET_VALUE},
                "query": {"t": SECRET_VALUE},
                "token": SECRET_VALUE,
            }
        ),
    )
    made: list[str] = []
    original = boto3.session.Session.client

    def recording(self: boto3.session.Session, service_name: str, *args: Any, **kwargs: Any) -> Any:
        made.append(service_name)
        return original(self, service_name, *args, **kwargs)

    monkeypatch.setattr(boto3.session.Session, "client", recording)
    main.service.cache_clear()
    lines = io.StringIO()
    handler = logging.StreamHandler(lines)
    handler.setFormatter(main.logger.registered_formatter)
    watched = [logging.getLogger("lambdas"), logging.getLogger(main.logger.name)]
    for logger in watched:
        logger.addHandler(handler)
    caplog.set_level(logging.DEBUG)
    try:
        answers = [
            router.call("post_authenticated"),
            router.call("post_authenticated"),  # already started
            post(router, auth={"secret": OTHER_SECRET}, protocol=FIELD),  # conflict
            post(router, "quotes-2", auth={"secret": "prod/x"}),  # refused
            router.call("eventbridge_start_authenticated"),
            router.call("eventbridge_start_refused_auth"),
            router.call("list_all"),
        ]
        stop(router)
        answers.append(post(router, auth={"secret": SECRET}, protocol=LIVE))
    finally:
        for logger in watched:
            logger.removeHandler(handler)

    assert [a.get("statusCode") for a in answers] == [201, 200, 409, 400, None, None, 200, 201]
    everything = json.dumps(answers) + lines.getvalue() + caplog.text
    everything += json.dumps([r.__dict__ for r in caplog.records], default=str)
    everything += json.dumps(router.state().items)
    assert SECRET in everything  # the reference is there, as it should be
    assert lines.getvalue()  # and the logs were captured
    assert SECRET_VALUE not in everything
    assert "secretsmanager" not in made
    assert {"dynamodb", "sqs"} <= set(made)
