"""The shared DynamoDB client on a slow path: short attempts, then a patient one."""

from __future__ import annotations

from typing import Any

import pytest
from botocore.exceptions import ClientError, EndpointConnectionError, ReadTimeoutError

from worker.patient_calls import PatientClient, RoundTrips


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Path:
    """A client whose calls take ``took`` seconds on ``clock`` and then answer, or,
    past ``timeout``, raise as botocore does (having landed all the same)."""

    def __init__(self, clock: Clock, timeout: float) -> None:
        self.clock, self.timeout = clock, timeout
        self.took = 0.01
        self.landed: list[str] = []
        self.answer: Exception | None = None
        self.region = "r"

    def put_item(self, **kwargs: Any) -> dict[str, Any]:
        self.landed.append(kwargs["Item"])
        self.clock.now += min(self.took, self.timeout)
        if self.took > self.timeout:
            raise ReadTimeoutError(endpoint_url="https://x")
        if self.answer is not None:
            raise self.answer
        return {"ok": kwargs["Item"]}


def _client() -> tuple[PatientClient, Path, Path, Clock]:
    clock = Clock()
    short, patient = Path(clock, 0.5), Path(clock, 1.98)
    return PatientClient(short, patient, RoundTrips(0.5), clock), short, patient, clock


def test_a_fast_path_uses_the_short_client_only() -> None:
    client, short, patient, _ = _client()
    assert client.put_item(Item="a") == {"ok": "a"}
    assert (short.landed, patient.landed, client.trips.slow) == (["a"], [], False)


def test_a_slow_path_is_answered_by_the_patient_client_and_then_used_first() -> None:
    client, short, patient, _ = _client()
    short.took = patient.took = 0.8
    assert client.put_item(Item="a") == {"ok": "a"}
    assert (short.landed, patient.landed, client.trips.slow) == (["a"], ["a"], True)
    # Slow: straight to the patient client, no short attempt wasted.
    assert client.put_item(Item="b") == {"ok": "b"}
    assert (short.landed, patient.landed) == (["a"], ["a", "b"])
    # Fast again: a patient answer within a short attempt sends calls back.
    patient.took = short.took = 0.1
    client.put_item(Item="c")
    assert client.trips.slow is False
    client.put_item(Item="d")
    assert (short.landed, patient.landed) == (["a", "d"], ["a", "b", "c"])


def test_a_lost_reply_on_a_fast_path_is_not_slowness() -> None:
    """The short attempts time out (their replies lost), and the patient attempt is
    answered at once: the path is fast, the next call tries the short client first."""
    client, short, patient, _ = _client()
    short.took = 3.0
    assert client.put_item(Item="a") == {"ok": "a"}
    assert (short.landed, patient.landed, client.trips.slow) == (["a"], ["a"], False)
    short.took = 0.01
    client.put_item(Item="b")
    assert (short.landed, patient.landed) == (["a", "b"], ["a"])


def test_a_path_slower_than_the_patient_attempt_raises_the_timeout() -> None:
    client, short, patient, _ = _client()
    short.took = patient.took = 3.0
    with pytest.raises(ReadTimeoutError):
        client.put_item(Item="a")
    assert client.trips.slow is False  # no answer: lost, or cut off; nothing known
    assert patient.landed == ["a"]


def test_an_error_answer_is_an_answer_and_not_retried() -> None:
    client, short, patient, _ = _client()
    short.answer = ClientError({"Error": {"Code": "ConditionalCheckFailedException"}}, "PutItem")
    with pytest.raises(ClientError):
        client.put_item(Item="a")
    assert (patient.landed, client.trips.slow) == ([], False)
    short.answer = EndpointConnectionError(endpoint_url="https://x")
    with pytest.raises(EndpointConnectionError):
        client.put_item(Item="b")
    assert patient.landed == []


def test_attributes_that_are_not_calls_are_the_short_clients() -> None:
    client, _, _, _ = _client()
    assert client.region == "r"


@pytest.mark.parametrize(
    ("answered", "slow"), [(0.1, False), (0.5, False), (0.51, True), (1.9, True)]
)
def test_round_trips_say_slow_past_a_short_attempt(answered: float, slow: bool) -> None:
    trips = RoundTrips(0.5, slow=True)
    trips.answered(answered)
    assert trips.slow is slow
