"""Real upstreams with real worker processes (lease 2 s) against DynamoDB Local, moto
(SQS and Secrets Manager) and the demo feed: credentials read from a secret at connect
time and read again after a rotation, the connection's own protocol (json-field
resumed through its subscribe frame or a URL parameter) across a crash, and the gap
a live stream reports when it moves. No secret value may reach a worker's log."""

from __future__ import annotations

import json
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from local_stack import services
from local_stack.audit import duplicate_count, lost_seqs, stale_deliveries
from local_stack.fleet import feed_url
from local_stack.services import ManagedProcess
from tests.support.feed_log import FeedService, stream_events
from tests.support.fleet import TIMING, Fleet, WorkerProcess, metric_values, wait_until
from tests.support.timing import scaled
from wsfleet import metric_names as m

pytestmark = [pytest.mark.fleet, pytest.mark.timeout(scaled(180))]

CRASH_BOUND = TIMING.crash_failover_bound()


@pytest.fixture
def keyed_feed(tmp_path: Path) -> Iterator[tuple[FeedService, Path]]:
    """A demo feed of its own whose key is the content of a file (rewritten to rotate
    it), and that file."""
    key_file = tmp_path / "feed-key"
    port = services.free_port()
    process: ManagedProcess = services.start_feed(
        port, tmp_path / "feed", rate=20.0, api_key_file=key_file
    )
    try:
        yield FeedService(f"ws://127.0.0.1:{port}", process.log_path), key_file
    finally:
        process.stop()


def secret_name() -> str:
    return f"websocket-fleet/test-{uuid.uuid4().hex[:10]}"


def owner_of(fleet: Fleet, procs: list[WorkerProcess], cid: str) -> WorkerProcess:
    owner = fleet.item(cid).lease_owner
    (proc,) = [p for p in procs if p.worker_id == owner]
    return proc


def delivered_elsewhere(fleet: Fleet, cid: str, victim: str, after: float) -> float | None:
    times = [
        r.t
        for r in fleet.records()
        if r.connection_id == cid and r.worker != victim and r.t > after
    ]
    return min(times) if times else None


def wait_for_pages(fleet: Fleet, ids: list[str]) -> None:
    """Until the owner's checkpoint page has an entry for each (one checkpoint interval
    after the take)."""
    wait_until(
        lambda: all(fleet.page_checkpoint(cid) for cid in ids),
        scaled(2 * TIMING.checkpoint + 5),
        "a checkpoint page",
    )


def assert_no_loss(fleet: Fleet, ids: list[str]) -> None:
    records = [r for r in fleet.records() if r.connection_id in ids]
    assert records
    assert stale_deliveries(records) == []
    assert lost_seqs(records) == {}


# --- credentials ---------------------------------------------------------------------------


def test_a_feed_that_requires_a_key_gets_it_from_a_secret_and_a_rotation_after_a_401(
    fleet: Fleet, keyed_feed: tuple[FeedService, Path]
):
    feed, key_file = keyed_feed
    first, second = f"key-{uuid.uuid4().hex}", f"key-{uuid.uuid4().hex}"
    key_file.write_text(first)
    name = secret_name()
    fleet.secrets.create_secret(
        Name=name, SecretString=json.dumps({"headers": {"X-Demo-Key": first}})
    )
    # Every 20 messages (a second) the feed drops the connection: the worker
    # reconnects with the credentials it holds.
    url = feed_url(feed.url, "keyed", {"require_key": 1, "drop_after": 20})
    fleet.start_connection("keyed", url)
    fleet.set_upstream("keyed", secret=name)
    worker = fleet.start_worker("w")
    fleet.wait_handling(["keyed"], scaled(15), min_seq=30)

    # Rotation: the secret first, then the upstream. The worker's cached value is
    # refused at its next reconnect; it reads the secret again and goes on.
    fleet.secrets.put_secret_value(
        SecretId=name, SecretString=json.dumps({"headers": {"X-Demo-Key": second}})
    )
    key_file.write_text(second)
    rotated_at = time.time()
    target = fleet.highest_seq("keyed") + 60
    wait_until(
        lambda: fleet.highest_seq("keyed") >= target, scaled(20), "deliveries after the rotation"
    )
    item = fleet.item("keyed")
    assert item.parked_reason is None
    reread = worker.logged("upstream refused the credentials; reading the secret again")
    assert [(e["secret"], e["status"]) for e in reread] == [(name, 401)]
    assert "HTTP 401" in feed.log_path.read_text()  # the feed did refuse the old key
    assert any(r.t > rotated_at for r in fleet.records() if r.connection_id == "keyed")
    assert_no_loss(fleet, ["keyed"])
    # The reference may be logged; a value never.
    log = worker.log()
    assert name in log
    assert first not in log
    assert second not in log


def test_a_secret_that_does_not_exist_parks_with_a_reason_free_of_values(fleet: Fleet):
    fleet.start_connection("no-secret")
    fleet.set_upstream("no-secret", secret="websocket-fleet/absent")
    fleet.start_worker("w", UPSTREAM_FAIL_AFTER_SECONDS="1")
    wait_until(lambda: fleet.item("no-secret").parked_reason is not None, scaled(15), "the park")
    assert fleet.item("no-secret").parked_reason == (
        "no message handled for 1 s: secret not readable: ResourceNotFoundException"
    )


# --- the connection's own protocol across a crash ---------------------------------------

FIELD_OPTIONS = {
    "subscribe": {
        "sequence": "/meta/n",
        "resume": "subscribe",
        "subscribe": {"op": "subscribe", "from_seq": "${from_seq}"},
    },
    "query": {"sequence": "/meta/n", "resume": "query", "resume_param": "from_seq"},
}


@pytest.mark.parametrize("resume", sorted(FIELD_OPTIONS))
def test_json_field_resumes_without_loss_across_a_sigkill_failover(
    fleet: Fleet, feed_service: FeedService, resume: str
):
    params: dict[str, object] = {"seq_field": "meta.n"}
    if resume == "subscribe":
        params["subscribe"] = 1
    ids = [f"field-{resume}-{n}" for n in range(3)]
    for cid in ids:
        fleet.start_connection(cid, fleet.feed(cid, **params))
        fleet.set_upstream(cid, protocol={"name": "json-field", "options": FIELD_OPTIONS[resume]})
    procs = [fleet.start_worker("w") for _ in range(2)]
    fleet.wait_handling(ids, scaled(15), min_seq=10)
    victim = owner_of(fleet, procs, ids[0])
    theirs = [cid for cid in ids if fleet.item(cid).lease_owner == victim.worker_id]
    wait_for_pages(fleet, theirs)  # a checkpoint page to resume from
    killed_at = time.time()
    victim.signal(signal.SIGKILL)
    victim.wait(timeout=scaled(10))

    def all_taken_over() -> list[float] | None:
        times = [delivered_elsewhere(fleet, cid, victim.worker_id, killed_at) for cid in theirs]
        return [t for t in times if t is not None] if all(times) else None

    # The point is what is delivered, not how fast: a loaded machine gets some slack.
    times = wait_until(all_taken_over, scaled(2 * CRASH_BOUND + 5), "the takeover")
    print(f"json-field ({resume}) crash failover: {max(times) - killed_at:.2f} s")
    targets = {cid: fleet.highest_seq(cid) + 10 for cid in ids}
    wait_until(
        lambda: all(fleet.highest_seq(cid) >= t for cid, t in targets.items()),
        scaled(15),
        "deliveries to go on",
    )
    assert_no_loss(fleet, ids)
    duplicates = duplicate_count(fleet.records())
    print(f"json-field ({resume}) redelivered after the crash: {duplicates}")
    if resume == "subscribe":
        # The new owner's subscribe frame asked for what came after its checkpoint.
        log = feed_service.log_path.read_text()
        for cid in theirs:
            starts = [
                int(line.rsplit("from_seq=", 1)[1].split()[0])
                for line in log.splitlines()
                if f"subscribed '{cid}'" in line
            ]
            assert starts[0] == 1
            assert max(starts) > 1


def test_json_field_hands_off_without_a_gap_or_a_duplicate(fleet: Fleet, feed_service: FeedService):
    cid = "field-term"
    fleet.start_connection(cid, fleet.feed(cid, subscribe=1, seq_field="meta.n"))
    fleet.set_upstream(cid, protocol={"name": "json-field", "options": FIELD_OPTIONS["subscribe"]})
    procs = [fleet.start_worker("w") for _ in range(2)]
    fleet.wait_handling([cid], scaled(15), min_seq=10)
    victim = owner_of(fleet, procs, cid)
    wait_for_pages(fleet, [cid])  # both sessions long listed: the drain has a receiver
    termed_at = time.time()
    victim.signal(signal.SIGTERM)
    moved = wait_until(
        lambda: delivered_elsewhere(fleet, cid, victim.worker_id, termed_at),
        scaled(10),
        "the handoff",
    )
    print(f"json-field (subscribe) handoff: {moved - termed_at:.3f} s")
    assert victim.wait(timeout=scaled(15)) == 0
    target = fleet.highest_seq(cid) + 10
    wait_until(lambda: fleet.highest_seq(cid) >= target, scaled(15), "deliveries to go on")
    assert_no_loss(fleet, [cid])
    assert duplicate_count(fleet.records()) == {}  # the final checkpoint came with the release
    subscribed = [
        line
        for line in feed_service.log_path.read_text().splitlines()
        if f"subscribed '{cid}'" in line
    ]
    assert len(subscribed) == 2
    assert not subscribed[1].endswith("from_seq=1 keys=['from_seq', 'op']")


# --- live: what it loses, stated ----------------------------------------------------------


def gap_seconds(fleet: Fleet, cid: str, victim: str, after: float) -> float:
    """The time without deliveries around the move, by the recorded deliveries."""
    records = sorted((r for r in fleet.records() if r.connection_id == cid), key=lambda r: r.t)
    last_before = max(r.t for r in records if r.worker == victim)
    first_after = min(r.t for r in records if r.worker != victim and r.t > after)
    return first_after - last_before


def test_live_reports_its_gap_after_a_sigkill_failover(fleet: Fleet):
    cid = "live-kill"
    fleet.start_connection(cid, fleet.feed(cid, live=1))
    fleet.set_upstream(cid, protocol={"name": "live"})
    procs = [fleet.start_worker("w") for _ in range(2)]
    fleet.wait_handling([cid], scaled(15), min_seq=10)
    victim = owner_of(fleet, procs, cid)
    (survivor,) = [p for p in procs if p is not victim]
    wait_for_pages(fleet, [cid])  # the gap is measured from the page's last advance
    killed_at = time.time()
    victim.signal(signal.SIGKILL)
    victim.wait(timeout=scaled(10))
    gaps = wait_until(
        lambda: metric_values(survivor, m.UPSTREAM_GAP_MS), scaled(2 * CRASH_BOUND + 5), "a gap"
    )
    observed = gap_seconds(fleet, cid, victim.worker_id, killed_at)
    (gap,) = gaps
    print(f"live crash: UpstreamGapMs {gap:.0f}, deliveries paused {observed * 1000:.0f} ms")
    # Measured from the last page's advance (up to a checkpoint interval before the
    # victim's last delivery) to the survivor's first delivery.
    assert observed * 1000 - 50 <= gap <= (observed + TIMING.checkpoint) * 1000 + 500
    assert sum(metric_values(survivor, m.UPSTREAM_GAPS)) == 1
    # The numbering goes on from the last page: every epoch's seqs are contiguous.
    records = [r for r in fleet.records() if r.connection_id == cid]
    for epoch in {r.epoch for r in records}:
        seqs = sorted(r.seq for r in records if r.epoch == epoch)
        assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))
    assert stale_deliveries(records) == []


def test_live_hands_off_with_a_short_measured_gap(fleet: Fleet, feed_service: FeedService):
    cid = "live-term"
    fleet.start_connection(cid, fleet.feed(cid, live=1))
    fleet.set_upstream(cid, protocol={"name": "live"})
    procs = [fleet.start_worker("w") for _ in range(2)]
    fleet.wait_handling([cid], scaled(15), min_seq=10)
    victim = owner_of(fleet, procs, cid)
    (survivor,) = [p for p in procs if p is not victim]
    # By its first page both workers have listed each other's session many times over:
    # the drain hands off to the survivor.
    wait_for_pages(fleet, [cid])
    termed_at = time.time()
    victim.signal(signal.SIGTERM)
    (gap,) = wait_until(
        lambda: metric_values(survivor, m.UPSTREAM_GAP_MS), scaled(10), "the handoff's gap"
    )
    assert victim.wait(timeout=scaled(15)) == 0
    observed = gap_seconds(fleet, cid, victim.worker_id, termed_at)
    print(f"live handoff: UpstreamGapMs {gap:.0f}, deliveries paused {observed * 1000:.0f} ms")
    # From the release's "advanced at" to the new owner's first delivery.
    assert abs(gap - observed * 1000) < 200
    assert gap < 2000
    # What was sent meanwhile is gone: the new owner's first message is the feed's
    # current one, not the one after the victim's last (stream opened afresh, twice).
    assert len(stream_events(feed_service.log_path, cid, "open")) == 2
    records = [r for r in fleet.records() if r.connection_id == cid]
    assert stale_deliveries(records) == []
    assert duplicate_count(records) == {}  # the handoff wrote the final checkpoint
