"""Per-environment settings of the fleet, read from CDK context in one place.

Layers, later ones win: the defaults of ``FleetSettings`` (production values), the
block of the selected environment in ``fleet:environments`` (``cdk.json``), then
single-key overrides ``-c fleet:<key>=<value>`` on the command line. The environment
is chosen with ``-c fleet:environment=<name>`` (default ``prod``). Unknown keys in a
block and bad values fail the synth with a message that names the key.
docs/DEPLOY.md lists every key.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Final

from aws_cdk import aws_logs as logs
from constructs import Node

from wsfleet.metric_names import DEFAULT_SERVICE_NAME
from wsfleet.secret_refs import check_prefix
from wsfleet.timing import DEFAULT_LEASE_SECONDS, InvalidTimingError, LeaseTiming

REPO_ROOT: Final = Path(__file__).resolve().parent.parent
ENVIRONMENT_KEY: Final = "fleet:environment"
ENVIRONMENTS_KEY: Final = "fleet:environments"
OVERRIDE_PREFIX: Final = "fleet:"
DEFAULT_ENVIRONMENT: Final = "prod"
DEFAULT_SECRET_PREFIX: Final = "websocket-fleet/"

LOG_RETENTION: Final = {
    1: logs.RetentionDays.ONE_DAY,
    3: logs.RetentionDays.THREE_DAYS,
    5: logs.RetentionDays.FIVE_DAYS,
    7: logs.RetentionDays.ONE_WEEK,
    14: logs.RetentionDays.TWO_WEEKS,
    30: logs.RetentionDays.ONE_MONTH,
    60: logs.RetentionDays.TWO_MONTHS,
    90: logs.RetentionDays.THREE_MONTHS,
    180: logs.RetentionDays.SIX_MONTHS,
    365: logs.RetentionDays.ONE_YEAR,
    731: logs.RetentionDays.TWO_YEARS,
    1096: logs.RetentionDays.THREE_YEARS,
}
# Fargate CPU units and the memory sizes (MiB) each one accepts (the small sizes only).
FARGATE_MEMORY: Final = {
    256: (512, 1024, 2048),
    512: tuple(range(1024, 4097, 1024)),
    1024: tuple(range(2048, 8193, 1024)),
    2048: tuple(range(4096, 16385, 1024)),
}
_HOST_GLOB = re.compile(r"^[A-Za-z0-9*?.\-\[\]]+$")
_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9-]{0,62}$")
_EVENT_BUS_NAME = re.compile(r"^[A-Za-z0-9._-]{1,256}$")
_TOPIC_ARN = re.compile(r"^arn:aws[a-z-]*:sns:[a-z0-9-]+:\d{12}:[A-Za-z0-9_-]{1,256}$")
_EMAIL = re.compile(r"^[^@\s]+@[^@\s]+\.[^@\s]+$")
_PRINCIPAL_ARN = re.compile(r"^arn:aws[a-z-]*:iam::\d{12}:(root|(role|user)/[\w+=,.@/-]{1,512})$")
MAX_ROUTER_RESERVED_CONCURRENCY: Final = 900
"""A default account runs 1,000 concurrent executions and must keep 100 unreserved: a
larger reservation would not deploy there, and would cap nothing worth capping."""


class SettingsError(ValueError):
    """A context value that cannot be deployed; the message names the key."""


@dataclass(frozen=True, slots=True)
class ImportedVpc:
    """An existing VPC: the subnets the workers run in and whether they are public
    (tasks then get a public IP for outbound wss) or private (routed through NAT)."""

    vpc_id: str
    availability_zones: tuple[str, ...]
    subnet_ids: tuple[str, ...]
    assign_public_ip: bool


@dataclass(frozen=True, slots=True)
class ProvisionedCapacity:
    """Auto-scaled read/write capacity of the table; each index gets the same range."""

    min_read: int = 5
    max_read: int = 50
    min_write: int = 5
    max_write: int = 500
    target_utilization_percent: int = 70


@dataclass(frozen=True, slots=True)
class FleetSettings:
    environment: str = DEFAULT_ENVIRONMENT
    stack_name: str = ""
    """Defaults to ``WebSocketFleet-<environment>``."""
    service_name: str = DEFAULT_SERVICE_NAME
    allowed_upstream_hosts: tuple[str, ...] = ()
    allowed_secret_prefix: str = DEFAULT_SECRET_PREFIX
    """Secrets a start may name for its credentials (the router's
    ``ALLOWED_SECRET_PREFIX``); the worker task role may read exactly those."""
    max_connections: int = 500
    lease_seconds: float = DEFAULT_LEASE_SECONDS
    """The session lease (``LEASE_SECONDS``, 2.5 s); the worker derives the rest from
    it (``LeaseTiming.from_lease``: heartbeat and reconcile 0.6 s, skew 0.25 s, margin
    lease/10, checkpoint 5 s), and the synth refuses a lease those cannot satisfy."""
    min_tasks: int = 2
    max_tasks: int = 10
    target_connections_per_task: int = 350
    dlq_max_receive_count: int = 5
    vpc: ImportedVpc | None = None
    table_billing: str = "PAY_PER_REQUEST"
    provisioned_capacity: ProvisionedCapacity = ProvisionedCapacity()
    dev: bool = False
    event_bus_name: str = ""
    """The bus the stack creates for Start/Stop events; ``<stackName>-events`` unless
    named."""
    event_putter_arns: tuple[str, ...] = ()
    """Principals of other accounts (or named ones of this account) that may put
    events on the bus, besides the account's own principals."""
    event_source: str = "websocket-fleet"
    log_retention_days: int = 30
    alarm_topic_arn: str | None = None
    """An existing topic for every alarm's notifications; without it the stack
    creates one."""
    alarm_email: str | None = None
    """Subscribed to the stack's own alarm topic (confirmed from the email)."""
    start_age_alarm_seconds: int = 600
    """StartMessagesWaiting fires at this age of the oldest start hint. A hint is
    normally taken within one long poll (10 s); a poison one reaches the DLQ after
    ``dlqMaxReceiveCount`` receives a visibility timeout (60 s) apart, about 5 minutes
    at the default 5, which stays below 10 minutes; scale-out adds a task in 2 to 3
    minutes. Older than that, no worker takes starts."""
    router_reserved_concurrency: int = 10
    """Router executions at once: about 30 calls/s each, 1-2 writes per call to the
    ``STARTED`` partition of the state index, which takes about 1,000 writes/s and
    which only the router writes (docs/DEPLOY.md)."""
    task_cpu: int = 256
    task_memory_mib: int = 512
    powertools_version: str = ""
    """Defaults to the aws-lambda-powertools pin of worker/requirements.txt."""
    worker_handler: str | None = None
    reassign_on_release: bool = True
    upstream_connect_burst: int = 200
    """``UPSTREAM_CONNECT_BURST``: upstream connects per host and worker that go at once
    after an idle period (0: no pacing)."""
    upstream_connects_per_second: float = 100.0
    """``UPSTREAM_CONNECTS_PER_SECOND``: past the burst, per host and worker (0: no
    pacing)."""

    @property
    def timing(self) -> LeaseTiming:
        """What the worker derives from ``LEASE_SECONDS`` (``worker.config``), validated."""
        return LeaseTiming.from_lease(self.lease_seconds)


def settings_from_context(node: Node) -> FleetSettings:
    """The settings of the environment selected in the app's context."""
    environment = str(node.try_get_context(ENVIRONMENT_KEY) or DEFAULT_ENVIRONMENT)
    environments = node.try_get_context(ENVIRONMENTS_KEY) or {}
    if environment not in environments and environment != DEFAULT_ENVIRONMENT:
        raise SettingsError(f"{ENVIRONMENT_KEY}={environment!r} is not in {ENVIRONMENTS_KEY}")
    values = dict(environments.get(environment) or {})
    for key in _KEYS:
        override = node.try_get_context(OVERRIDE_PREFIX + key)
        if override is not None:
            values[key] = _json_or_text(override)
    return build_settings(environment, values)


def build_settings(environment: str, values: Mapping[str, Any]) -> FleetSettings:
    """Convert and validate one environment's camelCase values."""
    unknown = sorted(set(values) - set(_KEYS))
    if unknown:
        raise SettingsError(f"unknown fleet setting(s) {unknown}; known: {sorted(_KEYS)}")
    fields: dict[str, Any] = {"environment": environment}
    for key, raw in values.items():
        field, convert = _KEYS[key]
        try:
            fields[field] = convert(raw)
        except (TypeError, ValueError) as error:
            raise SettingsError(f"fleet setting {key}={raw!r}: {error}") from None
    settings = FleetSettings(**fields)
    if not settings.stack_name:
        settings = replace(settings, stack_name=f"WebSocketFleet-{environment}")
    if not settings.event_bus_name:
        settings = replace(settings, event_bus_name=f"{settings.stack_name}-events")
    if not settings.powertools_version:
        settings = replace(settings, powertools_version=pinned_powertools_version())
    validate(settings)
    return settings


def validate(s: FleetSettings) -> None:
    checks = [
        (bool(_NAME.fullmatch(s.environment)), "environment name must be [A-Za-z][A-Za-z0-9-]*"),
        (bool(_NAME.fullmatch(s.stack_name)), "stackName must be [A-Za-z][A-Za-z0-9-]*"),
        (bool(re.fullmatch(r"[A-Za-z0-9._-]{1,128}", s.service_name)), "serviceName"),
        (bool(s.allowed_upstream_hosts), "allowedUpstreamHosts must list at least one host"),
        (all(_HOST_GLOB.fullmatch(h) for h in s.allowed_upstream_hosts), "allowedUpstreamHosts"),
        (s.max_connections >= 1, "maxConnections must be >= 1"),
        (1 <= s.min_tasks <= s.max_tasks, "need 1 <= minTasks <= maxTasks"),
        (
            1 <= s.target_connections_per_task <= s.max_connections,
            "need 1 <= targetConnectionsPerTask <= maxConnections",
        ),
        (1 <= s.dlq_max_receive_count <= 1000, "dlqMaxReceiveCount must be 1..1000"),
        (s.table_billing in ("PAY_PER_REQUEST", "PROVISIONED"), "tableBilling"),
        (s.log_retention_days in LOG_RETENTION, f"logRetentionDays: one of {list(LOG_RETENTION)}"),
        (s.task_memory_mib in FARGATE_MEMORY.get(s.task_cpu, ()), "taskCpu/taskMemoryMiB"),
        (bool(re.fullmatch(r"\d+\.\d+\.\d+|latest", s.powertools_version)), "powertoolsVersion"),
        (not (s.dev and s.environment == DEFAULT_ENVIRONMENT), "prod cannot set dev=true"),
        (
            s.event_bus_name != "default",
            "eventBusName cannot be the account's default bus: anyone allowed to put "
            "events there could start connections without the API's authorization",
        ),
        (bool(_EVENT_BUS_NAME.fullmatch(s.event_bus_name)), "eventBusName: [A-Za-z0-9._-]{1,256}"),
        (
            all(_PRINCIPAL_ARN.fullmatch(arn) for arn in s.event_putter_arns),
            "eventPutterArns: IAM role, user or account root ARNs, e.g. "
            "arn:aws:iam::<account>:role/<name> or arn:aws:iam::<account>:root",
        ),
        (
            s.alarm_topic_arn is None or bool(_TOPIC_ARN.fullmatch(s.alarm_topic_arn)),
            "alarmTopicArn: a standard SNS topic ARN, arn:aws:sns:<region>:<account>:<name>",
        ),
        (s.alarm_email is None or bool(_EMAIL.fullmatch(s.alarm_email)), "alarmEmail"),
        (
            not (s.alarm_email and s.alarm_topic_arn),
            "alarmEmail subscribes to the stack's own topic; with alarmTopicArn, "
            "subscribe at that topic's owner instead",
        ),
        (
            60 <= s.start_age_alarm_seconds <= 345_600,
            "startAgeAlarmSeconds must be 60..345600 (the start queue keeps hints 4 days)",
        ),
        (
            1 <= s.router_reserved_concurrency <= MAX_ROUTER_RESERVED_CONCURRENCY,
            f"routerReservedConcurrency must be 1..{MAX_ROUTER_RESERVED_CONCURRENCY}",
        ),
        (s.upstream_connect_burst >= 0, "upstreamConnectBurst must be >= 0 (0: no pacing)"),
        (
            math.isfinite(s.upstream_connects_per_second) and s.upstream_connects_per_second >= 0,
            "upstreamConnectsPerSecond must be a finite number >= 0 (0: no pacing)",
        ),
    ]
    for ok, message in checks:
        if not ok:
            raise SettingsError(f"invalid fleet settings ({s.environment}): {message}")
    c = s.provisioned_capacity
    if not (1 <= c.min_read <= c.max_read and 1 <= c.min_write <= c.max_write):
        raise SettingsError("provisionedCapacity: need 1 <= min <= max for read and write")
    try:
        s.timing  # noqa: B018 - validates the lease timing the worker will derive
    except InvalidTimingError as error:
        raise SettingsError(f"leaseSeconds: {error}") from None


def pinned_powertools_version() -> str:
    """The aws-lambda-powertools pin of the worker, so the router's layer matches it."""
    text = (REPO_ROOT / "worker" / "requirements.txt").read_text(encoding="utf-8")
    match = re.search(r"^aws-lambda-powertools(?:\[[^\]]*\])?==([0-9.]+)\s*$", text, re.M)
    if match is None:
        raise SettingsError("no aws-lambda-powertools==<version> pin in worker/requirements.txt")
    return match.group(1)


def _imported_vpc(value: Any) -> ImportedVpc:
    v = _snake(value)
    vpc = ImportedVpc(
        vpc_id=str(v["vpc_id"]),
        availability_zones=tuple(_str_list(v["availability_zones"])),
        subnet_ids=tuple(_str_list(v["subnet_ids"])),
        assign_public_ip=_bool(v.get("assign_public_ip", True)),
    )
    if not vpc.subnet_ids or len(vpc.subnet_ids) != len(vpc.availability_zones):
        raise ValueError("give one availability zone per subnet id")
    return vpc


def _snake(value: Any) -> dict[str, Any]:
    if not isinstance(value, Mapping):
        raise TypeError("expected an object")
    return {re.sub(r"(?<!^)(?=[A-Z])", "_", k).lower(): v for k, v in value.items()}


def _str_list(value: Any) -> list[str]:
    if isinstance(value, str):
        value = [part.strip() for part in value.split(",")]
    if not isinstance(value, list | tuple) or not all(isinstance(v, str) and v for v in value):
        raise TypeError("expected a list of non-empty strings")
    return list(value)


def _int(value: Any) -> int:
    """Whole numbers only: 2.5 tasks or ``true`` connections are mistakes, not 2 or 1."""
    if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
        raise ValueError("expected a whole number")
    return int(value)


def _bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text not in ("true", "false"):
        raise ValueError("expected true or false")
    return text == "true"


def _json_or_text(value: Any) -> Any:
    """``-c key=value`` arrives as text; JSON lets lists, numbers and objects through."""
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except ValueError:
        return value


# camelCase context key -> (field, converter)
_KEYS: Final[dict[str, tuple[str, Any]]] = {
    "stackName": ("stack_name", str),
    "serviceName": ("service_name", str),
    "allowedUpstreamHosts": ("allowed_upstream_hosts", lambda v: tuple(_str_list(v))),
    "allowedSecretPrefix": ("allowed_secret_prefix", lambda v: check_prefix(str(v))),
    "maxConnections": ("max_connections", _int),
    "leaseSeconds": ("lease_seconds", float),
    "minTasks": ("min_tasks", _int),
    "maxTasks": ("max_tasks", _int),
    "targetConnectionsPerTask": ("target_connections_per_task", _int),
    "dlqMaxReceiveCount": ("dlq_max_receive_count", _int),
    "vpc": ("vpc", lambda v: None if v is None else _imported_vpc(v)),
    "tableBilling": ("table_billing", lambda v: str(v).upper()),
    "provisionedCapacity": ("provisioned_capacity", lambda v: ProvisionedCapacity(**_snake(v))),
    "dev": ("dev", _bool),
    "eventBusName": ("event_bus_name", lambda v: str(v) if v else ""),
    "eventPutterArns": ("event_putter_arns", lambda v: tuple(_str_list(v)) if v else ()),
    "eventSource": ("event_source", str),
    "logRetentionDays": ("log_retention_days", _int),
    "alarmTopicArn": ("alarm_topic_arn", lambda v: str(v) if v else None),
    "alarmEmail": ("alarm_email", lambda v: str(v) if v else None),
    "startAgeAlarmSeconds": ("start_age_alarm_seconds", _int),
    "routerReservedConcurrency": ("router_reserved_concurrency", _int),
    "taskCpu": ("task_cpu", _int),
    "taskMemoryMiB": ("task_memory_mib", _int),
    "powertoolsVersion": ("powertools_version", str),
    "workerHandler": ("worker_handler", lambda v: str(v) if v else None),
    "reassignOnRelease": ("reassign_on_release", _bool),
    "upstreamConnectBurst": ("upstream_connect_burst", _int),
    "upstreamConnectsPerSecond": ("upstream_connects_per_second", float),
}
