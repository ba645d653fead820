"""The session renew against DynamoDB Local through a proxy that slows its round trips
(docs/DESIGN.md §3.1, §3.6): the keeper with the worker's own renew client, at the
shipped default timings (heartbeat 0.6 s, fence window 2.0 s)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from benchmarks.tcp_proxy import ProxyHandle, ProxyThread
from local_stack import services
from tests.support.session_events import Told
from tests.support.timing import scaled
from worker.aws_clients import renew_config
from worker.session import SessionKeeper
from wsfleet.session_store import SessionStore
from wsfleet.timing import LeaseTiming

DEFAULTS = LeaseTiming.from_lease()
WORKER = "slow-renewer"


@pytest.fixture
def proxy(dynamodb_endpoint: str) -> Iterator[ProxyHandle]:
    with ProxyThread() as proxies:
        yield proxies.add(int(dynamodb_endpoint.rsplit(":", 1)[1]))


def keeper_through(proxy: ProxyHandle, ddb: Any, table: str, told: Told) -> SessionKeeper:
    """An open session and its keeper, renewing through ``proxy`` with the renew
    client the worker builds (aws_clients.renew_config)."""
    SessionStore(ddb, table, DEFAULTS).open(WORKER, 1, int(time.time() * 1000), 10)
    opened_at = time.monotonic()
    client = services.local_client("dynamodb", proxy.endpoint, config=renew_config(DEFAULTS))
    return SessionKeeper(
        SessionStore(client, table, DEFAULTS),
        WORKER,
        1,
        told,  # type: ignore[arg-type]
        told.events(),
        wall_ms=lambda: time.time_ns() // 1_000_000,
        connections=lambda: 0,
        capacity=lambda: 10,
        first_renew_at=opened_at + DEFAULTS.heartbeat,
    )


def test_a_renew_answered_after_a_third_of_a_heartbeat_moves_the_fence_deadline(
    proxy: ProxyHandle, ddb: Any, table: str
):
    """Every round trip takes 0.26 s, more than a third of the 0.6 s heartbeat: the
    renews land and their answers arrive with most of the fence window left, so each
    moves the fence deadline (measured from its send) past the moment it arrived."""
    proxy.delay(0.13)  # each way
    told = Told()
    keeper = keeper_through(proxy, ddb, table, told)
    keeper.start()
    try:
        told.wait(
            lambda: len(told.landed) >= 3,
            scaled(6 * DEFAULTS.heartbeat + DEFAULTS.fence_after),
            "three renews answered in 0.26 s to land",
        )
    finally:
        keeper.stop()
    for renew in told.landed:
        assert renew.answered_at - renew.sent_at >= 0.26
        assert renew.sent_at + DEFAULTS.fence_after > renew.answered_at
    assert told.reaped == 0
    assert told.given_up == []
