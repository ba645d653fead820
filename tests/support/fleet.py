"""A fleet of real ``python -m worker`` processes against DynamoDB Local, moto SQS and
the demo feed, with scaled timings, for tests: a :class:`local_stack.fleet.Deployment`
plus questions about what its workers recorded."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from local_stack.audit import Record, load_records, lost_seqs, stale_deliveries
from local_stack.clock import now_ms, wait_until
from local_stack.fleet import Deployment, feed_url
from local_stack.process_env import Endpoints
from local_stack.recording import handled_seqs
from local_stack.workers import WORKER_READY_TIMEOUT_S, WorkerProcess, wait_ready
from tests.support.timing import scaled
from worker import config as worker_settings
from wsfleet import schema
from wsfleet.item import ConnectionItem
from wsfleet.item_io import item_key
from wsfleet.protocol_specs import parse_spec
from wsfleet.timing import LeaseTiming

__all__ = [
    "LEASE_SECONDS",
    "TIMING",
    "Fleet",
    "WorkerProcess",
    "metric_values",
    "now_ms",
    "wait_until",
]

LEASE_SECONDS = 2.0
#: The scaled timings of the contract: lease 2 s, heartbeat 0.5 s, reconcile 0.5 s,
#: checkpoint interval left at its default (its skew 0.2 s is set, and ignored).
TIMING = LeaseTiming.from_lease(LEASE_SECONDS, heartbeat=0.5, reconcile=0.5)
#: Every test worker: scaled timings, quick polls and metrics, the recording handler.
WORKER_SETTINGS = {
    worker_settings.LEASE_SECONDS: str(LEASE_SECONDS),
    worker_settings.HEARTBEAT_SECONDS: str(TIMING.heartbeat),
    worker_settings.RECONCILE_SECONDS: str(TIMING.reconcile),
    "MAX_SKEW_SECONDS": "0.2",
    worker_settings.SQS_WAIT_SECONDS: "1",
    worker_settings.METRICS_INTERVAL_SECONDS: "1",
}


class Fleet(Deployment):
    """One test's deployment: its workers start on demand, its connections start on
    streams of the session's feed."""

    def __init__(
        self,
        endpoints: Endpoints,
        work_dir: Path,
        *,
        table: str,
        queue: str,
        feed_base: str,
        upstream_protocols: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(
            endpoints, work_dir, table=table, queue=queue, upstream_protocols=upstream_protocols
        )
        self.feed_base = feed_base
        self.worker_defaults.update({**WORKER_SETTINGS, **self.recording()})

    def start_worker(self, name: str, **settings: str) -> WorkerProcess:
        """Launch a worker (id ``<name>-<n>``) with ``settings`` on top of the test
        settings, and wait until it runs."""
        worker_id = f"{name}-{len(self.workers)}"
        worker = self.launch_worker(worker_id, self.worker_env(worker_id, settings))
        wait_ready([worker], scaled(WORKER_READY_TIMEOUT_S))
        return worker

    def feed(self, name: str, **params: object) -> str:
        return feed_url(self.feed_base, name, params)

    def start_connection(self, connection_id: str, ws_url: str | None = None) -> dict[str, Any]:
        """Through the router; the stream of the same name by default."""
        return super().start_connection(connection_id, ws_url or self.feed(connection_id))

    def set_upstream(
        self,
        connection_id: str,
        *,
        protocol: dict[str, Any] | None = None,
        secret: str | None = None,
    ) -> None:
        """Store a protocol spec and a secret reference on a started connection's item,
        as a start that carries ``protocol`` and ``auth`` does (before any worker may
        take it: a worker reads them when it acquires)."""
        names: dict[str, str] = {}
        values: dict[str, Any] = {}
        if protocol is not None:
            names["#p"] = schema.PROTOCOL
            values[":p"] = {"S": parse_spec(protocol).to_item()}
        if secret is not None:
            names["#a"] = schema.AUTH_SECRET
            values[":a"] = {"S": secret}
        self.ddb.update_item(
            TableName=self.table,
            Key=item_key(connection_id),
            UpdateExpression="SET " + ", ".join(f"{n} = :{n[1:]}" for n in names),
            ExpressionAttributeNames=names,
            ExpressionAttributeValues=values,
        )

    def item(self, connection_id: str) -> ConnectionItem:
        found = super().item(connection_id)
        assert found is not None, connection_id
        return found

    def records(self) -> list[Record]:
        return load_records(self.record_dir)

    def handled_by(self, connection_id: str, *, after: float = 0.0) -> set[str]:
        return {
            r.worker for r in self.records() if r.connection_id == connection_id and r.t > after
        }

    def handled_seqs(self, connection_id: str) -> list[int]:
        """Seqs whose handler call returned."""
        return handled_seqs(self.record_dir, connection_id)

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

    def keep_flowing(self, connection_ids: list[str], more: int = 10) -> None:
        """Wait until every connection has moved ``more`` seqs past where it is now."""
        targets = {cid: self.highest_seq(cid) + more for cid in connection_ids}
        wait_until(
            lambda: all(self.highest_seq(cid) >= target for cid, target in targets.items()),
            scaled(15),
            "deliveries to continue",
        )

    def assert_clean_audit(self) -> None:
        """Something was handled, nothing under a superseded epoch, no seq lost."""
        records = self.records()
        assert records
        assert stale_deliveries(records) == []
        assert lost_seqs(records) == {}

    def owners(self, connection_ids: list[str]) -> dict[str, str | None]:
        return {cid: self.item(cid).lease_owner for cid in connection_ids}


def metric_values(worker: WorkerProcess, name: str) -> list[float]:
    """Every value of metric ``name`` in the worker's EMF lines so far."""
    values: list[float] = []
    for line in worker.log().splitlines():
        if line.startswith('{"_aws"'):
            values.extend(json.loads(line).get(name, []))
    return values
