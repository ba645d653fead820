"""Regression tests of the worker's hardening, with real worker processes against
DynamoDB Local, moto SQS and the demo feed (lease 2 s): a held lease always means
messages flow, every ending releases, and metrics never take a worker down."""

from __future__ import annotations

import json
import signal
import time

import pytest

from local_stack.audit import duplicate_count, lost_seqs, stale_deliveries
from tests.support.fleet import TIMING, Fleet, WorkerProcess, wait_until
from tests.support.timing import scaled
from wsfleet.metric_names import COUNTERS

pytestmark = [pytest.mark.fleet, pytest.mark.timeout(scaled(240))]

CRASH_BOUND = TIMING.crash_failover_bound()


def emf_documents(worker: WorkerProcess) -> list[dict]:
    return [json.loads(line) for line in worker.log().splitlines() if line.startswith('{"_aws"')]


def test_a_handler_raising_cancelled_error_does_not_leave_a_silent_hold(fleet: Fleet):
    fleet.start_worker("w", RECORD_FAIL_SEQ="5", RECORD_FAIL_TIMES="1", RECORD_FAIL_WITH="cancel")
    fleet.start_connection("cancel-1")
    fleet.wait_handling(["cancel-1"], scaled(15), min_seq=5)
    failed_at = max(r.t for r in fleet.records() if r.seq == 5)
    wait_until(
        lambda: fleet.highest_seq("cancel-1") >= 15,
        scaled(2 * CRASH_BOUND) + (time.time() - failed_at),
        "the connection to flow again after the handler raised CancelledError",
    )
    records = [r for r in fleet.records() if r.connection_id == "cancel-1"]
    assert [r.failed for r in records if r.seq == 5] == [True, False]  # retried, then handled
    assert lost_seqs(records) == {}
    assert stale_deliveries(records) == []


def test_a_worker_that_takes_over_100_connections_keeps_running_and_exits_cleanly(
    fleet: Fleet,
):
    """Powertools publishes a metric by itself at 100 values and empties its set; the
    period's own flush then raised, killing the metrics loop and the worker right
    after a mass takeover, and again at the final flush (exit 1). The survivor runs
    with the default 60 s period, so all 100 takeovers fall into one period."""
    victim = fleet.start_worker("victim")
    ids = [f"mass-{i}" for i in range(100)]
    for cid in ids:
        fleet.start_connection(cid, fleet.feed(cid, rate=1))
    fleet.wait_handling(ids, scaled(60), min_seq=1)
    survivor = fleet.start_worker("survivor", METRICS_INTERVAL_SECONDS="60")
    victim.signal(signal.SIGKILL)
    victim.wait(timeout=scaled(10))
    killed_at = time.time()

    def taken_over() -> bool:
        assert survivor.poll() is None, survivor.log()[-3000:]
        return fleet.handled_by_all(ids, survivor.worker_id, after=killed_at)

    wait_until(taken_over, scaled(2 * CRASH_BOUND + 30), "the survivor to take over all 100")
    survivor.signal(signal.SIGTERM)
    assert survivor.wait(timeout=scaled(60)) == 0, survivor.log()[-3000:]
    documents = emf_documents(survivor)
    assert documents
    for document in documents:
        (directive,) = document["_aws"]["CloudWatchMetrics"]
        assert directive["Dimensions"] == [["Service"], ["Service", "TaskId"]]
        assert {d["Name"] for d in directive["Metrics"]} <= set(document)
    periods = [d for d in documents if "ActiveConnections" in d]
    assert len(periods) == 1  # the final flush; each counter appears once in it
    assert all(name in periods[0] for name in COUNTERS)
    latencies = [v for d in documents for v in d.get("TakeoverLatencyMs", [])]
    assert len(latencies) == len(ids)
    assert periods[0]["LeasesAcquired"] == [float(len(ids))]
    assert "Traceback" not in survivor.log()


def test_sigterm_with_a_slow_handler_releases_with_the_final_checkpoint(fleet: Fleet):
    """Renews go on while a graceful shutdown waits for a slow call in flight; they
    used to stretch that wait past the shutdown's patience, and the leases were then
    never released."""
    worker = fleet.start_worker("slow", RECORD_DELAY_SECONDS="5")
    ids = ["slow-1", "slow-2", "slow-3"]
    for cid in ids:
        fleet.start_connection(cid)
    wait_until(
        lambda: all(fleet.handled_seqs(cid) for cid in ids),
        scaled(30),
        "a first slow call to return",
    )
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=scaled(2 * TIMING.shutdown_budget)) == 0
    for cid in ids:
        item = fleet.item(cid)
        assert item.lease_owner is None, cid
        assert item.last_seq == max(fleet.handled_seqs(cid)), cid
    assert "worker stopped" in worker.log()


def test_stop_then_start_with_the_same_url_redelivers_nothing(fleet: Fleet, tmp_path):
    """The stop is seen through the session's notices; the new start lands before the
    release. The
    release must keep the final checkpoint (same stream) and see the restart, so the
    worker takes the connection again at once (its start hint was consumed as
    "already mine"; the reconcile is 30 s away here)."""
    gate = tmp_path / "gate"
    worker = fleet.start_worker(
        "w", RECONCILE_SECONDS="30", RECORD_GATE_SEQ="4", RECORD_GATE_FILE=str(gate)
    )
    fleet.start_connection("again")
    wait_until(lambda: fleet.highest_seq("again") >= 4, scaled(15), "seq 4 to be in flight")
    fleet.stop_connection("again")
    wait_until(
        lambda: "connection stopped by notice" in worker.log(),
        scaled(2 * TIMING.heartbeat + 2),
        "the stop",
    )
    fleet.start_connection("again")
    gate.touch()
    restarted_at = time.time()
    wait_until(
        lambda: fleet.highest_seq("again") >= 10,
        scaled(2 * (TIMING.heartbeat + 1.0) + 2),
        "the restarted connection to flow",
    )
    print(f"restart to flowing again: {time.time() - restarted_at:.2f} s")
    records = [r for r in fleet.records() if r.connection_id == "again"]
    assert duplicate_count(records).get("again", 0) == 0
    assert lost_seqs(records) == {}
    assert fleet.item("again").start_gen == 2
