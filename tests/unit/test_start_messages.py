import json

import pytest

from wsfleet.start_messages import InvalidStartMessageError, StartMessage, parse_body


@pytest.mark.parametrize("kind", ["start", "reassign"])
def test_round_trip(kind):
    message = StartMessage(kind, "conn-1:a.b_c")
    assert parse_body(message.to_body()) == message


@pytest.mark.parametrize(
    "body",
    [
        "",
        "not json",
        "[]",
        "null",
        json.dumps({"type": "start"}),
        json.dumps({"connection_id": "c"}),
        json.dumps({"type": "boom", "connection_id": "c"}),
        json.dumps({"type": "start", "connection_id": ""}),
        json.dumps({"type": "start", "connection_id": "has space"}),
        json.dumps({"type": "start", "connection_id": "x" * 129}),
        json.dumps({"type": "start", "connection_id": 7}),
        json.dumps({"type": "start", "connection_id": "c", "extra": 1}),
        "x" * 5000,
    ],
)
def test_poison_bodies_are_refused(body):
    with pytest.raises(InvalidStartMessageError):
        parse_body(body)
