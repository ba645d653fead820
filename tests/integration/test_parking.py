"""Failing upstreams are parked, not retried forever: real worker processes against
DynamoDB Local, moto SQS and the demo feed (lease 2 s)."""

from __future__ import annotations

import json
import time

import pytest

from local_stack import services
from tests.support.fleet import TIMING, Fleet, WorkerProcess, wait_until
from tests.support.timing import scaled
from wsfleet import metric_names as m
from wsfleet import schema

pytestmark = [pytest.mark.fleet, pytest.mark.timeout(scaled(180))]


def connections_failed(worker: WorkerProcess) -> float:
    documents = [
        json.loads(line) for line in worker.log().splitlines() if line.startswith('{"_aws"')
    ]
    return sum(sum(d.get(m.CONNECTIONS_FAILED, [])) for d in documents)


def wait_parked(fleet: Fleet, connection_id: str, timeout: float) -> float:
    """Seconds until the item is parked."""
    started = time.monotonic()
    wait_until(lambda: fleet.item(connection_id).parked, timeout, f"{connection_id} to be parked")
    return time.monotonic() - started


def test_a_refused_path_is_parked_at_once_and_frees_its_slot(fleet: Fleet):
    worker = fleet.start_worker("w", MAX_CONNECTIONS="1")
    started = time.monotonic()
    fleet.start_connection("refused", fleet.feed("refused", refuse=404))
    wait_parked(fleet, "refused", scaled(10))
    print(f"start to parked (HTTP 404): {time.monotonic() - started:.2f} s")
    item = fleet.item("refused")
    assert item.parked_reason == "HTTP 404 from upstream"
    assert item.lease_owner is None
    assert item.owner_key is None
    assert item.free_shard is None
    assert item.desired_state == schema.STARTED
    # The only slot is free again: the worker takes another connection.
    fleet.start_connection("next")
    fleet.wait_handling(["next"], scaled(15))
    assert fleet.owners(["next"]) == {"next": worker.worker_id}
    # Nobody picks the parked one up again (the reconcile passes many times).
    reconciles = time.monotonic() + 3 * TIMING.reconcile
    wait_until(lambda: time.monotonic() > reconciles, scaled(10), "three reconciles")
    assert fleet.item("refused").lease_epoch == item.lease_epoch
    assert fleet.item("refused").lease_owner is None
    wait_until(
        lambda: connections_failed(worker) >= 1, scaled(10), "ConnectionsFailed in the EMF lines"
    )


def test_a_silent_upstream_is_parked_after_the_failing_time_and_a_start_re_arms_it(
    fleet: Fleet,
):
    worker = fleet.start_worker("w", UPSTREAM_FAIL_AFTER_SECONDS="3")
    fleet.start_connection("healthy")
    fleet.wait_handling(["healthy"], scaled(15))
    dead_url = f"ws://127.0.0.1:{services.free_port()}/x"
    started = time.monotonic()
    fleet.start_connection("dead", dead_url)
    wait_until(
        lambda: fleet.item("dead").failing_since_ms is not None,
        scaled(10),
        "the failing mark",
    )
    seq_before = fleet.highest_seq("healthy")
    wait_parked(fleet, "dead", scaled(3 + 10))
    took = time.monotonic() - started
    print(f"start to parked (closed port, fail after 3 s): {took:.2f} s")
    assert took >= 3
    item = fleet.item("dead")
    assert item.parked_reason == "no message handled for 3 s: connection refused"
    assert item.failing_since_ms is None
    assert item.lease_owner is None
    wait_until(
        lambda: connections_failed(worker) == 1, scaled(10), "ConnectionsFailed in the EMF lines"
    )
    # The healthy connection on the same worker flowed all along.
    assert fleet.highest_seq("healthy") > seq_before + 20

    # Re-armed through the router with a good upstream, it flows again.
    answer = fleet.start_connection("dead", fleet.feed("dead"))
    assert answer["outcome"] == "restarted"
    fleet.wait_handling(["dead"], scaled(15))
    rearmed = fleet.item("dead")
    assert (rearmed.parked_reason, rearmed.failing_since_ms) == (None, None)
    assert rearmed.lease_owner == worker.worker_id
    fleet.wait_handling(["healthy"], scaled(5), min_seq=fleet.highest_seq("healthy") + 5)


def test_the_failing_clock_survives_a_move(fleet: Fleet):
    """A worker that takes over a failing connection goes on from the recorded start."""
    first = fleet.start_worker("first", UPSTREAM_FAIL_AFTER_SECONDS="6")
    dead_url = f"ws://127.0.0.1:{services.free_port()}/x"
    fleet.start_connection("moved", dead_url)
    wait_until(
        lambda: fleet.item("moved").failing_since_ms is not None, scaled(10), "the failing mark"
    )
    since = fleet.item("moved").failing_since_ms
    assert since is not None
    second = fleet.start_worker("second", UPSTREAM_FAIL_AFTER_SECONDS="6")
    # Move it 4 s into the streak: a clock that started again would park it 10 s in.
    wait_until(lambda: time.time() * 1000 >= since + 4_000, scaled(10), "4 s of failing")
    assert fleet.item("moved").parked_reason is None
    first.stop()
    wait_parked(fleet, "moved", scaled(6 + 10))
    parked_at = fleet.item("moved").parked_at_ms
    assert parked_at is not None
    # Parked by the second worker, 6 s after the first failure, not 6 s after the move.
    assert "parking the connection" in second.log()
    assert 6_000 <= parked_at - since < 6_000 + 3_000
