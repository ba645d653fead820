"""The shared DynamoDB client: short attempts on a fast path, a patient one while the
latest answer (a renew's or a call's) took longer than a short attempt."""

from __future__ import annotations

from typing import Any

import pytest
from botocore.exceptions import ClientError, ReadTimeoutError

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
        self.retries = 0
        self.landed: list[str] = []
        self.answer: ClientError | None = None
        self.region = "r"

    def put_item(self, **kwargs: Any) -> dict[str, Any]:
        self.landed.append(kwargs["Item"])
        self.clock.now += min(self.took, self.timeout)
        if self.took > self.timeout:
            raise ReadTimeoutError(endpoint_url="https://x")
        if self.answer is not None:
            raise self.answer
        return {"ok": kwargs["Item"], "ResponseMetadata": {"RetryAttempts": self.retries}}


def _client() -> tuple[PatientClient, Path, Path]:
    clock = Clock()
    short, patient = Path(clock, 0.5), Path(clock, 1.98)
    return PatientClient(short, patient, RoundTrips(0.5), clock), short, patient


def test_a_fast_path_uses_the_short_client_only() -> None:
    client, short, patient = _client()
    assert client.put_item(Item="a")["ok"] == "a"
    assert (short.landed, patient.landed, client.trips.slow) == (["a"], [], False)


def test_a_renew_slower_than_a_short_attempt_sends_the_calls_to_the_patient_client() -> None:
    client, short, patient = _client()
    client.trips.answered(0.8)  # a renew answered after 0.8 s
    short.took = patient.took = 0.8
    assert client.put_item(Item="a")["ok"] == "a"
    assert (short.landed, patient.landed, client.trips.slow) == ([], ["a"], True)
    # Fast again: an answer within a short attempt sends the calls back.
    patient.took = short.took = 0.1
    client.put_item(Item="b")
    assert client.trips.slow is False
    client.put_item(Item="c")
    assert (short.landed, patient.landed) == (["c"], ["a", "b"])


def test_a_timeout_tells_nothing_of_the_path() -> None:
    """A short attempt that times out may have lost its reply on a fast path, or its
    request in a partition: nothing changes, and no patient attempt follows (in a
    partition it would hold the caller for a renew window)."""
    client, short, patient = _client()
    short.took = 3.0
    with pytest.raises(ReadTimeoutError):
        client.put_item(Item="a")
    assert (short.landed, patient.landed, client.trips.slow) == (["a"], [], False)


def test_an_answer_after_retries_does_not_time_the_path() -> None:
    """An answer that came after botocore's retries (a lost reply, a throttle's
    backoff) took as long as the retries: it says nothing of one round trip."""
    client, short, _ = _client()
    short.timeout = 2.0  # the time of both attempts, as the caller sees it
    short.took, short.retries = 0.9, 1
    client.put_item(Item="a")
    assert client.trips.slow is False


def test_an_error_answer_is_an_answer() -> None:
    client, _, patient = _client()
    client.trips.answered(0.8)
    patient.took = 0.1
    patient.answer = ClientError(
        {"Error": {"Code": "ConditionalCheckFailedException"}, "ResponseMetadata": {}},
        "PutItem",
    )
    with pytest.raises(ClientError):
        client.put_item(Item="a")
    assert client.trips.slow is False


def test_attributes_that_are_not_calls_are_the_short_clients() -> None:
    client, _, _ = _client()
    assert client.region == "r"


@pytest.mark.parametrize(
    ("answered", "slow", "changed"),
    [(0.1, False, True), (0.5, False, True), (0.51, True, False), (1.9, True, False)],
)
def test_round_trips_say_slow_past_a_short_attempt(
    answered: float, slow: bool, changed: bool
) -> None:
    trips = RoundTrips(0.5, slow=True)
    assert trips.answered(answered) is changed
    assert trips.slow is slow
