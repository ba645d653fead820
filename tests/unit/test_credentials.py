"""Credentials by reference: what a secret's value may hold, how it is cached, and that
no value ever shows in an error, a repr or a log."""

from __future__ import annotations

import asyncio
import json
import threading

import boto3
import pytest
from moto import mock_aws

from worker.credentials import (
    NOT_AN_OBJECT,
    Credentials,
    SecretCache,
    SecretError,
    parse_secret,
    secrets_manager_reader,
)

pytestmark = pytest.mark.timeout(30)

REF = "websocket-fleet/feed-a"
VALUE = "s3cr3t-value-0123456789"


def test_a_secret_with_headers_query_and_fields():
    got = parse_secret(
        REF,
        json.dumps(
            {
                "headers": {"X-API-Key": VALUE},
                "query": {"token": VALUE},
                "account": "acc-1",
                "retries": 3,  # not a string: no placeholder can name it
            }
        ),
    )
    assert dict(got.headers) == {"X-API-Key": VALUE}
    assert dict(got.query) == {"token": VALUE}
    assert dict(got.fields) == {"account": "acc-1"}


def test_every_part_is_optional():
    got = parse_secret(REF, "{}")
    assert (dict(got.headers), dict(got.query), dict(got.fields)) == ({}, {}, {})


@pytest.mark.parametrize(
    "text",
    [
        None,  # a binary secret
        VALUE,  # a bare string, not JSON
        json.dumps(VALUE),  # JSON, but not an object
        json.dumps([VALUE]),
        json.dumps({"headers": VALUE}),
        json.dumps({"headers": [VALUE]}),
        json.dumps({"headers": {"X-Key": 5}}),
        json.dumps({"query": {"token": [VALUE]}}),
        json.dumps({"query": VALUE}),
        "[" * 100_000,
    ],
)
def test_a_value_that_is_not_such_an_object_is_refused_without_the_value(text):
    with pytest.raises(SecretError) as refused:
        parse_secret(REF, text)
    assert refused.value.reason == NOT_AN_OBJECT
    assert str(refused.value) == NOT_AN_OBJECT
    assert refused.value.reference == REF
    assert refused.value.__cause__ is None
    assert refused.value.__context__ is None or refused.value.__suppress_context__


@pytest.mark.parametrize(
    "headers",
    [{"Bad Header": VALUE}, {"X-Key": VALUE + "\r\nX-Evil: 1"}, {"": VALUE}],
)
def test_a_header_that_cannot_be_sent_is_refused_by_name_only(headers):
    with pytest.raises(SecretError) as refused:
        parse_secret(REF, json.dumps({"headers": headers}))
    assert VALUE not in str(refused.value)
    assert "cannot be sent" in refused.value.reason


def test_credentials_print_names_never_values():
    got = parse_secret(
        REF, json.dumps({"headers": {"X-Key": VALUE}, "query": {"t": VALUE}, "f": VALUE})
    )
    shown = repr(got) + str(got) + f"{got!r}"
    assert VALUE not in shown
    assert "X-Key" in shown


# --- reading from Secrets Manager (moto in-process) -----------------------------------


@mock_aws
def test_reading_a_secret_and_the_errors_it_may_meet():
    client = boto3.client("secretsmanager", region_name="us-east-1")
    client.create_secret(Name=REF, SecretString=json.dumps({"headers": {"X-Key": VALUE}}))
    client.create_secret(Name="websocket-fleet/binary", SecretBinary=b"\x00\x01")
    read = secrets_manager_reader(client)
    assert json.loads(read(REF) or "") == {"headers": {"X-Key": VALUE}}
    assert read("websocket-fleet/binary") is None
    with pytest.raises(SecretError) as missing:
        read("websocket-fleet/nope")
    assert missing.value.reason == "secret not readable: ResourceNotFoundException"
    assert missing.value.reference == "websocket-fleet/nope"


# --- the cache, with a fake clock --------------------------------------------------------


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class FakeSecrets:
    """What Secrets Manager holds, read through a gate the test may close."""

    def __init__(self) -> None:
        self.values = {REF: json.dumps({"headers": {"X-Key": "v1"}})}
        self.reads: list[str] = []
        self.gate = threading.Event()
        self.gate.set()

    def read(self, reference: str) -> str | None:
        self.gate.wait(5)
        self.reads.append(reference)
        if reference not in self.values:
            raise SecretError(reference, "secret not readable: ResourceNotFoundException")
        return self.values[reference]


def key_of(credentials: Credentials) -> str:
    return credentials.headers["X-Key"]


async def test_a_value_is_read_once_per_cache_period():
    store, clock = FakeSecrets(), FakeClock()
    cache = SecretCache(store.read, ttl=300, clock=clock)
    assert key_of(await cache.get(REF)) == "v1"
    store.values[REF] = json.dumps({"headers": {"X-Key": "v2"}})
    clock.now += 299.9
    assert key_of(await cache.get(REF)) == "v1"  # still fresh
    assert store.reads == [REF]
    clock.now += 0.1
    assert key_of(await cache.get(REF)) == "v2"  # read again at the end of the period
    assert store.reads == [REF, REF]


async def test_many_connections_waiting_for_one_secret_cause_one_read():
    store = FakeSecrets()
    store.gate.clear()
    cache = SecretCache(store.read, ttl=300, clock=FakeClock())
    waiting = [asyncio.create_task(cache.get(REF)) for _ in range(20)]
    await asyncio.sleep(0.05)
    store.gate.set()
    got = await asyncio.gather(*waiting)
    assert {key_of(c) for c in got} == {"v1"}
    assert store.reads == [REF]


async def test_a_waiter_that_gives_up_does_not_cancel_the_read_of_the_others():
    store = FakeSecrets()
    store.gate.clear()
    cache = SecretCache(store.read, ttl=300, clock=FakeClock())
    impatient = asyncio.create_task(cache.get(REF))
    patient = asyncio.create_task(cache.get(REF))
    await asyncio.sleep(0.02)
    impatient.cancel()
    store.gate.set()
    assert key_of(await patient) == "v1"
    assert store.reads == [REF]


async def test_a_refused_value_is_read_again_once_however_many_were_refused():
    store, clock = FakeSecrets(), FakeClock()
    cache = SecretCache(store.read, ttl=300, clock=clock)
    used = await cache.get(REF)
    store.values[REF] = json.dumps({"headers": {"X-Key": "v2"}})
    assert cache.invalidate(REF, used)
    fresh = await cache.get(REF)
    assert key_of(fresh) == "v2"
    # Another connection refused with the old value: the fresh one stays.
    assert not cache.invalidate(REF, used)
    assert key_of(await cache.get(REF)) == "v2"
    assert store.reads == [REF, REF]


async def test_errors_are_not_cached_and_reach_every_waiter():
    store = FakeSecrets()
    cache = SecretCache(store.read, ttl=300, clock=FakeClock())
    for _ in range(2):
        with pytest.raises(SecretError, match="ResourceNotFoundException"):
            await cache.get("websocket-fleet/missing")
    assert store.reads == ["websocket-fleet/missing"] * 2
    store.values[REF] = VALUE  # not an object
    cache.invalidate(REF, Credentials())
    with pytest.raises(SecretError) as refused:
        await cache.get(REF)
    assert VALUE not in str(refused.value)


async def test_a_cache_period_of_zero_reads_at_every_use():
    store = FakeSecrets()
    cache = SecretCache(store.read, ttl=0, clock=FakeClock())
    await cache.get(REF)
    await cache.get(REF)
    assert store.reads == [REF, REF]
    assert cache.cached(REF) is None


async def test_expired_entries_are_forgotten():
    store, clock = FakeSecrets(), FakeClock()
    store.values["websocket-fleet/b"] = "{}"
    cache = SecretCache(store.read, ttl=10, clock=clock)
    await cache.get(REF)
    clock.now += 11
    await cache.get("websocket-fleet/b")
    assert cache.cached(REF) is None
    assert REF not in cache._entries  # pruned, not only stale
