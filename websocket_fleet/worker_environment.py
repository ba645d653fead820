"""The worker task's environment: what the stack sets, what the options set, and any
other worker setting the user gives (``worker_settings``), validated at synth by the
worker's own configuration rules (``worker/config.py``, loaded from the code the image
runs: :func:`websocket_fleet.sources.worker_config`)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final

from websocket_fleet.errors import FleetOptionsError
from websocket_fleet.sources import worker_config
from wsfleet import metric_names
from wsfleet.protocol_registry import UPSTREAM_PROTOCOLS, registry_text
from wsfleet.sink_limits import ENVELOPE_ALLOWANCE

if TYPE_CHECKING:
    from websocket_fleet.options import FleetOptions

STACK_OWNED: Final = {
    "TABLE_NAME": "the construct's own table",
    "QUEUE_URL": "the construct's own start queue",
    "WORKER_ID": "each worker process makes a unique one of its own",
    "METRICS_NAMESPACE": "the scaling policy, the alarms and the dashboard read "
    f"{metric_names.DEFAULT_NAMESPACE}",
}
"""Worker settings only the stack sets, and why."""
OPTION_OWNED: Final = {
    "LEASE_SECONDS": "lease_seconds",
    "MAX_CONNECTIONS": "max_connections",
    "SERVICE_NAME": "service_name",
    "HANDLER": "handler",
    "REASSIGN_ON_RELEASE": "reassign_on_release",
    "UPSTREAM_CONNECT_BURST": "upstream_connect_burst",
    "UPSTREAM_CONNECTS_PER_SECOND": "upstream_connects_per_second",
    UPSTREAM_PROTOCOLS: "upstream_protocols",
}
"""Worker settings an option sets (and validates against the rest of the stack: the
scaling target, the metric dimension, the image, the router that must know the same
protocols): set the option instead."""
PLACEHOLDER: Final = "synth-placeholder"
"""Stands in for the table name and queue URL, tokens until deploy time."""


def option_settings(options: FleetOptions) -> dict[str, str]:
    """The worker settings the options set, in the task definition's order."""
    env = {
        "LEASE_SECONDS": f"{options.lease_seconds:g}",
        "MAX_CONNECTIONS": str(options.max_connections),
        "REASSIGN_ON_RELEASE": "true" if options.reassign_on_release else "false",
        "UPSTREAM_CONNECT_BURST": str(options.upstream_connect_burst),
        "UPSTREAM_CONNECTS_PER_SECOND": f"{options.upstream_connects_per_second:g}",
        "METRICS_NAMESPACE": metric_names.DEFAULT_NAMESPACE,
        "SERVICE_NAME": options.service_name,
        "HEALTH_FILE": _config_value("DEFAULT_HEALTH_FILE"),
    }
    if options.upstream_protocols:
        env[UPSTREAM_PROTOCOLS] = registry_text(options.upstream_protocols)
    if options.handler is not None:
        env["HANDLER"] = options.handler.factory
        carried = options.handler.max_message_bytes
        if carried is not None:
            _check_message_bytes(options, carried)
            env.setdefault(MAX_MESSAGE_BYTES, str(carried))
    return env


MAX_MESSAGE_BYTES: Final = "MAX_MESSAGE_BYTES"


def _check_message_bytes(options: FleetOptions, carried: int) -> None:
    """A ``MAX_MESSAGE_BYTES`` above what the handler (a built-in sink) can carry would
    let messages through that the sink can only set aside."""
    given = options.worker_settings.get(MAX_MESSAGE_BYTES)
    if given is None:
        return
    try:
        value = int(str(given).strip())
    except ValueError:
        return  # the worker's own rules name a malformed value
    if value > carried:
        raise FleetOptionsError(
            "worker_settings",
            f"{MAX_MESSAGE_BYTES} {value:,} is over what the handler "
            f"{options.handler.factory if options.handler else ''} can send as one record "
            f"({carried:,}: the service's limit less {ENVELOPE_ALLOWANCE:,} bytes for the "
            "envelope); leave it unset for that, or set it lower",
        )


def worker_environment(options: FleetOptions, table_name: str, queue_url: str) -> dict[str, str]:
    """The task definition's environment. ``WORKER_ID`` is never set: it must be
    unique per process, and the worker derives it from host, pid and chance."""
    handler = {} if options.handler is None else options.handler.environment
    return {
        "TABLE_NAME": table_name,
        "QUEUE_URL": queue_url,
        **option_settings(options),
        **dict(sorted(options.worker_settings.items())),
        **dict(sorted(handler.items())),
        **dict(sorted(options.handler_environment.items())),
    }


def check_handler_environment(
    variables: Mapping[str, Any], handler_sets: Mapping[str, str] | None = None
) -> None:
    """The handler's own variables: names a shell would take, none of the worker's,
    none the handler sets itself (``handler_sets``: a built-in sink's destination)."""
    settings = worker_config().SETTINGS
    clash = sorted(set(variables) & set(handler_sets or {}))
    if clash:
        raise FleetOptionsError(
            "handler_environment",
            f"{', '.join(clash)}: set by the handler from the destination it was given",
        )
    for name, value in variables.items():
        if not (isinstance(name, str) and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name)):
            raise FleetOptionsError("handler_environment", f"not a variable name: {name!r}")
        if not isinstance(value, str):
            raise FleetOptionsError("handler_environment", f"{name}: a text value, got {value!r}")
        if name in settings:
            raise FleetOptionsError(
                "handler_environment",
                f"{name} is a worker setting: give it in worker_settings, where the worker's "
                "rules check it",
            )


def check_worker_settings(settings: Mapping[str, Any], base: Mapping[str, str]) -> None:
    """Refuse what the worker would refuse, with its own message, and what the stack
    or an option sets; ``base``: what the options set."""
    config = worker_config()
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in settings.items()):
        raise FleetOptionsError(
            "worker_settings", "a map of worker environment variable names to text values"
        )
    try:
        config.check_names(settings)
    except config.ConfigError as error:
        raise FleetOptionsError("worker_settings", str(error)) from None
    for name in sorted(settings):
        if name in STACK_OWNED:
            raise FleetOptionsError(
                "worker_settings", f"{name} is set by the stack: {STACK_OWNED[name]}"
            )
        if name in OPTION_OWNED:
            raise FleetOptionsError(
                "worker_settings",
                f"{name} is set by the option {OPTION_OWNED[name]}: set that instead",
            )
    env = {"TABLE_NAME": PLACEHOLDER, "QUEUE_URL": PLACEHOLDER, **base, **settings}
    try:
        config.WorkerConfig.from_env(env)
    except config.ConfigError as error:
        raise FleetOptionsError("worker_settings", str(error)) from None


def _config_value(name: str) -> str:
    value = getattr(worker_config(), name)
    assert isinstance(value, str)
    return value
