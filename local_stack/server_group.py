"""A group of local servers for benchmarks: DynamoDB Local, moto and demo feeds on free
loopback ports, started together, with deployments (:class:`~local_stack.fleet.Deployment`)
on them. Everything is stopped in the order docs/DESIGN.md §7 asks for: every
deployment's workers and router first, then the feeds, moto and DynamoDB Local last.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from local_stack import services
from local_stack.fleet import Deployment, feed_url
from local_stack.process_env import Endpoints
from local_stack.recording import recording_settings
from local_stack.resources import DEFAULT_MAX_RECEIVE_COUNT
from local_stack.services import LOOPBACK, ManagedProcess
from worker import config as worker_settings


class LocalServers:
    """DynamoDB Local, moto (SQS) and ``feeds`` demo feed processes on free loopback
    ports, started at once, and deployments on them. Use as a context manager:
    :meth:`close` stops every deployment's workers and router, then the feeds, moto
    and DynamoDB Local (docs/DESIGN.md §7), on every way out, Ctrl-C included."""

    def __init__(
        self, work_dir: Path, *, feeds: int = 1, feed_rate: float = 5.0, kinesis: bool = False
    ) -> None:
        """``kinesis``: a sink writes to moto's Kinesis
        (:func:`~local_stack.services.start_moto_server`)."""
        self.work_dir = work_dir
        self._feed_count = feeds
        self._feed_rate = feed_rate
        self._kinesis = kinesis
        self._servers: list[ManagedProcess] = []
        """In start order: DynamoDB Local, moto, the feeds."""
        self.deployments: list[Deployment] = []
        self.endpoints = Endpoints("", "")
        self.feed_urls: list[str] = []

    def __enter__(self) -> LocalServers:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def log_dir(self) -> Path:
        return self.work_dir / "servers"

    @property
    def feed_processes(self) -> list[ManagedProcess]:
        return self._servers[2:]

    @property
    def moto_process(self) -> ManagedProcess:
        return self._servers[1]

    def start(self) -> None:
        """Start the servers in parallel; raise (once every start has ended, so none is
        left running unrecorded) if one fails."""
        self.work_dir.mkdir(parents=True, exist_ok=True)
        ddb_port, moto_port = services.free_port(), services.free_port()
        feed_ports = [services.free_port() for _ in range(self._feed_count)]
        with ThreadPoolExecutor(max_workers=2 + self._feed_count) as pool:
            futures: list[Future[ManagedProcess]] = [
                pool.submit(services.start_dynamodb_local, ddb_port, self.log_dir),
                pool.submit(
                    services.start_moto_server, moto_port, self.log_dir, kinesis=self._kinesis
                ),
                *(
                    pool.submit(services.start_feed, port, self.log_dir, self._feed_rate)
                    for port in feed_ports
                ),
            ]
            errors: list[BaseException] = []
            for future in futures:
                while True:
                    try:
                        self._servers.append(future.result())
                        break
                    except KeyboardInterrupt as error:
                        errors.append(error)  # and wait on: that server is starting
                    except Exception as error:
                        errors.append(error)
                        break
            if errors:
                raise errors[0]
        self.endpoints = Endpoints.on_ports(ddb_port, moto_port)
        self.feed_urls = [f"ws://{LOOPBACK}:{port}" for port in feed_ports]

    def deployment(
        self,
        name: str,
        *,
        worker_defaults: Mapping[str, str | None] | None = None,
        max_receive_count: int = DEFAULT_MAX_RECEIVE_COUNT,
        visibility_timeout: int = 10,
        upstream_protocols: Mapping[str, str] | None = None,
    ) -> Deployment:
        """A fresh table and start queue (names made unique), served by a router of its
        own, with a work directory ``<work_dir>/<name>``. Its workers poll SQS for 1 s,
        publish metrics every 5 s and record every delivery (:mod:`local_stack.recording`,
        under ``<work_dir>/<name>/records``), unless ``worker_defaults`` or their own
        settings say otherwise. ``upstream_protocols``: the plug-ins it registers."""
        suffix = uuid.uuid4().hex[:8]
        work_dir = self.work_dir / name
        deployment = Deployment(
            self.endpoints,
            work_dir,
            table=f"connections-{name}-{suffix}",
            queue=f"starts-{name}-{suffix}",
            worker_defaults={
                worker_settings.SQS_WAIT_SECONDS: "1",
                worker_settings.METRICS_INTERVAL_SECONDS: "5",
                **recording_settings(work_dir / "records"),
                **(worker_defaults or {}),
            },
            upstream_protocols=upstream_protocols,
        )
        self.deployments.append(deployment)
        deployment.create_resources(
            max_receive_count=max_receive_count, visibility_timeout=visibility_timeout
        )
        deployment.start_router()
        return deployment

    def feed_url(
        self, name: str, params: Mapping[str, object] | None = None, *, index: int = 0
    ) -> str:
        """``ws://.../<name>?<params>`` on feed number ``index`` (modulo the count)."""
        return feed_url(self.feed_urls[index % len(self.feed_urls)], name, params)

    def close(self) -> None:
        """Stop every deployment (workers, then router), then the feeds, moto and
        DynamoDB Local. Idempotent; runs through a Ctrl-C."""
        pending: list[BaseException] = []
        for deployment in self.deployments:
            try:
                deployment.stop_workers()
            except BaseException as error:
                pending.append(error)
        for deployment in self.deployments:
            try:
                deployment.close()
            except BaseException as error:
                pending.append(error)
        self.deployments = []
        for server in reversed(self._servers):
            try:
                server.stop()
            except BaseException as error:
                pending.append(error)
        self._servers = []
        if pending:
            raise pending[0]
