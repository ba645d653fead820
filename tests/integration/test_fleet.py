"""Real worker processes (lease 2 s: heartbeat 0.5 s, reconcile 0.5 s; MAX_SKEW_SECONDS
set, and ignored) against DynamoDB Local, moto SQS and the demo feed on loopback, with a recording
handler. Bounds are the promises of docs/DESIGN.md §3.11; deadlines are about twice them."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest

from benchmarks.tcp_proxy import ProxyThread
from local_stack.audit import duplicate_count, lost_seqs, stale_deliveries
from local_stack.workers import wait_ready
from tests.support.feed_log import stream_events
from tests.support.fleet import TIMING, Fleet, WorkerProcess, wait_until
from tests.support.timing import scaled

pytestmark = [pytest.mark.fleet, pytest.mark.timeout(scaled(180))]

CRASH_BOUND = TIMING.crash_failover_bound()  # 2 + 0.1 + 0.6 + 1 = 3.7 s
HANDOFF_BOUND = 1.0
STOP_BOUND = TIMING.heartbeat + 1.0


ACCELERATED = {"EVENT_LOOP": "uvloop", "JSON_DECODER": "orjson"}
PLAIN = {"EVENT_LOOP": "asyncio", "JSON_DECODER": "json"}


@pytest.fixture(params=[ACCELERATED, PLAIN], ids=["uvloop-orjson", "asyncio-json"])
def any_loop_fleet(fleet: Fleet, request: pytest.FixtureRequest):
    """The fleet on the default event loop and JSON decoder, and on the standard
    library's: the worker must behave the same on either. Each worker's start line
    shows which it ran."""
    fleet.worker_defaults.update(request.param)
    yield fleet
    for worker in fleet.workers:
        started = [e for e in worker.events() if e.get("message") == "worker started"]
        assert started, worker.worker_id
        assert started[0]["event_loop"] == request.param["EVENT_LOOP"]
        assert started[0]["json_decoder"] == request.param["JSON_DECODER"]


def start_fleet(fleet: Fleet, workers: int, connections: int, prefix: str):
    procs = [fleet.start_worker("w") for _ in range(workers)]
    ids = [f"{prefix}-{i}" for i in range(connections)]
    for cid in ids:
        fleet.start_connection(cid)
    fleet.wait_handling(ids, scaled(15))
    return procs, ids


def busiest(fleet: Fleet, procs: list[WorkerProcess], ids: list[str]):
    owners = fleet.owners(ids)
    victim = max(procs, key=lambda p: sum(1 for o in owners.values() if o == p.worker_id))
    theirs = [cid for cid, owner in owners.items() if owner == victim.worker_id]
    assert theirs, owners
    return victim, theirs


def handled_elsewhere_at(fleet: Fleet, cid: str, victim: str, after: float) -> float | None:
    times = [
        r.t
        for r in fleet.records()
        if r.connection_id == cid and r.worker != victim and r.t > after
    ]
    return min(times) if times else None


def test_sigkill_fails_over_within_the_crash_bound(any_loop_fleet):
    fleet = any_loop_fleet
    procs, ids = start_fleet(fleet, 3, 6, "kill")
    victim, theirs = busiest(fleet, procs, ids)
    killed_at = time.time()
    victim.signal(signal.SIGKILL)
    victim.wait(timeout=scaled(10))

    def all_taken_over():
        times = [handled_elsewhere_at(fleet, cid, victim.worker_id, killed_at) for cid in theirs]
        return times if all(t is not None for t in times) else None

    times = wait_until(
        all_taken_over, scaled(2 * CRASH_BOUND), "takeover of the crashed worker's work"
    )
    failover = max(times) - killed_at
    print(f"crash failover: {failover:.2f} s (bound {CRASH_BOUND:.2f} s)")
    fleet.keep_flowing(ids)
    fleet.assert_clean_audit()
    assert all(fleet.item(cid).lease_epoch >= 2 for cid in theirs)


def test_sigterm_hands_off_within_a_second_without_gap_or_duplicate(any_loop_fleet):
    fleet = any_loop_fleet
    procs, ids = start_fleet(fleet, 3, 6, "term")
    victim, theirs = busiest(fleet, procs, ids)
    termed_at = time.time()
    victim.signal(signal.SIGTERM)

    def all_handed_off():
        times = [handled_elsewhere_at(fleet, cid, victim.worker_id, termed_at) for cid in theirs]
        return times if all(t is not None for t in times) else None

    times = wait_until(all_handed_off, scaled(2 * HANDOFF_BOUND), "graceful handoff")
    print(f"graceful handoff: {max(times) - termed_at:.3f} s (bound {HANDOFF_BOUND} s)")
    assert victim.wait(timeout=scaled(15)) == 0
    assert "worker stopped" in victim.log()
    fleet.keep_flowing(theirs)
    fleet.assert_clean_audit()
    duplicates = duplicate_count(fleet.records())
    assert {cid: duplicates.get(cid, 0) for cid in theirs} == dict.fromkeys(theirs, 0)


def test_a_batch_handler_gets_every_seq_once_in_order_across_a_graceful_handoff(any_loop_fleet):
    """``handle_batch`` instead of ``handle``: calls slow enough that frames pile up,
    so batches hold several messages; a SIGTERM hands the connections over with the
    final checkpoint. Each connection's records are every seq, in order; the old and
    the new owner share no seq; a seq comes twice only when a batch call was cut at
    the session's fence (a renew late on a busy machine) and called again whole."""
    fleet = any_loop_fleet
    batch_handler = {
        "HANDLER": "local_stack.recording:batch_factory",
        "RECORD_DELAY_SECONDS": "0.1",
    }
    procs = [fleet.start_worker("b", **batch_handler) for _ in range(2)]
    ids = [f"batch-{i}" for i in range(4)]
    for cid in ids:
        fleet.start_connection(cid)
    fleet.wait_handling(ids, scaled(15))
    victim, theirs = busiest(fleet, procs, ids)
    victim.signal(signal.SIGTERM)
    assert victim.wait(timeout=scaled(15)) == 0
    fleet.keep_flowing(ids)
    fleet.assert_clean_audit()
    records = sorted(fleet.records(), key=lambda r: r.t)
    logs = [p.log() for p in procs]
    for cid in ids:
        mine = [r for r in records if r.connection_id == cid]
        seqs = [r.seq for r in mine]
        first_time = list(dict.fromkeys(seqs))
        assert first_time == list(range(1, len(first_time) + 1)), cid
        if len(seqs) != len(first_time):
            cut = "handler call cut at the session's fence deadline"
            assert any(cut in line and cid in line for log in logs for line in log.splitlines())
        if cid in theirs:
            before = {r.seq for r in mine if r.worker == victim.worker_id}
            after = {r.seq for r in mine if r.worker != victim.worker_id}
            assert after, cid
            assert before.isdisjoint(after), (cid, sorted(before & after))
    sizes = [
        json.loads(line)["batch"]
        for path in fleet.record_dir.glob("*.jsonl")
        for line in path.read_text().splitlines()
    ]
    assert max(sizes) > 1


def test_paused_worker_handles_nothing_for_connections_it_lost(fleet):
    procs, ids = start_fleet(fleet, 3, 6, "pause")
    victim, theirs = busiest(fleet, procs, ids)
    held = {cid: fleet.item(cid).lease_epoch for cid in theirs}
    paused_at = time.time()
    victim.signal(signal.SIGSTOP)

    def all_taken_over():
        return all(handled_elsewhere_at(fleet, c, victim.worker_id, paused_at) for c in theirs)

    wait_until(all_taken_over, scaled(2 * CRASH_BOUND), "takeover while the worker is paused")
    resumed_at = time.time()
    victim.signal(signal.SIGCONT)
    # The resumed worker notices on its own: every lost connection ends there.
    wait_until(
        lambda: victim.log().count('"message":"connection ended"') >= len(theirs),
        scaled(2 * TIMING.lease),
        "the resumed worker to drop its stale connections",
    )
    fleet.keep_flowing(theirs)
    # Nothing under the epochs it lost. (Under a later one it may run them again: a
    # balance round can hand a connection back to the resumed worker's new session.)
    late = [
        r
        for r in fleet.records()
        if r.worker == victim.worker_id
        and r.connection_id in theirs
        and r.t >= resumed_at
        and r.epoch <= held[r.connection_id]
    ]
    assert late == []
    fleet.assert_clean_audit()
    assert victim.poll() is None  # alive and well after the pause


def test_a_stop_closes_the_upstream_socket_within_a_heartbeat(any_loop_fleet, feed_service):
    fleet = any_loop_fleet
    # The feed's log is the session's: a name of this run's own.
    cid = "stop-me-" + fleet.worker_defaults["EVENT_LOOP"]
    fleet.start_worker("w")
    fleet.start_connection(cid)
    fleet.wait_handling([cid], scaled(15))
    stopped_at = time.time()
    fleet.stop_connection(cid)
    # The socket as the upstream sees it: the feed logs each stream's close.
    closed = wait_until(
        lambda: stream_events(feed_service.log_path, cid, "done"),
        scaled(2 * STOP_BOUND),
        "the upstream socket to close",
    )
    print(f"stop to socket closed: {closed[0] - stopped_at:.3f} s (bound {STOP_BOUND} s)")
    wait_until(
        lambda: fleet.item(cid).lease_owner is None,
        scaled(2 * STOP_BOUND),
        "release after stop",
    )
    # Let a late delivery or a reconnect of the stopped connection show up, if there
    # were one: another connection handles ten more messages (0.5 s at 20/s) first.
    fleet.start_connection("witness")
    fleet.wait_handling(["witness"], scaled(15), min_seq=10)
    item = fleet.item(cid)
    assert item.desired_state == "STOPPED"
    assert item.owner_session_gen is None
    assert item.owner_key is None
    assert item.free_shard is None  # STOPPED: not in the unowned index
    assert item.last_seq == fleet.highest_seq(cid)  # final checkpoint written
    assert item.expires_at is not None
    assert all(r.t <= closed[0] for r in fleet.records() if r.connection_id == cid)
    assert len(stream_events(feed_service.log_path, cid, "open")) == 1  # no reconnect
    fleet.assert_clean_audit()


def test_the_reassign_hint_hands_off_without_waiting_for_a_reconcile(fleet):
    """The others reconcile only every 30 s here, so only the ``reassign`` hints a
    stopping worker sends can explain a handoff within the bound."""
    victim = fleet.start_worker("victim")
    ids = [f"hint-{i}" for i in range(4)]
    for cid in ids:
        fleet.start_connection(cid)
    fleet.wait_handling(ids, scaled(15))
    for _ in range(2):
        fleet.start_worker("slow-reconcile", RECONCILE_SECONDS="30")
    termed_at = time.time()
    victim.signal(signal.SIGTERM)

    def all_handed_off():
        times = [handled_elsewhere_at(fleet, cid, victim.worker_id, termed_at) for cid in ids]
        return times if all(t is not None for t in times) else None

    times = wait_until(all_handed_off, scaled(2 * HANDOFF_BOUND), "handoff through the hints")
    print(f"handoff through reassign hints: {max(times) - termed_at:.3f} s")
    assert victim.wait(scaled(15)) == 0
    assert victim.log().count('"message":"connection ended"') == len(ids)
    fleet.assert_clean_audit()


def test_worker_metrics_move_with_the_events_that_should_move_them(fleet):
    """A worker cut off from DynamoDB fails its session renews; the one that reaps its
    session takes its connections over and measures the takeovers; once healed, the
    cut-off worker learns of the reap and counts its connections as lost."""
    ids = [f"metrics-{i}" for i in range(3)]
    with ProxyThread() as proxies:
        proxy = proxies.add(int(fleet.endpoints.dynamodb.rsplit(":", 1)[1]))
        cut_off = fleet.launch_worker(
            "cut-off", fleet.worker_env("cut-off", dynamodb_endpoint=proxy.endpoint)
        )
        wait_ready([cut_off], scaled(30))
        for cid in ids:
            fleet.start_connection(cid)
        fleet.wait_handling(ids, scaled(15))
        survivor = fleet.start_worker("survivor")
        cut_at = time.time()
        proxy.blackhole()

        def taken_over() -> bool:
            return all(handled_elsewhere_at(fleet, c, cut_off.worker_id, cut_at) for c in ids)

        wait_until(taken_over, scaled(2 * CRASH_BOUND), "takeover of the cut-off worker's work")

        def published(worker: WorkerProcess, name: str) -> float:
            return sum(sum(doc.get(name, [0])) for doc in emf_documents(worker.log_path))

        wait_until(
            lambda: published(cut_off, "RenewFailures") >= 1,
            scaled(10),
            "RenewFailures from the cut-off worker",
        )
        wait_until(
            lambda: (
                published(survivor, "SessionsReaped") >= 1
                and published(survivor, "LeasesAcquired") >= len(ids)
            ),
            scaled(10),
            "SessionsReaped and LeasesAcquired from the survivor",
        )
        latencies = [
            v for doc in emf_documents(survivor.log_path) for v in doc.get("TakeoverLatencyMs", [])
        ]
        assert len(latencies) >= len(ids)
        assert all(0 <= v <= 1000 * 2 * CRASH_BOUND for v in latencies)
        proxy.heal()
        wait_until(
            lambda: published(cut_off, "LeasesLost") >= len(ids),
            scaled(10),
            "LeasesLost from the healed worker, which learns of the reap",
        )
    fleet.assert_clean_audit()


@pytest.mark.parametrize(
    "fault", ["drop_after=7", "close_after=6", "gap_after=5", "garbage_after=4", "mute_after=5"]
)
def test_upstream_faults_reconnect_and_resume_without_loss(fleet, fault):
    name, value = fault.split("=")
    worker = fleet.start_worker("w")
    fleet.start_connection("flaky", fleet.feed("flaky", **{name: value}))
    wait_until(lambda: fleet.highest_seq("flaky") >= 25, scaled(30), "25 seqs through the faults")
    fleet.assert_clean_audit()
    assert duplicate_count(fleet.records()) == {}
    if name != "garbage_after":  # a garbage frame is skipped, not a reason to reconnect
        assert worker.log().count('"message":"upstream connected"') >= 2


def test_poison_messages_never_crash_and_end_in_the_dlq(any_loop_fleet):
    fleet = any_loop_fleet
    worker = fleet.start_worker("w")
    for body in (
        "not json",
        json.dumps({"type": "start"}),
        json.dumps({"type": "start", "connection_id": "bad id!"}),
    ):
        fleet.sqs.send_message(QueueUrl=fleet.queue_url, MessageBody=body)
    fleet.start_connection("after-poison")
    fleet.wait_handling(["after-poison"], scaled(15))

    def dlq_depth():
        attributes = fleet.sqs.get_queue_attributes(
            QueueUrl=fleet.dlq_url, AttributeNames=["ApproximateNumberOfMessages"]
        )["Attributes"]
        return int(attributes["ApproximateNumberOfMessages"]) >= 3

    wait_until(dlq_depth, scaled(30), "poison messages in the DLQ")
    assert worker.poll() is None
    assert worker.log().count("poison message") >= 3


def test_capacity_is_never_exceeded_and_full_workers_leave_work_to_others(fleet):
    full = [fleet.start_worker("small", MAX_CONNECTIONS="2") for _ in range(2)]
    ids = [f"cap-{i}" for i in range(5)]
    for cid in ids:
        fleet.start_connection(cid)
    wait_until(
        lambda: len({r.connection_id for r in fleet.records()}) == 4,
        scaled(15),
        "four connections handled (any four: the start hints race)",
    )
    assert list(fleet.owners(ids).values()).count(None) == 1
    spare = fleet.start_worker("spare")

    def spare_took_the_rest() -> bool:
        owners = list(fleet.owners(ids).values())
        return spare.worker_id in owners and None not in owners

    wait_until(
        spare_took_the_rest,
        scaled(2 * CRASH_BOUND),
        "the spare worker to take the fifth connection",
    )
    for worker in full:
        assert max_active(worker) <= 2


def max_active(worker: WorkerProcess) -> float:
    """Highest ActiveConnections the worker published, once it has published twice."""
    wait_until(lambda: len(emf_documents(worker.log_path)) >= 2, scaled(10), "EMF metrics")
    return max(max(doc["ActiveConnections"]) for doc in emf_documents(worker.log_path))


def emf_documents(path: Path) -> list[dict]:
    docs = []
    for line in path.read_text().splitlines():
        if line.startswith('{"_aws"'):
            docs.append(json.loads(line))
    return docs


def test_failing_handler_is_retried_and_the_checkpoint_waits(fleet):
    # Eight failures take at least 2.5 s of backoff, while checkpoint pages are written
    # every 0.2 s: they must carry the checkpoint 2, not more.
    worker = fleet.start_worker(
        "w", RECORD_FAIL_SEQ="3", RECORD_FAIL_TIMES="8", CHECKPOINT_SECONDS="0.2"
    )
    fleet.start_connection("retry")
    wait_until(
        lambda: sum(r.failed for r in fleet.records() if r.seq == 3) >= 5,
        scaled(20),
        "five failures of seq 3",
    )
    page_seq = wait_until(lambda: fleet.page_checkpoint("retry"), scaled(5), "a checkpoint page")
    assert page_seq == 2  # written meanwhile, held back at 2
    assert sum(r.failed for r in fleet.records() if r.seq == 3) < 8  # still failing then
    wait_until(lambda: fleet.highest_seq("retry") >= 10, scaled(20), "seq 10 after retries")
    attempts = [r for r in fleet.records() if r.seq == 3]
    assert [r.failed for r in attempts] == [True] * 8 + [False]
    assert [r.seq for r in fleet.records()][:11] == [1, 2] + [3] * 9
    fleet.assert_clean_audit()
    wait_until(
        lambda: sum(sum(d["HandlerErrors"]) for d in emf_documents(worker.log_path)) >= 2,
        scaled(10),
        "HandlerErrors published",
    )


def test_skip_mode_moves_past_a_failing_message_and_counts_it(fleet):
    worker = fleet.start_worker(
        "w", RECORD_FAIL_SEQ="3", RECORD_FAIL_TIMES="100", HANDLER_ERRORS="skip"
    )
    fleet.start_connection("skip")
    wait_until(lambda: fleet.highest_seq("skip") >= 10, scaled(20), "seq 10 after a skip")
    attempts = [r for r in fleet.records() if r.seq == 3]
    assert [r.failed for r in attempts] == [True]
    assert lost_seqs(fleet.records()) == {"skip": [3]}  # skipped on purpose, nothing else
    wait_until(
        lambda: sum(sum(d["HandlerErrors"]) for d in emf_documents(worker.log_path)) >= 1,
        scaled(10),
        "HandlerErrors published",
    )


def test_restart_with_a_new_url_runs_the_new_stream_from_its_start(fleet):
    fleet.start_worker("w")
    fleet.start_connection("moving", fleet.feed("old-stream"))
    wait_until(
        lambda: fleet.highest_seq("moving") >= 30, scaled(20), "the old stream to pass seq 30"
    )
    fleet.stop_connection("moving")
    fleet.start_connection("moving", fleet.feed("new-stream"))
    wait_until(
        lambda: any(r.feed == "new-stream" and r.seq >= 5 for r in fleet.records()),
        scaled(2 * STOP_BOUND + 2),
        "the new stream to be handled",
    )
    new = [r for r in fleet.records() if r.feed == "new-stream"]
    assert min(r.seq for r in new) == 1
    assert sorted({r.seq for r in new}) == list(range(1, max(r.seq for r in new) + 1))
    old_epochs = {r.epoch for r in fleet.records() if r.feed == "old-stream"}
    assert min(r.epoch for r in new) > max(old_epochs)
    assert stale_deliveries(fleet.records()) == []
