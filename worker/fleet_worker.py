"""The worker process: builds its parts, and is what the reconciler and the balancer
see of it (their ``Owner`` and ``BalanceOwner`` protocols).

The parts (docs/DESIGN.md §4), each given what it needs and none holding a
reference to the worker:

- :class:`~worker.standing.Standing`: the latest session, the sessions in doubt,
  whether the worker is closing (pure);
- :class:`~worker.holdings.Holdings`: the connections held, their runners and tasks
  (bookkeeping);
- :class:`~worker.ownership.Ownership`: acquire, take over, run, hand off;
- :class:`~worker.give_back.GiveBack`: what is held but not run, released or parked;
- :class:`~worker.session_cycle.SessionCycle`: open the session, carry its renews to
  the runners, lose it, open the next, retire it;
- :class:`~worker.notices.Notices`: the router's stops and restarts, the offers of
  other workers, the own-check's rechecks;
- :class:`~worker.checkpoint_pages.CheckpointPages`: the session's page;
- :class:`~worker.lifecycle.Lifecycle`: the loops, the health stamp, the metrics, and
  the shutdown in order.
"""

from __future__ import annotations

import asyncio
import functools
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from secrets import token_hex
from typing import TYPE_CHECKING, TextIO

from worker import health, loop_watch
from worker.acquire_result import AcquireResult
from worker.balancer import Balancer
from worker.capacity import Capacity
from worker.checkpoint_pages import CheckpointPages
from worker.config import WorkerConfig
from worker.connect_pacing import ConnectPacer
from worker.connection_settings import ConnectionSettings
from worker.credentials import SecretCache
from worker.delivery import AnyHandler
from worker.give_back import GiveBack
from worker.holdings import Holdings
from worker.lifecycle import Lifecycle
from worker.metrics import FleetMetrics
from worker.notices import Notices
from worker.ownership import Ownership
from worker.patient_calls import RoundTrips
from worker.protocol_plugins import NO_PLUGINS, ProtocolPlugins
from worker.reconciler import Reconciler
from worker.session_cycle import SessionCycle
from worker.standing import Standing
from worker.start_queue import StartConsumer, StartQueue
from worker.threads import OS_THREADS, Threads
from worker.upstream_protocol import UpstreamProtocol
from wsfleet.checkpoint_page import CheckpointPage
from wsfleet.item import ConnectionItem
from wsfleet.lease_store import LeaseStore
from wsfleet.session_rules import SessionItem
from wsfleet.session_store import SessionStore

if TYPE_CHECKING:
    from mypy_boto3_sqs import SQSClient


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass(frozen=True, slots=True)
class WorkerDeps:
    store: LeaseStore
    sessions: SessionStore
    """Session listing, reaps, pages (on the shared executor)."""
    renewals: SessionStore
    """The session renew's own store: its own client, one short attempt per request."""
    sqs: SQSClient
    """Every SQS call but the long poll (short timeouts: worker.aws_clients)."""
    handler: AnyHandler
    protocol: UpstreamProtocol
    """The default protocol (``UPSTREAM_PROTOCOL``)."""
    wall_ms: Callable[[], int] = wall_clock_ms
    rng: random.Random | None = None
    secrets: SecretCache | None = None
    """Where connections that name a secret read it (None: they cannot connect)."""
    threads: Threads = OS_THREADS
    """The session renew's and the long poll's threads (worker.threads)."""
    tokens: Callable[[int], str] = token_hex
    """``tokens(n)``: ``n`` random bytes as hex (the offers' nonces)."""
    stamp_health: Callable[[], None] | None = None
    """Records that the event loop runs (None: the config's health file is touched)."""
    lag_probe_seconds: float | None = loop_watch.LAG_PROBE_SECONDS
    """How often event-loop lag is sampled (None: not sampled)."""
    metrics_out: TextIO | None = None
    """Where the EMF documents go (None: standard output)."""
    sqs_poll: SQSClient | None = None
    """The start queue's long poll, whose read timeout outlasts the poll (None: ``sqs``)."""
    plugins: ProtocolPlugins = NO_PLUGINS
    """The plug-in protocols registered by name (``UPSTREAM_PROTOCOLS``), loaded."""
    dynamodb_path: RoundTrips | None = None
    """What the shared DynamoDB client's calls say of the path (worker.patient_calls):
    slow, this worker publishes no room (None: never slow)."""


class Worker:
    def __init__(self, config: WorkerConfig, deps: WorkerDeps) -> None:
        self.config = config
        self.worker_id = config.worker_id
        self._clock: Callable[[], float] = time.monotonic
        """The event loop's clock, once :meth:`run` knows the loop (the same clock)."""
        rng = deps.rng or random.Random()
        self.capacity = Capacity(config.max_connections)
        path = deps.dynamodb_path
        self.standing = Standing(
            config.timing,
            config.max_connections,
            slow_path=(lambda: path.slow) if path is not None else (lambda: False),
        )
        self.holdings = holdings = Holdings()
        self.metrics = FleetMetrics(
            namespace=config.metrics_namespace,
            service=config.service_name,
            task_id=config.worker_id,
            active_connections=lambda: len(holdings.runners),
            out=deps.metrics_out,
        )
        settings = ConnectionSettings(
            store=deps.store,
            handler=deps.handler,
            protocol=deps.protocol,
            metrics=self.metrics,
            timing=config.timing,
            worker_id=config.worker_id,
            wall_ms=deps.wall_ms,
            rng=rng,
            skip_failed_messages=config.handler_errors == "skip",
            ping_interval=config.ping_interval,
            ping_timeout=config.ping_timeout,
            max_message_bytes=config.max_message_bytes,
            max_batch_messages=config.max_batch_messages,
            max_batch_bytes=config.max_batch_bytes,
            fail_after=config.upstream_fail_after,
            secrets=deps.secrets,
            pacer=ConnectPacer(
                config.upstream_connect_burst, config.upstream_connects_per_second, rng=rng
            ),
            plugins=deps.plugins,
        )
        self.balancer = Balancer(
            self,
            deps.sessions,
            config.balance,
            metrics=self.metrics,
            wall_ms=deps.wall_ms,
            rng=rng,
            settle=2 * config.timing.heartbeat + 1.0,
            # Read by the session renew's thread too (the load it publishes): the
            # loop's clock, which any thread may read (time.monotonic in production).
            monotonic=lambda: self._clock(),
            tokens=deps.tokens,
        )
        self.queue = StartQueue(
            deps.sqs,
            config.queue_url,
            wait_seconds=config.sqs_wait_seconds,
            threads=deps.threads,
            poll=deps.sqs_poll,
        )
        self.give_back = GiveBack(
            worker_id=config.worker_id,
            store=deps.store,
            holdings=holdings,
            standing=self.standing,
            metrics=self.metrics,
            wall_ms=deps.wall_ms,
            rng=rng,
            send_reassign=self.queue.hint_reassign,
        )
        self.ownership = Ownership(
            worker_id=config.worker_id,
            store=deps.store,
            settings=settings,
            capacity=self.capacity,
            holdings=holdings,
            standing=self.standing,
            give_back=self.give_back,
            send_reassign=self.queue.hint_reassign,
            reassign_on_release=config.reassign_on_release,
            metrics=self.metrics,
            wall_ms=deps.wall_ms,
        )
        self.consumer = StartConsumer(
            self.queue,
            capacity=self.capacity,
            acquire=self.ownership.acquire,
            retry_seconds=max(1, round(config.timing.heartbeat)),
            rng=rng,
            ready=lambda: self.standing.ready(self._clock()),
        )
        self.reconciler = Reconciler(
            store=deps.store,
            sessions=deps.sessions,
            owner=self,
            capacity=self.capacity,
            balancer=self.balancer,
            metrics=self.metrics,
            wall_ms=deps.wall_ms,
            rng=rng,
            clock=lambda: self._clock(),
        )
        self.notices = Notices(
            store=deps.store,
            holdings=holdings,
            balancer=self.balancer,
            acquire=self.ownership.acquire,
            send_reassign=self.queue.hint_reassign,
        )
        self.pages = CheckpointPages(
            worker_id=config.worker_id,
            sessions=deps.sessions,
            holdings=holdings,
            standing=self.standing,
            wall_ms=deps.wall_ms,
            every=config.timing.checkpoint,
        )
        self.session = SessionCycle(
            worker_id=config.worker_id,
            sessions=deps.sessions,
            renewals=deps.renewals,
            timing=config.timing,
            standing=self.standing,
            holdings=holdings,
            act_on_notices=self.notices.act_on,
            opened=self.pages.forget,
            connections=self.balancer.published_connections,
            metrics=self.metrics,
            threads=deps.threads,
            wall_ms=deps.wall_ms,
            rng=rng,
            round_trip=path.answered if path is not None else lambda seconds: None,
        )
        self.lifecycle = Lifecycle(
            config,
            standing=self.standing,
            holdings=holdings,
            capacity=self.capacity,
            metrics=self.metrics,
            loops={
                "start-queue": self.consumer.run,
                "reconciler": self.reconciler.run,
                "pages": self.pages.run,
            },
            open_session=self.session.open,
            retire_session=self.session.retire,
            hand_over=self.balancer.drain,
            hand_back=self.consumer.drain,
            stamp_health=deps.stamp_health or functools.partial(health.stamp, config.health_file),
            lag_probe_seconds=deps.lag_probe_seconds,
            wall_ms=deps.wall_ms,
        )

    async def run(self, stop: asyncio.Event) -> None:
        """Run until ``stop`` is set, then shut down gracefully."""
        self._clock = asyncio.get_running_loop().time
        await self.lifecycle.run(stop)

    # --- what the reconciler, the balancer and the start queue ask of the worker -------

    @property
    def session_gen(self) -> int:
        """The generation of the live session (0 while none is open, and from a reap
        until the next one is open)."""
        return self.standing.session_gen

    def own_generations(self) -> list[int]:
        return self.standing.own_generations()

    def own_check_found(self, gen: int, entries: int, checked_at: float) -> None:
        self.standing.own_check_found(gen, entries, checked_at)

    def take_doubt(self) -> bool:
        return self.standing.take_doubt()

    def holds(self, connection_id: str) -> bool:
        return self.holdings.holds(connection_id)

    def owned(self) -> dict[str, int]:
        """Connection id -> lease epoch, for every connection this worker runs."""
        return self.holdings.owned()

    def own_entries_listed(self, connection_ids: set[str]) -> None:
        self.holdings.own_entries_listed(connection_ids)

    def recently_released(self, connection_id: str) -> bool:
        return self.holdings.recently_released(connection_id, asyncio.get_running_loop().time())

    def load(self) -> tuple[int, int]:
        """Connections run now, and the capacity the session publishes (0 while closing)."""
        running = len(self.holdings.runners)
        return running, self.standing.published_capacity(running)

    def takeover_room(self, free: int) -> int:
        return self.standing.takeover_room(free)

    def movable(self) -> list[str]:
        """Connections that may be handed off: run under the open session, not ending;
        none while the path is slow (each release would take seconds, and they flow)."""
        if self.standing.slow_path():
            return []
        return self.holdings.movable(self.standing.session_gen)

    async def hand_off(self, connection_ids: Sequence[str]) -> list[str]:
        return await self.ownership.hand_off(connection_ids)

    async def acquire(self, connection_id: str) -> AcquireResult:
        return await self.ownership.acquire(connection_id)

    async def take_over(
        self, seen: ConnectionItem, session: SessionItem, page: CheckpointPage | None
    ) -> AcquireResult:
        return await self.ownership.take_over(seen, session, page)

    async def take_over_many(
        self, seen: list[ConnectionItem], session: SessionItem, page: CheckpointPage | None
    ) -> list[str]:
        return await self.ownership.take_over_many(seen, session, page)

    async def release_stray(self, seen: ConnectionItem) -> bool:
        return await self.give_back.stray(seen)

    async def send_reassign(self, connection_id: str) -> None:
        await self.queue.hint_reassign(connection_id)

    async def recheck_changed(self, seen: list[ConnectionItem]) -> None:
        await self.notices.recheck_changed(seen)

    async def write_page(self) -> bool:
        """Write the session's checkpoint page now; False when there was nothing new."""
        return await self.pages.write()
