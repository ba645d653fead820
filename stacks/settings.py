"""This app's settings, read from CDK context in one place: the stack's name and the
options of its :class:`websocket_fleet.WebSocketFleet`.

Layers, later ones win: the construct's defaults (production values), the block of
the selected environment in ``fleet:environments`` (``cdk.json``), then single-key
overrides ``-c fleet:<key>=<value>`` on the command line (``workerSettings``,
``handlerDir``, ``workerHandler``, ``handlerEnvironment`` and ``sink`` are also read
without the ``fleet:`` prefix). The
environment is chosen with ``-c fleet:environment=<name>`` (default ``prod``). Values
are converted here; the construct validates them (the same rules for its users), and
a bad one fails the synth with a message that names the context key.
``stackName`` and ``sink`` are the stack's own: ``sink=kinesis`` makes the stack
create a stream and give it to the construct (``WorkerHandler.kinesis``).
docs/DEPLOY.md lists every key.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from constructs import Node

from websocket_fleet.errors import FleetOptionsError
from websocket_fleet.handler import WorkerHandler
from websocket_fleet.options import FleetOptions, ImportedVpc, ProvisionedCapacity, options_from
from websocket_fleet.sources import pinned_version
from wsfleet.secret_refs import check_prefix

REPO_ROOT: Final = Path(__file__).resolve().parent.parent
ENVIRONMENT_KEY: Final = "fleet:environment"
ENVIRONMENTS_KEY: Final = "fleet:environments"
OVERRIDE_PREFIX: Final = "fleet:"
DEFAULT_ENVIRONMENT: Final = "prod"
SINK_KEY: Final = "sink"
SINKS: Final = ("kinesis",)
"""What ``sink`` takes: the stack creates the destination, so only one it can make
whole (a Firehose stream would need a bucket and a role of its own)."""
BARE_KEYS: Final = ("workerSettings", "handlerDir", "workerHandler", "handlerEnvironment", SINK_KEY)
"""Keys also read as ``-c key=value``, without the ``fleet:`` prefix."""
_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9-]{0,62}$")


class SettingsError(ValueError):
    """A context value that cannot be deployed; the message names the key."""


@dataclass(frozen=True, slots=True)
class FleetSettings:
    environment: str
    stack_name: str
    """``WebSocketFleet-<environment>`` unless set."""
    options: FleetOptions
    """The construct's options, with the stack's defaults filled in and validated."""
    sink: str | None = None
    """A built-in sink whose destination the stack creates (:data:`SINKS`); then
    ``options.handler`` is None and the stack sets the handler."""


def settings_from_context(node: Node) -> FleetSettings:
    """The settings of the environment selected in the app's context."""
    environment = str(node.try_get_context(ENVIRONMENT_KEY) or DEFAULT_ENVIRONMENT)
    environments = node.try_get_context(ENVIRONMENTS_KEY) or {}
    if environment not in environments and environment != DEFAULT_ENVIRONMENT:
        raise SettingsError(f"{ENVIRONMENT_KEY}={environment!r} is not in {ENVIRONMENTS_KEY}")
    values = dict(environments.get(environment) or {})
    for key in (*_KEYS, SINK_KEY):
        prefixed = node.try_get_context(OVERRIDE_PREFIX + key)
        bare = node.try_get_context(key) if key in BARE_KEYS else None
        if prefixed is not None and bare is not None and prefixed != bare:
            raise SettingsError(f"{key} and {OVERRIDE_PREFIX}{key} are both set: give one")
        override = prefixed if prefixed is not None else bare
        if override is not None:
            values[key] = _json_or_text(override)
    return build_settings(environment, values)


def build_settings(environment: str, values: Mapping[str, Any]) -> FleetSettings:
    """Convert and validate one environment's camelCase values."""
    stack_keys = {"stackName", SINK_KEY}
    unknown = sorted(set(values) - set(_KEYS) - stack_keys)
    if unknown:
        raise SettingsError(
            f"unknown fleet setting(s) {unknown}; known: {sorted([*_KEYS, *stack_keys])}"
        )
    if not _NAME.fullmatch(environment):
        raise SettingsError(
            f"invalid fleet settings: environment name must be [A-Za-z][A-Za-z0-9-]*, "
            f"got {environment!r}"
        )
    stack_name = str(values.get("stackName") or f"WebSocketFleet-{environment}")
    if not _NAME.fullmatch(stack_name):
        raise SettingsError(
            f"invalid fleet settings ({environment}): stackName must be [A-Za-z][A-Za-z0-9-]*"
        )
    sink = _sink(environment, values)
    fields: dict[str, Any] = {}
    for key, raw in values.items():
        if key in stack_keys or key in _HANDLER_KEYS:
            continue
        field, convert = _KEYS[key]
        try:
            fields[field] = convert(raw)
        except (TypeError, ValueError) as error:
            raise SettingsError(f"fleet setting {key}={raw!r}: {error}") from None
    try:
        fields["handler"] = _handler(values.get("handlerDir"), values.get("workerHandler"))
        options = options_from(fields)
        if options.dev and environment == DEFAULT_ENVIRONMENT:
            raise FleetOptionsError("dev", "prod cannot set dev=true")
        resolved = options.resolved(stack_name)
    except FleetOptionsError as error:
        key = _CONTEXT_KEY.get(error.option, error.option)
        reason = re.sub(
            r"the option (\w+)",
            lambda m: f"the option {m[1]} ({_CONTEXT_KEY.get(m[1], m[1])})",
            error.reason,
        )
        raise SettingsError(f"invalid fleet settings ({environment}): {key}: {reason}") from None
    return FleetSettings(
        environment=environment, stack_name=stack_name, options=resolved, sink=sink
    )


def pinned_powertools_version() -> str:
    """The aws-lambda-powertools pin of the worker, so the router's layer matches it."""
    return pinned_version("aws-lambda-powertools")


def _sink(environment: str, values: Mapping[str, Any]) -> str | None:
    """``sink``: null, ``none`` or one of :data:`SINKS`; it sets the handler, so a
    handler of the user's alongside it is refused."""
    raw = values.get(SINK_KEY)
    if raw is None or raw == "none":
        return None
    if raw not in SINKS:
        raise SettingsError(
            f"invalid fleet settings ({environment}): {SINK_KEY}: one of "
            f"{', '.join(SINKS)} (or none), got {raw!r}"
        )
    if values.get("workerHandler") or values.get("handlerDir"):
        raise SettingsError(
            f"invalid fleet settings ({environment}): {SINK_KEY}={raw} sets the workers' "
            "handler: give it or workerHandler/handlerDir, not both"
        )
    return str(raw)


def _handler(directory: Any, factory: Any) -> WorkerHandler | None:
    """``handlerDir`` and ``workerHandler``: a handler directory built into the image
    with its factory, or a factory the image already holds."""
    if directory:
        if not factory:
            raise FleetOptionsError(
                "handler", "handlerDir needs workerHandler, the factory (pkg.module:factory)"
            )
        return WorkerHandler.from_directory(str(directory), str(factory))
    return WorkerHandler.built_in(str(factory)) if factory else None


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


def _variables(value: Any) -> dict[str, str]:
    """A JSON object of variable names to values; numbers and booleans are
    written as the worker reads them (``10``, ``true``)."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise TypeError('expected a JSON object such as {"HANDLER_ERRORS": "skip"}')
    settings = {}
    for name, raw in value.items():
        if isinstance(raw, bool):
            settings[str(name)] = "true" if raw else "false"
        elif isinstance(raw, str | int | float):
            settings[str(name)] = str(raw)
        else:
            raise TypeError(f"{name}: expected text or a number, got {raw!r}")
    return settings


def _protocols(value: Any) -> dict[str, Any]:
    """A JSON object of protocol names to factories; the construct checks each entry
    (:mod:`wsfleet.protocol_registry`)."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise TypeError('expected a JSON object such as {"acme-feed": "acme.feed:factory"}')
    return dict(value)


def _json_or_text(value: Any) -> Any:
    """``-c key=value`` arrives as text; JSON lets lists, numbers and objects through."""
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except ValueError:
        return value


# camelCase context key -> (option of FleetOptions, converter)
_KEYS: Final[dict[str, tuple[str, Any]]] = {
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
    "eventBusName": ("event_bus_name", lambda v: str(v) if v else None),
    "eventPutterArns": ("event_putter_arns", lambda v: tuple(_str_list(v)) if v else ()),
    "eventSource": ("event_source", str),
    "logRetentionDays": ("log_retention_days", _int),
    "alarmTopicArn": ("alarm_topic_arn", lambda v: str(v) if v else None),
    "alarmEmail": ("alarm_email", lambda v: str(v) if v else None),
    "startAgeAlarmSeconds": ("start_age_alarm_seconds", _int),
    "routerReservedConcurrency": ("router_reserved_concurrency", _int),
    "taskCpu": ("task_cpu", _int),
    "taskMemoryMiB": ("task_memory_mib", _int),
    "powertoolsVersion": ("powertools_version", lambda v: str(v) if v else None),
    "workerHandler": ("handler", str),
    "handlerDir": ("handler", str),
    "workerSettings": ("worker_settings", _variables),
    "handlerEnvironment": ("handler_environment", _variables),
    "upstreamProtocols": ("upstream_protocols", _protocols),
    "reassignOnRelease": ("reassign_on_release", _bool),
    "upstreamConnectBurst": ("upstream_connect_burst", _int),
    "upstreamConnectsPerSecond": ("upstream_connects_per_second", float),
}
_HANDLER_KEYS: Final = frozenset({"workerHandler", "handlerDir"})
"""Both make the one ``handler`` option (:func:`_handler`)."""
_CONTEXT_KEY: Final = {
    option: key for key, (option, _) in _KEYS.items() if key not in _HANDLER_KEYS
} | {"handler": "workerHandler/handlerDir"}
"""The context key an option's error is reported under."""
