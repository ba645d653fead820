"""Protocol plug-ins registered by name, end to end: the router process and real
``python -m worker`` processes given one ``UPSTREAM_PROTOCOLS`` (as the local stack and
the construct give it), a start naming the example plug-in (examples/tickline) next to
one with a built-in spec on one worker, both delivering; an unknown name refused by
the router; a worker without the registry parking what names it."""

from __future__ import annotations

import json
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleetctl.client import ApiError
from local_stack import services
from local_stack.process_env import Endpoints
from local_stack.services import LOOPBACK, ManagedProcess
from tests.conftest import unique_name
from tests.support.fleet import Fleet, wait_until
from tests.support.timing import scaled

pytestmark = [pytest.mark.fleet, pytest.mark.timeout(scaled(120))]

TICKLINE = "examples.tickline.protocol:factory"
KEY = f"tk-{uuid.uuid4().hex}"
ACCOUNT = "acme"


@pytest.fixture
def tickline_url(tmp_path: Path) -> Iterator[str]:
    """The fake Tickline feed as a process of its own."""
    port = services.free_port()
    log = tmp_path / "tickline.log"
    argv = [sys.executable, "-m", "examples.tickline.fake_feed", "--port", str(port)]
    argv += ["--api-key", KEY, "--account", ACCOUNT, "--rate", "20"]
    process = ManagedProcess("tickline", services.spawn(argv, log, cwd=services.REPO_ROOT), log)
    try:
        services.wait_for_tcp(LOOPBACK, port, scaled(20))
        yield f"ws://{LOOPBACK}:{port}/tickline"
    finally:
        process.stop()


@pytest.fixture
def plugin_fleet(feed_url, dynamodb_endpoint, moto_endpoint, tmp_path) -> Iterator[Fleet]:
    """The fleet fixture's deployment, with the example plug-in registered."""
    fleet = Fleet(
        Endpoints(dynamodb_endpoint, moto_endpoint),
        tmp_path,
        table=unique_name("connections"),
        queue=unique_name("starts"),
        feed_base=feed_url,
        upstream_protocols={"tickline": TICKLINE},
    )
    try:
        fleet.create_resources(max_receive_count=2, visibility_timeout=2)
        fleet.start_router()
        yield fleet
    finally:
        fleet.close()


def tickline_secret(fleet: Fleet) -> str:
    name = f"websocket-fleet/tickline-{uuid.uuid4().hex[:8]}"
    fleet.secrets.create_secret(
        Name=name, SecretString=json.dumps({"api_key": KEY, "account": ACCOUNT})
    )
    return name


def test_one_worker_speaks_the_plugin_and_a_built_in_side_by_side(
    plugin_fleet: Fleet, tickline_url: str
) -> None:
    fleet = plugin_fleet
    secret = tickline_secret(fleet)
    started = fleet.api.start(
        tickline_url,
        connection_id="ticks",
        auth={"secret": secret},
        protocol={"name": "tickline", "options": {"channel": "quotes", "heartbeat_seconds": 0.5}},
    )
    assert started["protocol"] == {
        "name": "tickline",
        "options": {"channel": "quotes", "heartbeat_seconds": 0.5},
    }
    fleet.api.start(fleet.feed("plain"), connection_id="plain", protocol={"name": "json-seq"})
    worker = fleet.start_worker("w")

    fleet.wait_handling(["ticks", "plain"], scaled(20), min_seq=40)
    fleet.assert_clean_audit()
    assert fleet.handled_by("ticks") == fleet.handled_by("plain") == {worker.worker_id}
    for connection_id in ("ticks", "plain"):
        item = fleet.item(connection_id)
        assert item.parked_reason is None
        seqs = sorted({r.seq for r in fleet.records() if r.connection_id == connection_id})
        assert seqs == list(range(1, len(seqs) + 1))
    assert KEY not in worker.log()
    (started,) = worker.logged("worker started")
    assert (started["upstream_protocol"], started["upstream_protocols"]) == (
        "json-seq",
        ["tickline"],
    )


def test_the_router_refuses_a_name_the_deployment_does_not_have(plugin_fleet: Fleet) -> None:
    with pytest.raises(ApiError) as refused:
        plugin_fleet.api.start(
            "ws://127.0.0.1:9/x", connection_id="nope", protocol={"name": "ticklines"}
        )
    assert (refused.value.status, refused.value.code) == (400, "invalid_protocol")
    assert "['json-seq', 'json-field', 'live', 'tickline']" in refused.value.message


def test_a_worker_without_the_registry_parks_what_names_a_plugin(
    plugin_fleet: Fleet, tickline_url: str
) -> None:
    fleet = plugin_fleet
    fleet.api.start(
        tickline_url, connection_id="ticks", protocol={"name": "tickline", "options": {}}
    )
    fleet.start_worker("old", UPSTREAM_PROTOCOLS="")  # a worker of the previous deployment

    wait_until(
        lambda: fleet.item("ticks").parked_reason is not None, scaled(20), "the connection parked"
    )
    assert fleet.item("ticks").parked_reason == (
        "protocol 'tickline' is not registered on this worker (it has json-seq, json-field, live)"
    )
