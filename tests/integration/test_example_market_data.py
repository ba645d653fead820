"""examples/market_data as its README runs it, with real workers (lease 2 s) against
DynamoDB Local, moto (SQS and Secrets Manager) and the example's fake feed as its own
process: a connection started through the router's API with ``auth`` and
``protocol``, the example handler on the workers, a SIGKILL of the owner. What the
handler receives is what the README shows, nothing is lost, and no secret value
reaches a log."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from examples.market_data import fake_feed
from examples.market_data.handler import RECORD_FILE_ENV
from local_stack import services
from local_stack.audit import duplicate_count, lost_seqs, stale_deliveries
from local_stack.services import ManagedProcess
from tests.support.fleet import TIMING, Fleet, wait_until
from tests.support.timing import scaled

pytestmark = [pytest.mark.fleet, pytest.mark.timeout(scaled(180))]

HANDLER = "examples.market_data.handler:factory"
SYMBOLS = ["BTC-USD", "ETH-USD", "SOL-USD"]
PATH = "/v1/trades"
RATE = 20.0
#: The protocol of examples/market_data/README.md.
PROTOCOL = {
    "name": "json-field",
    "options": {
        "sequence": "/sequence",
        "payload": "/data",
        "resume": "subscribe",
        "subscribe": {
            "op": "subscribe",
            "channel": "trades",
            "symbols": SYMBOLS,
            "token": "${secret:token}",
            "from_sequence": "${from_seq}",
        },
    },
}


@dataclass(frozen=True)
class MarketFeed:
    url: str
    process: ManagedProcess
    api_key: str
    token: str


@pytest.fixture
def market_feed(tmp_path: Path) -> Iterator[MarketFeed]:
    """The example's fake feed, its key and token random per test."""
    api_key, token = f"key-{uuid.uuid4().hex}", f"token-{uuid.uuid4().hex}"
    (tmp_path / "api-key").write_text(api_key)
    (tmp_path / "token").write_text(token)
    port = services.free_port()
    argv = [sys.executable, "-m", "examples.market_data.fake_feed", "--port", str(port)]
    argv += ["--rate", str(RATE), "--api-key-file", str(tmp_path / "api-key")]
    argv += ["--token-file", str(tmp_path / "token")]
    log_path = tmp_path / "market-feed.log"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    process = ManagedProcess(
        "market-feed", services.spawn(argv, log_path, cwd=services.REPO_ROOT, env=env), log_path
    )
    try:
        ready = f"fake market feed listening on ws://127.0.0.1:{port}"
        wait_until(
            lambda: ready in log_path.read_text() or not process.alive(),
            scaled(15),
            "the fake feed to listen",
        )
        assert process.alive(), process.log_tail()
        yield MarketFeed(f"ws://127.0.0.1:{port}", process, api_key, token)
    finally:
        process.stop()


def deliveries(fleet: Fleet) -> list[dict[str, Any]]:
    """Every line the example handler recorded, per worker in the order written."""
    lines: list[dict[str, Any]] = []
    for path in sorted(fleet.record_dir.glob("*.jsonl")):
        lines.extend(json.loads(line) for line in path.read_text().splitlines())
    return lines


def subscriptions(feed: MarketFeed) -> list[int]:
    """The ``from_sequence`` of each subscription the feed accepted on PATH."""
    marker = f"{PATH}: subscribed to {SYMBOLS} from sequence "
    return [
        int(line.split(marker, 1)[1])
        for line in feed.process.log_path.read_text().splitlines()
        if marker in line
    ]


def test_the_market_data_example_delivers_trades_and_resumes_after_a_sigkill(
    fleet: Fleet, market_feed: MarketFeed
):
    feed = market_feed
    secret = f"websocket-fleet/market-data-{uuid.uuid4().hex[:10]}"
    fleet.secrets.create_secret(
        Name=secret,
        SecretString=json.dumps({"headers": {"X-API-Key": feed.api_key}, "token": feed.token}),
    )
    fleet.record_dir.mkdir(parents=True, exist_ok=True)
    procs = [
        fleet.start_worker(
            "w", HANDLER=HANDLER, **{RECORD_FILE_ENV: str(fleet.record_dir / f"w-{n}.jsonl")}
        )
        for n in range(2)
    ]
    cid = "btc-eth-sol"
    started = fleet.api.start(
        feed.url + PATH, connection_id=cid, auth={"secret": secret}, protocol=PROTOCOL
    )
    assert (started["outcome"], started["auth"], started["protocol"]) == (
        "created",
        {"secret": secret},
        PROTOCOL,
    )
    fleet.wait_handling([cid], scaled(20), min_seq=20)

    # What the handler receives: the value at /data of each trade message.
    first = deliveries(fleet)[0]
    assert (first["connection_id"], first["epoch"], first["seq"]) == (cid, 1, 1)
    for line in deliveries(fleet):
        payload = line["payload"]
        assert sorted(payload) == ["price", "size", "symbol", "ts"]
        assert {k: payload[k] for k in ("symbol", "price", "size")} == fake_feed.trade(
            PATH, line["seq"], SYMBOLS
        )
        assert isinstance(payload["ts"], int)
    victim = next(p for p in procs if p.worker_id == fleet.item(cid).lease_owner)
    (survivor,) = [p for p in procs if p is not victim]
    trade_line = f"trade {cid} 1 1 {first['payload']['symbol']} {first['payload']['price']}"
    assert victim.logged(trade_line), "the handler's log line"

    # A checkpoint page to resume from, then the crash.
    wait_until(lambda: fleet.page_checkpoint(cid), scaled(2 * TIMING.checkpoint + 5), "a page")
    killed_at = time.time()
    victim.signal(signal.SIGKILL)
    victim.wait(timeout=scaled(10))
    wait_until(
        lambda: survivor.worker_id in fleet.handled_by(cid, after=killed_at),
        scaled(30),
        "the survivor's deliveries",
    )
    print(f"market data crash failover: {time.time() - killed_at:.2f} s")
    fleet.keep_flowing([cid], more=20)

    records = [r for r in fleet.records() if r.connection_id == cid]
    assert stale_deliveries(records) == []
    assert lost_seqs(records) == {}
    # In order: each owner delivered consecutive seqs, the survivor from its resume point.
    lines = deliveries(fleet)
    for worker in {line["worker"] for line in lines}:
        seqs = [line["seq"] for line in lines if line["worker"] == worker]
        assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), worker
    resumed_from = min(line["seq"] for line in lines if line["worker"] == survivor.worker_id)
    assert resumed_from > 1
    # The survivor's subscribe frame asked the feed for exactly that.
    subscribed = subscriptions(feed)
    assert subscribed[0] == 1
    assert resumed_from in subscribed[1:]
    # Redelivered: only what the victim handled after its last checkpoint page.
    victim_times = {line["seq"]: line["t"] for line in lines if line["worker"] == victim.worker_id}
    redelivered = list(range(resumed_from, max(victim_times) + 1))
    print(f"market data redelivered after the crash: {len(redelivered)}")
    assert duplicate_count(records) == ({cid: len(redelivered)} if redelivered else {})
    window = TIMING.checkpoint + scaled(2)
    assert all(victim_times[seq] >= killed_at - window for seq in redelivered)

    # The secret's values reach no worker's log, nor the feed's.
    for proc in procs:
        log = proc.log()
        assert feed.api_key not in log
        assert feed.token not in log
    feed_log = feed.process.log_path.read_text()
    assert feed.api_key not in feed_log
    assert feed.token not in feed_log
    assert feed.process.stop() == 0  # the fake feed exits 0 on SIGTERM
