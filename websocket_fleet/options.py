"""Every option of :class:`websocket_fleet.WebSocketFleet`, typed, with its default and
its validation: one place, whether the values come from a user's code or from this
repository's CDK context (stacks/settings.py). docs/DEPLOY.md lists them with their
context keys."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any, Final

from aws_cdk import aws_logs as logs

from websocket_fleet.errors import FleetOptionsError
from websocket_fleet.handler import WorkerHandler
from websocket_fleet.sources import pinned_version
from websocket_fleet.worker_environment import (
    check_handler_environment,
    check_worker_settings,
    option_settings,
)
from wsfleet.metric_names import DEFAULT_SERVICE_NAME
from wsfleet.protocol_registry import InvalidRegistryError, check_registry
from wsfleet.secret_refs import InvalidSecretRefError, check_prefix
from wsfleet.timing import DEFAULT_LEASE_SECONDS, InvalidTimingError, LeaseTiming

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
MAX_ROUTER_RESERVED_CONCURRENCY: Final = 900
"""A default account runs 1,000 concurrent executions and must keep 100 unreserved: a
larger reservation would not deploy there, and would cap nothing worth capping."""
_HOST_GLOB = re.compile(r"^[A-Za-z0-9*?.\-\[\]]+$")
_EVENT_BUS_NAME = re.compile(r"^[A-Za-z0-9._-]{1,256}$")
_DASHBOARD_NAME = re.compile(r"^[A-Za-z0-9_-]{1,255}$")
_TOPIC_ARN = re.compile(r"^arn:aws[a-z-]*:sns:[a-z0-9-]+:\d{12}:[A-Za-z0-9_-]{1,256}$")
_EMAIL = re.compile(r"^[^@\s]+@[^@\s]+\.[^@\s]+$")
_PRINCIPAL_ARN = re.compile(r"^arn:aws[a-z-]*:iam::\d{12}:(root|(role|user)/[\w+=,.@/-]{1,512})$")


@dataclass(frozen=True, slots=True)
class ImportedVpc:
    """An existing VPC: the subnets the workers run in and whether they are public
    (tasks then get a public IP for outbound wss) or private (routed through NAT)."""

    vpc_id: str
    availability_zones: tuple[str, ...]
    subnet_ids: tuple[str, ...]
    assign_public_ip: bool = True


@dataclass(frozen=True, slots=True)
class ProvisionedCapacity:
    """Auto-scaled read/write capacity of the table; each index gets the same range."""

    min_read: int = 5
    max_read: int = 50
    min_write: int = 5
    max_write: int = 500
    target_utilization_percent: int = 70


@dataclass(frozen=True, slots=True, kw_only=True)
class FleetOptions:
    """The keyword arguments of :class:`websocket_fleet.WebSocketFleet`; the defaults
    are production values."""

    allowed_upstream_hosts: tuple[str, ...] = ()
    """The router's SSRF allow-list (``ALLOWED_UPSTREAM_HOSTS``): host-name globs, no
    scheme or port. Required."""
    handler: WorkerHandler | None = None
    """The workers' message handler; None: each message is logged."""
    worker_settings: Mapping[str, str] = field(default_factory=dict)
    """Any worker environment variable (docs/DESIGN.md §4.9) to a value, validated
    by the worker's own rules at synth. Those the stack sets itself or that have an
    option of their own are refused (:mod:`websocket_fleet.worker_environment`)."""
    handler_environment: Mapping[str, str] = field(default_factory=dict)
    """Variables of the handler's own (a table name, a bucket), set on the worker
    container next to the worker's; a worker setting's name is refused (those go in
    ``worker_settings``), and so is one the handler sets itself (a built-in sink's
    destination, ``WorkerHandler.kinesis`` and the like)."""
    upstream_protocols: Mapping[str, str] = field(default_factory=dict)
    """Plug-in protocols a start may name, ``{"acme-feed": "acme.feed:factory"}``:
    ``UPSTREAM_PROTOCOLS`` of the workers (which load the factories, from the image:
    the handler's directory, for one) and of the router (which admits the names).
    Names are 1 to 63 of a-z, 0-9 and -, none of a built-in protocol
    (:mod:`wsfleet.protocol_registry`)."""
    service_name: str = DEFAULT_SERVICE_NAME
    allowed_secret_prefix: str = DEFAULT_SECRET_PREFIX
    """Secrets a start may name for its credentials (the router's
    ``ALLOWED_SECRET_PREFIX``); the worker task role may read exactly those."""
    max_connections: int = 500
    lease_seconds: float = DEFAULT_LEASE_SECONDS
    """The session lease (``LEASE_SECONDS``, 2.2 s); the worker derives the rest from
    it (``LeaseTiming.from_lease``: heartbeat and reconcile 0.594 s, margin lease/10,
    checkpoint 5 s), and the synth refuses a lease those cannot satisfy."""
    min_tasks: int = 2
    max_tasks: int = 10
    target_connections_per_task: int = 350
    dlq_max_receive_count: int = 5
    vpc: ImportedVpc | None = None
    table_billing: str = "PAY_PER_REQUEST"
    provisioned_capacity: ProvisionedCapacity = ProvisionedCapacity()
    dev: bool = False
    """Data and logs are destroyed with the stack, no deletion protection."""
    event_bus_name: str | None = None
    """The bus the construct creates for Start/Stop events; ``<stack name>-events``
    unless named."""
    event_putter_arns: tuple[str, ...] = ()
    """Principals of other accounts (or named ones of this account) that may put
    events on the bus, besides the account's own principals."""
    event_source: str = "websocket-fleet"
    log_retention_days: int = 30
    alarm_topic_arn: str | None = None
    """An existing topic for every alarm's notifications; without it the construct
    creates one."""
    alarm_email: str | None = None
    """Subscribed to the construct's own alarm topic (confirmed from the email)."""
    start_age_alarm_seconds: int = 600
    """StartMessagesWaiting fires at this age of the oldest start hint. A hint is
    normally taken within one long poll (10 s); a poison one reaches the DLQ after
    ``dlq_max_receive_count`` receives a visibility timeout (60 s) apart, about 5
    minutes at the default 5, which stays below 10 minutes; scale-out adds a task in 2
    to 3 minutes. Older than that, no worker takes starts."""
    router_reserved_concurrency: int = 10
    """Router executions at once: about 30 calls/s each, 1-2 writes per call to the
    ``STARTED`` partition of the state index, which takes about 1,000 writes/s and
    which only the router writes (docs/DEPLOY.md)."""
    task_cpu: int = 256
    task_memory_mib: int = 512
    powertools_version: str | None = None
    """The Powertools layer of the router; None: the aws-lambda-powertools pin of
    worker/requirements.txt."""
    reassign_on_release: bool = True
    upstream_connect_burst: int = 200
    """``UPSTREAM_CONNECT_BURST``: upstream connects per host and worker that go at once
    after an idle period (0: no pacing)."""
    upstream_connects_per_second: float = 100.0
    """``UPSTREAM_CONNECTS_PER_SECOND``: past the burst, per host and worker (0: no
    pacing)."""
    dashboard_name: str | None = None
    """The CloudWatch dashboard's name; None: the stack's name."""

    @property
    def timing(self) -> LeaseTiming:
        """What the worker derives from ``LEASE_SECONDS`` (``worker.config``), validated."""
        return LeaseTiming.deployed(self.lease_seconds)

    def resolved(self, stack_name: str) -> FleetOptions:
        """The defaults that depend on where the fleet is, filled in, and validated."""
        options = replace(
            self,
            event_bus_name=self.event_bus_name or f"{stack_name}-events",
            dashboard_name=self.dashboard_name or stack_name,
            powertools_version=self.powertools_version or pinned_version("aws-lambda-powertools"),
        )
        options.validate()
        return options

    def validate(self) -> None:
        """Raise :class:`FleetOptionsError` for the first option that cannot deploy."""
        for option, ok, message in _checks(self):
            if not ok:
                raise FleetOptionsError(option, message)
        try:
            self.timing  # noqa: B018 - validates the lease timing the worker will derive
        except InvalidTimingError as error:
            raise FleetOptionsError("lease_seconds", str(error)) from None
        try:
            check_registry(self.upstream_protocols)
        except InvalidRegistryError as error:
            raise FleetOptionsError("upstream_protocols", str(error)) from None
        check_worker_settings(self.worker_settings, option_settings(self))
        check_handler_environment(
            self.handler_environment,
            None if self.handler is None else self.handler.environment,
        )


def _checks(s: FleetOptions) -> list[tuple[str, bool, str]]:
    c = s.provisioned_capacity
    prefix_problem = _prefix_problem(s.allowed_secret_prefix)
    return [
        (
            "service_name",
            bool(re.fullmatch(r"[A-Za-z0-9._-]{1,128}", s.service_name)),
            "1 to 128 of [A-Za-z0-9._-]",
        ),
        ("allowed_upstream_hosts", bool(s.allowed_upstream_hosts), "list at least one host"),
        (
            "allowed_upstream_hosts",
            all(isinstance(h, str) and _HOST_GLOB.fullmatch(h) for h in s.allowed_upstream_hosts),
            "host-name globs only, no scheme, port or path",
        ),
        ("allowed_secret_prefix", prefix_problem is None, prefix_problem or ""),
        ("max_connections", s.max_connections >= 1, "must be >= 1"),
        ("min_tasks", 1 <= s.min_tasks <= s.max_tasks, "need 1 <= min_tasks <= max_tasks"),
        (
            "target_connections_per_task",
            1 <= s.target_connections_per_task <= s.max_connections,
            "need 1 <= target_connections_per_task <= max_connections",
        ),
        ("dlq_max_receive_count", 1 <= s.dlq_max_receive_count <= 1000, "must be 1..1000"),
        (
            "table_billing",
            s.table_billing in ("PAY_PER_REQUEST", "PROVISIONED"),
            "PAY_PER_REQUEST or PROVISIONED",
        ),
        (
            "provisioned_capacity",
            1 <= c.min_read <= c.max_read and 1 <= c.min_write <= c.max_write,
            "need 1 <= min <= max for read and write",
        ),
        (
            "log_retention_days",
            s.log_retention_days in LOG_RETENTION,
            f"one of {list(LOG_RETENTION)}",
        ),
        (
            "task_memory_mib",
            s.task_memory_mib in FARGATE_MEMORY.get(s.task_cpu, ()),
            "task_cpu/task_memory_mib: not a Fargate size",
        ),
        (
            "powertools_version",
            s.powertools_version is None
            or bool(re.fullmatch(r"\d+\.\d+\.\d+|latest", s.powertools_version)),
            "a version such as 3.37.0, or latest",
        ),
        (
            "event_bus_name",
            s.event_bus_name != "default",
            "cannot be the account's default bus: anyone allowed to put events there "
            "could start connections without the API's authorization",
        ),
        (
            "event_bus_name",
            s.event_bus_name is None or bool(_EVENT_BUS_NAME.fullmatch(s.event_bus_name)),
            "[A-Za-z0-9._-]{1,256}",
        ),
        (
            "event_putter_arns",
            all(_PRINCIPAL_ARN.fullmatch(arn) for arn in s.event_putter_arns),
            "IAM role, user or account root ARNs, e.g. arn:aws:iam::<account>:role/<name> "
            "or arn:aws:iam::<account>:root",
        ),
        (
            "alarm_topic_arn",
            s.alarm_topic_arn is None or bool(_TOPIC_ARN.fullmatch(s.alarm_topic_arn)),
            "a standard SNS topic ARN, arn:aws:sns:<region>:<account>:<name>",
        ),
        (
            "alarm_email",
            s.alarm_email is None or bool(_EMAIL.fullmatch(s.alarm_email)),
            "an email address",
        ),
        (
            "alarm_email",
            not (s.alarm_email and s.alarm_topic_arn),
            "alarm_email subscribes to the construct's own topic; with alarm_topic_arn, "
            "subscribe at that topic's owner instead",
        ),
        (
            "start_age_alarm_seconds",
            60 <= s.start_age_alarm_seconds <= 345_600,
            "must be 60..345600 (the start queue keeps hints 4 days)",
        ),
        (
            "router_reserved_concurrency",
            1 <= s.router_reserved_concurrency <= MAX_ROUTER_RESERVED_CONCURRENCY,
            f"must be 1..{MAX_ROUTER_RESERVED_CONCURRENCY}",
        ),
        ("upstream_connect_burst", s.upstream_connect_burst >= 0, "must be >= 0 (0: no pacing)"),
        (
            "upstream_connects_per_second",
            math.isfinite(s.upstream_connects_per_second) and s.upstream_connects_per_second >= 0,
            "must be a finite number >= 0 (0: no pacing)",
        ),
        (
            "dashboard_name",
            s.dashboard_name is None or bool(_DASHBOARD_NAME.fullmatch(s.dashboard_name)),
            "[A-Za-z0-9_-]{1,255}",
        ),
        (
            "handler",
            s.handler is None or isinstance(s.handler, WorkerHandler),
            "a WorkerHandler (from_directory, from_image or built_in)",
        ),
    ]


def _prefix_problem(prefix: str) -> str | None:
    try:
        check_prefix(prefix)
    except InvalidSecretRefError as error:
        return str(error)
    return None


OPTION_NAMES: Final = tuple(f.name for f in fields(FleetOptions))


def options_from(values: Mapping[str, Any]) -> FleetOptions:
    """``FleetOptions(**values)``, an unknown name refused with the known ones."""
    unknown = sorted(set(values) - set(OPTION_NAMES))
    if unknown:
        raise FleetOptionsError(unknown[0], f"not an option; known: {', '.join(OPTION_NAMES)}")
    return FleetOptions(**values)
