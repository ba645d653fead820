"""A fleet of real ``python -m worker`` processes against DynamoDB Local, moto SQS
and the demo feed, with scaled timings, for tests."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from local_stack.audit import Record, load_records
from wsfleet.desired_state import DesiredStateStore, StartOutcome
from wsfleet.item import ConnectionItem
from wsfleet.lease_store import LeaseStore
from wsfleet.start_messages import START, StartMessage
from wsfleet.timing import LeaseTiming

REPO_ROOT = Path(__file__).resolve().parents[2]
LEASE_SECONDS = 2.0
TIMING = LeaseTiming.from_lease(LEASE_SECONDS)


def wait_until(predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.05):
    """Poll ``predicate`` until it returns something truthy; fail after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


@dataclass
class WorkerProcess:
    worker_id: str
    popen: subprocess.Popen[bytes]
    log_path: Path

    def signal(self, signum: signal.Signals) -> None:
        self.popen.send_signal(signum)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


@dataclass
class Fleet:
    ddb: Any
    sqs: Any
    table: str
    queue_url: str
    dlq_url: str
    feed_url: str
    endpoints: dict[str, str]
    work_dir: Path
    workers: list[WorkerProcess] = field(default_factory=list)

    @property
    def record_dir(self) -> Path:
        return self.work_dir / "records"

    @property
    def leases(self) -> LeaseStore:
        return LeaseStore(self.ddb, self.table, TIMING)

    @property
    def control(self) -> DesiredStateStore:
        return DesiredStateStore(self.ddb, self.table)

    def start_worker(self, name: str, **env: str) -> WorkerProcess:
        worker_id = f"{name}-{len(self.workers)}"
        log_path = self.work_dir / f"{worker_id}.log"
        environment = {
            **os.environ,
            "AWS_ACCESS_KEY_ID": "local",
            "AWS_SECRET_ACCESS_KEY": "local",
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_ENDPOINT_URL_DYNAMODB": self.endpoints["dynamodb"],
            "AWS_ENDPOINT_URL_SQS": self.endpoints["sqs"],
            "AWS_ENDPOINT_URL_CLOUDWATCH": self.endpoints["sqs"],
            "TABLE_NAME": self.table,
            "QUEUE_URL": self.queue_url,
            "WORKER_ID": worker_id,
            "LEASE_SECONDS": str(LEASE_SECONDS),
            "SQS_WAIT_SECONDS": "1",
            "METRICS_INTERVAL_SECONDS": "1",
            "HEALTH_FILE": str(self.work_dir / f"{worker_id}.alive"),
            "HANDLER": "tests.support.recording_handler:factory",
            "RECORD_DIR": str(self.record_dir),
            "PYTHONPATH": str(REPO_ROOT),
            **env,
        }
        with log_path.open("wb") as log:
            popen = subprocess.Popen(
                [sys.executable, "-m", "worker"],
                cwd=REPO_ROOT,
                env=environment,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        process = WorkerProcess(worker_id, popen, log_path)
        self.workers.append(process)
        wait_until(
            lambda: "worker started" in process.log() or popen.poll() is not None,
            30,
            f"{worker_id} to start",
        )
        assert popen.poll() is None, process.log()
        return process

    def feed(self, name: str, **params: object) -> str:
        query = "&".join(f"{k}={v}" for k, v in params.items())
        return f"{self.feed_url}/{name}" + (f"?{query}" if query else "")

    def start_connection(self, connection_id: str, ws_url: str | None = None) -> StartOutcome:
        """What the router does: write the desired state, then send one start hint."""
        url = ws_url or self.feed(connection_id)
        outcome = self.control.start(connection_id, url, now_ms()).outcome
        if outcome.sends_start_message:
            self.sqs.send_message(
                QueueUrl=self.queue_url, MessageBody=StartMessage(START, connection_id).to_body()
            )
        return outcome

    def item(self, connection_id: str) -> ConnectionItem:
        found = self.leases.get(connection_id)
        assert found is not None, connection_id
        return found

    def records(self) -> list[Record]:
        return load_records(self.record_dir)

    def handled_by(self, connection_id: str, *, after: float = 0.0) -> set[str]:
        return {
            r.worker for r in self.records() if r.connection_id == connection_id and r.t > after
        }

    def handled_seqs(self, connection_id: str) -> list[int]:
        """Seqs whose handler call returned (``handled-*.txt`` of the recording handler)."""
        seqs: list[int] = []
        for path in sorted(self.record_dir.glob("handled-*.txt")):
            for line in path.read_text().splitlines():
                cid, _, seq = line.partition(" ")
                if cid == connection_id and seq.isdigit():
                    seqs.append(int(seq))
        return seqs

    def handled_by_all(self, connection_ids: list[str], worker_id: str, *, after: float) -> bool:
        """Every connection has a delivery by ``worker_id`` after ``after``."""
        seen = {r.connection_id for r in self.records() if r.worker == worker_id and r.t > after}
        return set(connection_ids) <= seen

    def highest_seq(self, connection_id: str) -> int:
        return max((r.seq for r in self.records() if r.connection_id == connection_id), default=0)

    def wait_handling(self, connection_ids: list[str], timeout: float, *, min_seq: int = 3) -> None:
        def all_flowing() -> bool:
            records = self.records()
            return all(
                any(r.connection_id == cid and r.seq >= min_seq for r in records)
                for cid in connection_ids
            )

        wait_until(all_flowing, timeout, f"deliveries on {connection_ids}")

    def owners(self, connection_ids: list[str]) -> dict[str, str | None]:
        return {cid: self.item(cid).lease_owner for cid in connection_ids}

    def stop_all(self) -> None:
        for worker in self.workers:
            if worker.popen.poll() is None:
                try:
                    worker.popen.send_signal(signal.SIGCONT)
                    worker.popen.terminate()
                    worker.popen.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    worker.popen.kill()
                    worker.popen.wait(timeout=15)


def now_ms() -> int:
    return time.time_ns() // 1_000_000
