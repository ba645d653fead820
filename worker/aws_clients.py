"""boto3 clients for the worker, with timeouts that cannot eat a lease.

Endpoints come from boto3's own ``AWS_ENDPOINT_URL_<SERVICE>`` variables (the local
stack sets them); nothing here passes ``endpoint_url``.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import boto3
from botocore.config import Config

from worker.patient_calls import PatientClient, RoundTrips
from wsfleet.timing import RENEWS_IN_FLIGHT, LeaseTiming

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient
    from mypy_boto3_sqs import SQSClient

log = logging.getLogger(__name__)

_ENDPOINT_VARIABLES = (
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_DYNAMODB",
    "AWS_ENDPOINT_URL_SQS",
    "AWS_ENDPOINT_URL_SECRETS_MANAGER",
)


@dataclass(frozen=True, slots=True)
class Clients:
    dynamodb: DynamoDBClient
    """Every DynamoDB call but the session renew: short attempts, or a patient one
    while the path is slow (worker.patient_calls)."""
    dynamodb_path: RoundTrips
    """What ``dynamodb``'s calls say of the path's speed."""
    renewals: DynamoDBClient
    """The session renew's own client (docs/DESIGN.md §4): never shared."""
    sqs: SQSClient
    """Every SQS call but the long poll."""
    sqs_poll: SQSClient
    """The start queue's long poll."""
    secrets: Any
    """Secrets Manager, for connections that name a secret (worker.credentials)."""


def short_attempt(timing: LeaseTiming) -> float:
    """A third of a heartbeat, at least 0.5 s: a lost reply costs little."""
    return max(0.5, timing.heartbeat / 3)


def dynamodb_config(timing: LeaseTiming, pool_size: int) -> Config:
    """Two short attempts (:func:`short_attempt`), so a hung request is abandoned well
    before the lease is at risk; while the path is slow, calls go to the patient client
    instead (:func:`patient_config`)."""
    per_attempt = short_attempt(timing)
    return Config(
        connect_timeout=per_attempt,
        read_timeout=per_attempt,
        retries={"mode": "standard", "total_max_attempts": 2},
        max_pool_connections=pool_size,
    )


def renew_config(timing: LeaseTiming) -> Config:
    """One attempt per session renew, awaited for the whole fence window: an answer
    within it moves the fence deadline however slow it was, one after it could not.
    The keeper sends the next renew a heartbeat later meanwhile (worker.renew_plan), so
    up to :data:`RENEWS_IN_FLIGHT` requests run at once, each on a pooled connection of
    its own."""
    per_attempt = timing.renew_attempt_timeout
    return Config(
        connect_timeout=per_attempt,
        read_timeout=per_attempt,
        retries={"mode": "standard", "total_max_attempts": 1},
        max_pool_connections=RENEWS_IN_FLIGHT + 1,
    )


def patient_config(timing: LeaseTiming, pool_size: int) -> Config:
    """One attempt awaited as long as a renew's: on a path whose round trips are
    longer than a short attempt, and yet alive (the renews land), a call is answered
    here instead of landing unseen (worker.patient_calls)."""
    as_long_as_a_renew = timing.renew_attempt_timeout
    return Config(
        connect_timeout=as_long_as_a_renew,
        read_timeout=as_long_as_a_renew,
        retries={"mode": "standard", "total_max_attempts": 1},
        max_pool_connections=pool_size,
    )


def patient_dynamodb(
    short: Any, patient: Any, timing: LeaseTiming, clock: Callable[[], float] = time.monotonic
) -> PatientClient:
    """The shared DynamoDB client: ``short`` (:func:`dynamodb_config`), or ``patient``
    (:func:`patient_config`) while the path is slow."""
    return PatientClient(short, patient, RoundTrips(short_attempt(timing)), clock)


SQS_CALL_TIMEOUT = 2
"""Seconds an SQS call other than the long poll waits for its answer, per attempt."""


def sqs_config(pool_size: int) -> Config:
    """Every SQS call but the long poll (hints sent, messages deleted or handed back):
    an answer takes milliseconds, so a lost one is abandoned after two seconds, not
    after the long poll's read timeout; whoever waits on a hint (a reconcile pass, a
    release) is held up for seconds at most. At shutdown every released lease sends
    a reassign at once, from as many threads as the executor has: the pool matches it."""
    return Config(
        connect_timeout=2,
        read_timeout=SQS_CALL_TIMEOUT,
        retries={"mode": "standard", "total_max_attempts": 3},
        max_pool_connections=pool_size,
    )


def sqs_poll_config(wait_seconds: int) -> Config:
    """The long poll's own client: it holds the request open for ``wait_seconds``, so
    its read timeout must outlast that (and only it may wait that long)."""
    return Config(
        connect_timeout=2,
        read_timeout=wait_seconds + 5,
        retries={"mode": "standard", "total_max_attempts": 3},
        max_pool_connections=2,
    )


SECRETS_CONFIG = Config(
    connect_timeout=2,
    read_timeout=5,
    retries={"mode": "standard", "total_max_attempts": 2},
    max_pool_connections=8,
)
"""A secret is read at connect time, off the event loop, once per reference and cache
period: a slow answer delays that connection's attempt only (bounded by its open
timeout), never a renew."""


def make_clients(timing: LeaseTiming, *, sqs_wait_seconds: int, pool_size: int) -> Clients:
    session = boto3.session.Session()
    region: str | None = session.region_name
    if not region:
        region = "us-east-1"
        log.warning("no AWS region configured; using %s", region)
    if session.get_credentials() is None and any(os.environ.get(v) for v in _ENDPOINT_VARIABLES):
        # Local endpoints (DynamoDB Local, moto) accept any key; without one botocore
        # refuses to sign at all.
        log.warning("no AWS credentials; using placeholder ones for the local endpoints")
        session = boto3.session.Session(
            aws_access_key_id="local", aws_secret_access_key="local", region_name=region
        )
    dynamodb = patient_dynamodb(
        session.client("dynamodb", region_name=region, config=dynamodb_config(timing, pool_size)),
        session.client("dynamodb", region_name=region, config=patient_config(timing, pool_size)),
        timing,
    )
    return Clients(
        dynamodb=cast("DynamoDBClient", dynamodb),
        dynamodb_path=dynamodb.trips,
        renewals=session.client("dynamodb", region_name=region, config=renew_config(timing)),
        sqs=session.client("sqs", region_name=region, config=sqs_config(pool_size)),
        sqs_poll=session.client(
            "sqs", region_name=region, config=sqs_poll_config(sqs_wait_seconds)
        ),
        secrets=session.client("secretsmanager", region_name=region, config=SECRETS_CONFIG),
    )
