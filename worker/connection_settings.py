"""What every connection of a worker shares: the store, the handler, the default
protocol and the registered plug-ins, the metrics, the timings and the upstream
settings."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field

from worker.config import DEFAULT_MAX_BATCH_BYTES, DEFAULT_MAX_BATCH_MESSAGES, DEFAULT_PING_TIMEOUT
from worker.connect_pacing import ConnectPacer
from worker.credentials import SecretCache
from worker.delivery import AnyHandler
from worker.metrics import FleetMetrics
from worker.protocol_plugins import NO_PLUGINS, ProtocolPlugins
from worker.upstream_protocol import UpstreamProtocol
from wsfleet.lease_store import LeaseStore
from wsfleet.timing import LeaseTiming


@dataclass(frozen=True, slots=True)
class ConnectionSettings:
    """What every connection of a worker shares."""

    store: LeaseStore
    handler: AnyHandler
    protocol: UpstreamProtocol
    metrics: FleetMetrics
    timing: LeaseTiming
    worker_id: str
    wall_ms: Callable[[], int]
    rng: random.Random
    skip_failed_messages: bool = False
    ping_interval: float = 5.0
    ping_timeout: float = DEFAULT_PING_TIMEOUT
    max_message_bytes: int = 1 << 20
    max_batch_messages: int = DEFAULT_MAX_BATCH_MESSAGES
    """Messages in one batch handler call at most (``MAX_BATCH_MESSAGES``)."""
    max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES
    """Raw frame bytes read into one batch handler call at most (``MAX_BATCH_BYTES``)."""
    open_timeout: float = 10.0
    fail_after: float = 600.0
    """Seconds of failed attempts with no message handled before a connection is
    parked (``UPSTREAM_FAIL_AFTER_SECONDS``)."""
    secrets: SecretCache | None = None
    """Where connections that name a secret read their credentials (None: such a
    connection cannot connect)."""
    pacer: ConnectPacer = field(default_factory=ConnectPacer)
    """Paces every connect attempt per upstream host (``UPSTREAM_CONNECT_BURST``,
    ``UPSTREAM_CONNECTS_PER_SECOND``); the default paces nothing."""
    plugins: ProtocolPlugins = NO_PLUGINS
    """The plug-in protocols a connection's spec may name (``UPSTREAM_PROTOCOLS``)."""
