"""Worker settings, read from the environment in one place (docs/DESIGN.md §4.9)."""

from __future__ import annotations

import math
import os
import secrets
import socket
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from wsfleet import accelerators
from wsfleet.balance_rules import BalanceSettings
from wsfleet.protocol_registry import (
    FACTORY_PATTERN,
    UPSTREAM_PROTOCOLS,
    InvalidRegistryError,
    parse_registry,
)
from wsfleet.timing import DEFAULT_LEASE_SECONDS, InvalidTimingError, LeaseTiming

TABLE_NAME: Final = "TABLE_NAME"
QUEUE_URL: Final = "QUEUE_URL"
WORKER_ID: Final = "WORKER_ID"
LEASE_SECONDS: Final = "LEASE_SECONDS"
HEARTBEAT_SECONDS: Final = "HEARTBEAT_SECONDS"
RECONCILE_SECONDS: Final = "RECONCILE_SECONDS"
REMOVED_SETTINGS: Final = {
    "MAX_SKEW_SECONDS": "wall clocks no longer decide expiry (each worker observes the"
    " sessions on its own monotonic clock), so there is no skew to allow for",
}
"""Settings an earlier version read, and why they are gone: ignored, with a warning
(:func:`ignored_settings`), so an environment that still sets one starts as before."""
CHECKPOINT_SECONDS: Final = "CHECKPOINT_SECONDS"
MAX_CONNECTIONS: Final = "MAX_CONNECTIONS"
REASSIGN_ON_RELEASE: Final = "REASSIGN_ON_RELEASE"
UPSTREAM_PROTOCOL: Final = "UPSTREAM_PROTOCOL"
HANDLER_ERRORS: Final = "HANDLER_ERRORS"
METRICS_NAMESPACE: Final = "METRICS_NAMESPACE"
SERVICE_NAME: Final = "SERVICE_NAME"
HANDLER: Final = "HANDLER"
METRICS_INTERVAL_SECONDS: Final = "METRICS_INTERVAL_SECONDS"
HEALTH_FILE: Final = "HEALTH_FILE"
SQS_WAIT_SECONDS: Final = "SQS_WAIT_SECONDS"
PING_INTERVAL_SECONDS: Final = "PING_INTERVAL_SECONDS"
PING_TIMEOUT_SECONDS: Final = "PING_TIMEOUT_SECONDS"
MAX_MESSAGE_BYTES: Final = "MAX_MESSAGE_BYTES"
MAX_BATCH_MESSAGES: Final = "MAX_BATCH_MESSAGES"
MAX_BATCH_BYTES: Final = "MAX_BATCH_BYTES"
UPSTREAM_FAIL_AFTER_SECONDS: Final = "UPSTREAM_FAIL_AFTER_SECONDS"
UPSTREAM_CONNECT_BURST: Final = "UPSTREAM_CONNECT_BURST"
UPSTREAM_CONNECTS_PER_SECOND: Final = "UPSTREAM_CONNECTS_PER_SECOND"
LOG_LEVEL: Final = "LOG_LEVEL"
BALANCE_ROUND_SECONDS: Final = "BALANCE_ROUND_SECONDS"
BALANCE_TOLERANCE: Final = "BALANCE_TOLERANCE"
BALANCE_MOVE_FRACTION: Final = "BALANCE_MOVE_FRACTION"
SECRET_CACHE_SECONDS: Final = "SECRET_CACHE_SECONDS"
EVENT_LOOP: Final = "EVENT_LOOP"
JSON_DECODER: Final = "JSON_DECODER"

SETTINGS: Final = frozenset(
    {
        TABLE_NAME,
        QUEUE_URL,
        WORKER_ID,
        LEASE_SECONDS,
        HEARTBEAT_SECONDS,
        RECONCILE_SECONDS,
        CHECKPOINT_SECONDS,
        MAX_CONNECTIONS,
        REASSIGN_ON_RELEASE,
        UPSTREAM_PROTOCOL,
        UPSTREAM_PROTOCOLS,
        HANDLER_ERRORS,
        METRICS_NAMESPACE,
        SERVICE_NAME,
        HANDLER,
        METRICS_INTERVAL_SECONDS,
        HEALTH_FILE,
        SQS_WAIT_SECONDS,
        PING_INTERVAL_SECONDS,
        PING_TIMEOUT_SECONDS,
        MAX_MESSAGE_BYTES,
        MAX_BATCH_MESSAGES,
        MAX_BATCH_BYTES,
        UPSTREAM_FAIL_AFTER_SECONDS,
        UPSTREAM_CONNECT_BURST,
        UPSTREAM_CONNECTS_PER_SECOND,
        LOG_LEVEL,
        BALANCE_ROUND_SECONDS,
        BALANCE_TOLERANCE,
        BALANCE_MOVE_FRACTION,
        SECRET_CACHE_SECONDS,
        EVENT_LOOP,
        JSON_DECODER,
    }
)
"""Every variable :meth:`WorkerConfig.from_env` reads: what a deployment may set
(``workerSettings``, checked with :func:`check_names`). boto3's endpoint variables are
boto3's, not the worker's."""

DEFAULT_HEALTH_FILE: Final = "/tmp/websocket-fleet-worker.alive"
DEFAULT_PING_TIMEOUT: Final = 5.0
"""Seconds a keepalive ping waits for its pong (``PING_TIMEOUT_SECONDS``)."""
DEFAULT_MAX_BATCH_MESSAGES: Final = 500
"""Messages in one batch handler call at most (``MAX_BATCH_MESSAGES``)."""
DEFAULT_MAX_BATCH_BYTES: Final = 4 << 20
"""Raw frame bytes read into one batch handler call at most (``MAX_BATCH_BYTES``)."""


class ConfigError(ValueError):
    """A missing or malformed setting; the message names the variable."""


@dataclass(frozen=True, slots=True)
class WorkerConfig:
    table_name: str
    queue_url: str
    worker_id: str
    timing: LeaseTiming
    max_connections: int = 500
    reassign_on_release: bool = True
    upstream_protocol: str = "json-seq"
    """The protocol of connections whose item names none: ``json-seq``, a name of
    :attr:`upstream_protocols`, or a ``module:factory`` plug-in."""
    upstream_protocols: Mapping[str, str] = field(default_factory=dict)
    """Plug-in protocols by name (``UPSTREAM_PROTOCOLS``), which a start may name."""
    handler_errors: str = "retry"
    metrics_namespace: str = "WebSocketFleet"
    service_name: str = "websocket-fleet"
    handler: str | None = None
    metrics_interval: float = 60.0
    health_file: Path = Path(DEFAULT_HEALTH_FILE)
    sqs_wait_seconds: int = 10
    ping_interval: float = 5.0
    ping_timeout: float = DEFAULT_PING_TIMEOUT
    """How long a keepalive ping may wait for its pong before the upstream connection
    is given up (and resumed). Longer than the interval: an event loop busy with
    hundreds of handshakes (a mass takeover, a drain) answers late, and a timeout as
    short as the 1 s interval turned that into reconnects of healthy upstreams."""
    max_message_bytes: int = 1 << 20
    max_batch_messages: int = DEFAULT_MAX_BATCH_MESSAGES
    """A batch handler's call carries at most this many messages; the rest stay
    buffered for the next call."""
    max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES
    """A batch handler's call carries at most this many bytes of frames as received
    (one message larger than that goes alone)."""
    upstream_fail_after: float = 600.0
    """Seconds of failed upstream attempts with no message handled before a connection
    is parked (docs/DESIGN.md §4.4)."""
    upstream_connect_burst: int = 200
    """Upstream connects per host that go at once after an idle period; 0: no pacing
    (docs/DESIGN.md §4.4, "Connect pacing")."""
    upstream_connects_per_second: float = 100.0
    """Upstream connects per host and second past the burst; 0: no pacing."""
    log_level: str = "INFO"
    secret_cache_seconds: float = 300.0
    """How long a secret's value read for a connection is used before it is read
    again (docs/DESIGN.md §4.4, "Credentials"); 0: read at every connection attempt."""
    event_loop: str = field(default_factory=accelerators.default_event_loop)
    """``asyncio`` or ``uvloop`` (the default where it is installed)."""
    json_decoder: str = field(default_factory=accelerators.default_json_decoder)
    """How the built-in protocols decode frames: ``orjson`` (the default where it is
    installed) or ``json`` (worker/json_decoding.py says what differs)."""
    balance: BalanceSettings | None = field(default_factory=BalanceSettings)
    """How the fleet is kept balanced (docs/DESIGN.md §4.3); None: never rebalanced
    (``BALANCE_ROUND_SECONDS=0``)."""

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> WorkerConfig:
        env = os.environ if env is None else env
        timing = timing_from_env(env)
        handler_errors = env.get(HANDLER_ERRORS, "retry").strip().lower()
        if handler_errors not in ("retry", "skip"):
            raise ConfigError(f"{HANDLER_ERRORS} must be 'retry' or 'skip', got {handler_errors!r}")
        max_connections = _int(env, MAX_CONNECTIONS, 500)
        if max_connections < 1:
            raise ConfigError(f"{MAX_CONNECTIONS} must be >= 1")
        sqs_wait = _int(env, SQS_WAIT_SECONDS, 10)
        if not 0 <= sqs_wait <= 20:
            raise ConfigError(f"{SQS_WAIT_SECONDS} must be 0..20 (SQS long-poll limit)")
        secret_cache = _opt_float(env, SECRET_CACHE_SECONDS)
        if secret_cache is not None and not 0 <= secret_cache <= 86400:
            raise ConfigError(f"{SECRET_CACHE_SECONDS} must be from 0 to 86400, got {secret_cache}")
        max_batch_messages = _int(env, MAX_BATCH_MESSAGES, DEFAULT_MAX_BATCH_MESSAGES)
        if max_batch_messages < 1:
            raise ConfigError(f"{MAX_BATCH_MESSAGES} must be >= 1, got {max_batch_messages}")
        max_batch_bytes = _int(env, MAX_BATCH_BYTES, DEFAULT_MAX_BATCH_BYTES)
        if max_batch_bytes < 1:
            raise ConfigError(f"{MAX_BATCH_BYTES} must be >= 1, got {max_batch_bytes}")
        connect_burst = _int(env, UPSTREAM_CONNECT_BURST, 200)
        if connect_burst < 0:
            raise ConfigError(
                f"{UPSTREAM_CONNECT_BURST} must be >= 0 (0: no pacing), got {connect_burst}"
            )
        event_loop = _accelerator(
            env, EVENT_LOOP, accelerators.EVENT_LOOPS, accelerators.default_event_loop()
        )
        json_decoder = _accelerator(
            env, JSON_DECODER, accelerators.JSON_DECODERS, accelerators.default_json_decoder()
        )
        try:
            upstream_protocols = parse_registry(env.get(UPSTREAM_PROTOCOLS))
        except InvalidRegistryError as error:
            raise ConfigError(f"{UPSTREAM_PROTOCOLS}: {error}") from None
        upstream_protocol = default_protocol_name(env, upstream_protocols)
        return cls(
            table_name=_required(env, TABLE_NAME),
            queue_url=_required(env, QUEUE_URL),
            worker_id=env.get(WORKER_ID) or default_worker_id(),
            timing=timing,
            max_connections=max_connections,
            reassign_on_release=_bool(env, REASSIGN_ON_RELEASE, True),
            upstream_protocol=upstream_protocol,
            upstream_protocols=upstream_protocols,
            handler_errors=handler_errors,
            metrics_namespace=env.get(METRICS_NAMESPACE) or "WebSocketFleet",
            service_name=env.get(SERVICE_NAME) or "websocket-fleet",
            handler=env.get(HANDLER) or None,
            metrics_interval=_positive_float(env, METRICS_INTERVAL_SECONDS, 60.0),
            health_file=Path(env.get(HEALTH_FILE) or DEFAULT_HEALTH_FILE),
            sqs_wait_seconds=sqs_wait,
            ping_interval=_positive_float(env, PING_INTERVAL_SECONDS, max(timing.heartbeat, 1.0)),
            ping_timeout=_positive_float(env, PING_TIMEOUT_SECONDS, DEFAULT_PING_TIMEOUT),
            max_message_bytes=_int(env, MAX_MESSAGE_BYTES, 1 << 20),
            max_batch_messages=max_batch_messages,
            max_batch_bytes=max_batch_bytes,
            upstream_fail_after=_positive_float(env, UPSTREAM_FAIL_AFTER_SECONDS, 600.0),
            upstream_connect_burst=connect_burst,
            upstream_connects_per_second=_rate(env, UPSTREAM_CONNECTS_PER_SECOND, 100.0),
            log_level=(env.get(LOG_LEVEL) or "INFO").upper(),
            secret_cache_seconds=300.0 if secret_cache is None else secret_cache,
            event_loop=event_loop,
            json_decoder=json_decoder,
            balance=balance_from_env(env),
        )


def default_protocol_name(env: Mapping[str, str], registered: Mapping[str, str]) -> str:
    """``UPSTREAM_PROTOCOL``: ``json-seq`` (unset), a registered name, or the
    ``module:factory`` of a plug-in of its own (loaded once, shared by every connection
    without a spec, as before there was a registry)."""
    value = (env.get(UPSTREAM_PROTOCOL) or "json-seq").strip()
    if value == "json-seq" or value in registered or FACTORY_PATTERN.fullmatch(value):
        return value
    names = ", ".join(["json-seq", *sorted(registered)])
    raise ConfigError(
        f"{UPSTREAM_PROTOCOL} must be one of {names} (those registered in "
        f"{UPSTREAM_PROTOCOLS}) or a 'package.module:factory', got {value!r}"
    )


def check_names(names: Iterable[str]) -> None:
    """Refuse names that are not worker settings: the environment holds much else, so
    :meth:`WorkerConfig.from_env` would ignore a misspelt one in silence."""
    unknown = sorted(set(names) - SETTINGS)
    if unknown:
        raise ConfigError(
            f"not a worker setting: {', '.join(unknown)} (the worker reads "
            f"{', '.join(sorted(SETTINGS))})"
        )


def ignored_settings(env: Mapping[str, str]) -> list[str]:
    """One line for each setting in ``env`` that the worker no longer reads, and why."""
    return [
        f"{name} is set but no longer a setting (ignored): {why}"
        for name, why in REMOVED_SETTINGS.items()
        if name in env
    ]


def timing_from_env(env: Mapping[str, str]) -> LeaseTiming:
    """Session timing from ``LEASE_SECONDS`` and the optional overrides, validated."""
    try:
        return LeaseTiming.deployed(
            _positive_float(env, LEASE_SECONDS, DEFAULT_LEASE_SECONDS),
            heartbeat=_opt_float(env, HEARTBEAT_SECONDS),
            reconcile=_opt_float(env, RECONCILE_SECONDS),
            checkpoint=_opt_float(env, CHECKPOINT_SECONDS),
        )
    except InvalidTimingError as error:
        raise ConfigError(f"invalid lease timing: {error}") from error


def balance_from_env(env: Mapping[str, str]) -> BalanceSettings | None:
    defaults = BalanceSettings()
    round_seconds = _opt_float(env, BALANCE_ROUND_SECONDS)
    if round_seconds == 0:
        return None
    if round_seconds is not None and not round_seconds > 0:
        raise ConfigError(f"{BALANCE_ROUND_SECONDS} must be > 0 (0: off), got {round_seconds}")
    tolerance = _opt_float(env, BALANCE_TOLERANCE)
    if tolerance is not None and not 0 <= tolerance <= 10:
        raise ConfigError(f"{BALANCE_TOLERANCE} must be from 0 to 10, got {tolerance}")
    fraction = _opt_float(env, BALANCE_MOVE_FRACTION)
    if fraction is not None and not 0 < fraction <= 1:
        raise ConfigError(f"{BALANCE_MOVE_FRACTION} must be > 0 and <= 1, got {fraction}")
    return BalanceSettings(
        tolerance=defaults.tolerance if tolerance is None else tolerance,
        move_fraction=defaults.move_fraction if fraction is None else fraction,
        round_seconds=defaults.round_seconds if round_seconds is None else round_seconds,
    )


def default_worker_id() -> str:
    """Unique per process: host, pid and a random suffix (a restarted process on the
    same host never reuses the id of its predecessor)."""
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"


def _required(env: Mapping[str, str], name: str) -> str:
    value = env.get(name, "").strip()
    if not value:
        raise ConfigError(f"{name} is required")
    return value


def _accelerator(env: Mapping[str, str], name: str, choices: Iterable[str], default: str) -> str:
    """The name only: whether it is installed is the running worker's to check
    (:func:`check_installed`), not a synth's on another machine."""
    value = (env.get(name) or default).strip().lower()
    if value not in choices:
        raise ConfigError(f"{name} must be one of {', '.join(choices)}, got {value!r}")
    return value


def check_installed(config: WorkerConfig) -> None:
    """Refuse an event loop or JSON decoder this interpreter does not have."""
    for name, value in ((EVENT_LOOP, config.event_loop), (JSON_DECODER, config.json_decoder)):
        if not accelerators.installed(value):
            raise ConfigError(f"{name}={value}, but {value} is not installed here")


def _opt_float(
    env: Mapping[str, str], name: str, what: str = "a number of seconds"
) -> float | None:
    raw = env.get(name, "").strip()
    if not raw:
        return None
    try:
        return float(raw)
    except ValueError:
        raise ConfigError(f"{name} must be {what}, got {raw!r}") from None


def _positive_float(env: Mapping[str, str], name: str, default: float) -> float:
    value = _opt_float(env, name)
    if value is None:
        return default
    if not value > 0:
        raise ConfigError(f"{name} must be > 0, got {value}")
    return value


def _rate(env: Mapping[str, str], name: str, default: float) -> float:
    """A finite number per second, >= 0 (0: unlimited)."""
    value = _opt_float(env, name, "a number per second")
    if value is None:
        return default
    if not (math.isfinite(value) and value >= 0):
        raise ConfigError(f"{name} must be a finite number >= 0 (0: no pacing), got {value}")
    return value


def _int(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        return int(raw)
    except ValueError:
        raise ConfigError(f"{name} must be an integer, got {raw!r}") from None


def _bool(env: Mapping[str, str], name: str, default: bool) -> bool:
    raw = env.get(name, "").strip().lower()
    if not raw:
        return default
    if raw in ("1", "true", "yes", "on"):
        return True
    if raw in ("0", "false", "no", "off"):
        return False
    raise ConfigError(f"{name} must be true or false, got {raw!r}")
