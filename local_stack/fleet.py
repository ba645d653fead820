"""A local fleet, for the ``python -m local_stack`` runner, the benchmarks and the tests.

- :class:`Deployment`: one table and start queue, the router in front of them (the
  Lambda handler served over HTTP by ``python -m local_stack.api_server``, in its own
  process), the workers that serve them, and connections started and stopped through
  the router's HTTP API, as users do (:class:`fleetctl.client.FleetClient`).
- :class:`~local_stack.server_group.LocalServers` starts the servers a deployment
  needs on free ports; the runner and the tests start them their own way.

Workers and router run in their own sessions and are stopped in the order
docs/DESIGN.md §7 asks for: the workers first (they release their leases), then the router,
and the servers after that.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from botocore.config import Config

from fleetctl.client import FleetClient
from local_stack import services
from local_stack.process_env import Endpoints, protocol_settings, router_env, worker_env
from local_stack.recording import recording_settings
from local_stack.resources import (
    DEFAULT_MAX_RECEIVE_COUNT,
    DEFAULT_VISIBILITY_TIMEOUT,
    DEMO_SECRET,
    Resources,
    create_demo_secret,
    create_resources,
)
from local_stack.services import LOOPBACK, ManagedProcess
from local_stack.workers import (
    WORKER_READY_TIMEOUT_S,
    StopResult,
    WorkerProcess,
    launch_worker,
    stop_workers,
    wait_ready,
)
from worker.config import timing_from_env
from wsfleet import schema
from wsfleet.item import ConnectionItem
from wsfleet.item_io import get_connection
from wsfleet.protocol_registry import UPSTREAM_PROTOCOLS
from wsfleet.session_store import SessionStore
from wsfleet.timing import LeaseTiming

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient
    from mypy_boto3_sqs import SQSClient

#: Least time workers get to release their leases after SIGTERM before SIGKILL; workers
#: with a longer shutdown budget (docs/DESIGN.md §4.8) get that plus STOP_MARGIN_S.
WORKER_STOP_TIMEOUT_S: Final = 20.0
STOP_MARGIN_S: Final = 5.0
#: The harness's own clients fail fast: they are not the system under test.
CLIENT_CONFIG: Final = Config(
    connect_timeout=2,
    read_timeout=10,
    retries={"mode": "standard", "max_attempts": 3},
    max_pool_connections=32,
)


def scan_raw(client: DynamoDBClient, table: str) -> list[dict[str, Any]]:
    """Every item of the table, typed attributes as stored (a Scan: fine for a local
    fleet, never used in AWS): connections, sessions and checkpoint pages."""
    items: list[dict[str, Any]] = []
    for page in client.get_paginator("scan").paginate(TableName=table, ConsistentRead=True):
        items.extend(page.get("Items", []))
    return items


def scan_items(client: DynamoDBClient, table: str) -> list[ConnectionItem]:
    """Every connection item of the table (a Scan: fine for a local fleet, never used
    in AWS); sessions and checkpoint pages are left out."""
    items: list[ConnectionItem] = []
    for page in client.get_paginator("scan").paginate(
        TableName=table,
        ConsistentRead=True,
        FilterExpression="#sk = :conn",
        ExpressionAttributeNames={"#sk": schema.SORT_KEY},
        ExpressionAttributeValues={":conn": {"S": schema.CONNECTION_SORT_KEY}},
    ):
        items.extend(ConnectionItem.from_dynamodb(raw) for raw in page.get("Items", []))
    return items


class Deployment:
    """One table and start queue on local servers, their router and their workers.

    Create the resources (:meth:`create_resources`), serve the router
    (:meth:`start_router`), launch workers, start connections; :meth:`close` stops
    the workers, then the router. Worker and router logs go to ``work_dir``.
    """

    def __init__(
        self,
        endpoints: Endpoints,
        work_dir: Path,
        *,
        table: str,
        queue: str,
        health_dir: Path | None = None,
        worker_defaults: Mapping[str, str | None] | None = None,
        client_config: Config = CLIENT_CONFIG,
        worker_python: str = sys.executable,
        upstream_protocols: Mapping[str, str] | None = None,
    ) -> None:
        self.endpoints = endpoints
        self.work_dir = work_dir
        self.table = table
        self.queue_name = queue
        self.health_dir = health_dir or work_dir
        self.upstream_protocols = dict(upstream_protocols or {})
        """The plug-in protocols registered (``UPSTREAM_PROTOCOLS``): the workers load
        them, the router admits their names."""
        registry = protocol_settings(self.upstream_protocols)
        self.worker_defaults: dict[str, str | None] = {
            UPSTREAM_PROTOCOLS: registry.get(UPSTREAM_PROTOCOLS),
            **(worker_defaults or {}),
        }
        """Worker variables every worker of this deployment gets (before its own)."""
        self.worker_python = worker_python
        """The interpreter the workers run on (a handler directory's virtualenv)."""
        self.workers: list[WorkerProcess] = []
        self._stop_timeout = WORKER_STOP_TIMEOUT_S
        self.router: ManagedProcess | None = None
        self.resources: Resources | None = None
        self._api: FleetClient | None = None
        self.ddb: DynamoDBClient = services.local_client(
            "dynamodb", endpoints.dynamodb, config=client_config
        )
        self.sqs: SQSClient = services.local_client("sqs", endpoints.sqs, config=client_config)
        self.secrets: Any = services.local_client(
            "secretsmanager", endpoints.secrets_manager, config=client_config
        )
        """Secrets Manager (moto): the secrets connections name."""
        work_dir.mkdir(parents=True, exist_ok=True)

    # -- resources and router

    def create_resources(
        self,
        *,
        max_receive_count: int = DEFAULT_MAX_RECEIVE_COUNT,
        visibility_timeout: int = DEFAULT_VISIBILITY_TIMEOUT,
    ) -> Resources:
        """The table with its index, the start queue and its DLQ (idempotent)."""
        self.resources = create_resources(
            self.ddb,
            self.sqs,
            table=self.table,
            queue=self.queue_name,
            max_receive_count=max_receive_count,
            visibility_timeout=visibility_timeout,
        )
        return self.resources

    def create_demo_secret(self, key: str) -> str:
        """The demo secret (``websocket-fleet/demo-feed``) holding ``key`` as the demo
        feed's header; its name."""
        create_demo_secret(self.secrets, key)
        return DEMO_SECRET

    def _created(self) -> Resources:
        if self.resources is None:
            raise RuntimeError("create the resources first")
        return self.resources

    @property
    def queue_url(self) -> str:
        return self._created().queue_url

    @property
    def dlq_url(self) -> str:
        return self._created().dlq_url

    @property
    def record_dir(self) -> Path:
        """Where workers that load :mod:`local_stack.recording` with
        :meth:`recording` settings write."""
        return self.work_dir / "records"

    def recording(self) -> dict[str, str]:
        """Worker variables that load the recording handler, writing to :attr:`record_dir`."""
        return recording_settings(self.record_dir)

    def start_router(self, port: int | None = None) -> FleetClient:
        """Serve the router on ``port`` (a free one by default), in its own process;
        returns once it accepts connections. Its log: ``<work_dir>/router-<port>.log``."""
        resources = self._created()
        env = router_env(
            os.environ,
            endpoints=self.endpoints,
            table=resources.table,
            queue_url=resources.queue_url,
            upstream_protocols=self.upstream_protocols,
        )
        chosen = services.free_port() if port is None else port
        self.router = services.start_router(chosen, self.work_dir, env)
        self._api = FleetClient(f"http://{LOOPBACK}:{chosen}")
        return self._api

    @property
    def api(self) -> FleetClient:
        """The router's HTTP API."""
        if self._api is None:
            raise RuntimeError("start the router first")
        return self._api

    # -- connections (through the router, as users start them)

    def start_connection(
        self, connection_id: str, ws_url: str, protocol: Mapping[str, Any] | None = None
    ) -> dict[str, Any]:
        """``POST /connections`` (with ``protocol``, a spec, when given); the router's
        answer (raises ApiError on a refusal)."""
        return self.api.start(ws_url, connection_id=connection_id, protocol=protocol)

    def stop_connection(self, connection_id: str) -> dict[str, Any]:
        """``DELETE /connections/{id}``; the router's answer."""
        return self.api.stop(connection_id)

    def item(self, connection_id: str) -> ConnectionItem | None:
        """The connection's item as stored (a consistent read)."""
        return get_connection(self.ddb, self._created().table, connection_id)

    def items(self) -> list[ConnectionItem]:
        return scan_items(self.ddb, self._created().table)

    def page_checkpoint(self, connection_id: str) -> int | None:
        """The checkpoint of a connection on its owner's page, when the page has an
        entry for the item's current hold; None otherwise."""
        item = self.item(connection_id)
        if item is None or item.lease_owner is None or item.owner_session_gen is None:
            return None
        store = SessionStore(self.ddb, self._created().table, LeaseTiming.from_lease())
        page = store.read_page(item.lease_owner, item.owner_session_gen)
        entry = None if page is None else page.entries.get(connection_id)
        if entry is None or entry.epoch != item.lease_epoch:
            return None
        return entry.seq

    # -- workers

    def worker_env(
        self,
        worker_id: str,
        settings: Mapping[str, str | None] | None = None,
        *,
        dynamodb_endpoint: str | None = None,
    ) -> dict[str, str]:
        """The environment of one worker: local endpoints (DynamoDB at
        ``dynamodb_endpoint`` if given, e.g. a proxy), this deployment's table and
        queue, :attr:`worker_defaults`, then ``settings``."""
        resources = self._created()
        endpoints = self.endpoints
        if dynamodb_endpoint is not None:
            endpoints = Endpoints(dynamodb_endpoint, endpoints.sqs)
        return worker_env(
            os.environ,
            endpoints=endpoints,
            table=resources.table,
            queue_url=resources.queue_url,
            worker_id=worker_id,
            health_file=self.health_file(worker_id),
            settings={**self.worker_defaults, **(settings or {})},
        )

    def health_file(self, worker_id: str) -> Path:
        return self.health_dir / f"{worker_id}.alive"

    def launch_worker(
        self, worker_id: str, env: Mapping[str, str], *, log_name: str | None = None
    ) -> WorkerProcess:
        """Start a worker with ``env`` (see :meth:`worker_env`) without waiting for it;
        its log is ``<work_dir>/<log_name or worker_id>.log``."""
        worker = launch_worker(
            worker_id,
            env,
            log_path=self.work_dir / f"{log_name or worker_id}.log",
            health_file=self.health_file(worker_id),
            python=self.worker_python,
        )
        self.workers.append(worker)
        # A worker's own shutdown (drain + release retries) is bounded by its timing;
        # stopping must give every worker at least that before SIGKILL.
        self._stop_timeout = max(
            self._stop_timeout, timing_from_env(env).shutdown_budget + STOP_MARGIN_S
        )
        return worker

    def start_workers(
        self,
        worker_ids: list[str],
        settings: Mapping[str, str | None] | None = None,
        *,
        timeout: float = WORKER_READY_TIMEOUT_S,
    ) -> list[WorkerProcess]:
        """Launch several workers at once, then wait until each is running."""
        launched = [self.launch_worker(w, self.worker_env(w, settings)) for w in worker_ids]
        wait_ready(launched, timeout)
        return launched

    def live_workers(self) -> list[WorkerProcess]:
        return [worker for worker in self.workers if worker.alive()]

    @property
    def stop_timeout(self) -> float:
        """How long :meth:`stop_workers` waits by default: the longest shutdown budget
        of the workers launched (docs/DESIGN.md §4.8) plus a margin, at least
        :data:`WORKER_STOP_TIMEOUT_S`."""
        return self._stop_timeout

    def stop_workers(
        self, timeout: float | None = None, *, hurry: Callable[[], bool] = lambda: False
    ) -> StopResult:
        """Every running worker: SIGTERM, ``timeout`` s (default :attr:`stop_timeout`)
        to release, then SIGKILL."""
        return stop_workers(self.workers, timeout or self._stop_timeout, hurry=hurry)

    # -- the end

    def stop_router(self, timeout: float = 10.0) -> int | None:
        """Stop the router (idempotent); its exit status, None if it would not die."""
        return None if self.router is None else self.router.stop(timeout)

    def close(self) -> None:
        """Stop the workers (they release their leases), then the router; close the
        clients. Idempotent; whatever happens, everything is asked to stop."""
        try:
            self.stop_workers()
        finally:
            try:
                # After an interrupted stop: no worker outlives the harness.
                for worker in self.live_workers():
                    worker.signal(signal.SIGKILL)
                self.stop_router()
            finally:
                self.close_clients()

    def close_clients(self) -> None:
        self.ddb.close()
        self.sqs.close()
        self.secrets.close()


def feed_url(base: str, name: str, params: Mapping[str, object] | None = None) -> str:
    """``<base>/<name>?<params>``: stream ``name`` of the demo feed at ``base``."""
    query = "&".join(f"{key}={value}" for key, value in (params or {}).items())
    return f"{base}/{name}" + (f"?{query}" if query else "")
