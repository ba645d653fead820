"""The environment of the processes the local stack starts: workers and the router get
the local endpoints they use, placeholder credentials, their table and queue, and
nothing of the caller's AWS settings that would point them elsewhere.

One builder for the runner, the benchmarks and the tests, so they cannot drift apart.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from lambdas.router import settings as router_settings
from local_stack import services
from local_stack.services import LOCAL_CREDENTIALS, LOCAL_REGION, LOOPBACK
from worker import config as worker_settings
from wsfleet.protocol_registry import UPSTREAM_PROTOCOLS, registry_text

TABLE_NAME: Final = "connections"
QUEUE_NAME: Final = "websocket-fleet-starts"
#: The caller's AWS settings a local process must not inherit: a profile nobody
#: configured for the local servers makes boto3 fail or pick other credentials, a
#: session token does not belong to the placeholder keys, and a global endpoint
#: override (or one for another service) would compete with the per-service ones set
#: here. Every ``AWS_ENDPOINT_URL_<SERVICE>`` is dropped as well (see
#: :func:`is_foreign_aws_setting`).
NOT_INHERITED: Final = (
    "AWS_PROFILE",
    "AWS_DEFAULT_PROFILE",
    "AWS_SESSION_TOKEN",
    "AWS_SECURITY_TOKEN",
    "AWS_ENDPOINT_URL",
)
_ENDPOINT_PREFIX: Final = "AWS_ENDPOINT_URL_"
#: Hosts the local router accepts upstream URLs for (docs/DESIGN.md §7): the loopback feed.
LOCAL_UPSTREAM_HOSTS: Final = f"{LOOPBACK},localhost"
#: The secrets local connections may name (``auth``): the demo one and any a test makes.
LOCAL_SECRET_PREFIX: Final = "websocket-fleet/"
SECRETS_MANAGER_ENDPOINT: Final = "AWS_ENDPOINT_URL_SECRETS_MANAGER"


@dataclass(frozen=True, slots=True)
class Endpoints:
    """Where the local AWS-compatible servers answer: DynamoDB Local, and moto for SQS
    and Secrets Manager (and CloudWatch, which no local process calls: metrics go out
    as EMF log lines)."""

    dynamodb: str
    sqs: str

    @property
    def secrets_manager(self) -> str:
        """Secrets Manager: the same moto server as SQS."""
        return self.sqs

    @property
    def kinesis(self) -> str:
        """Kinesis (the stream of ``--sink kinesis``): the same moto server as SQS."""
        return self.sqs

    @classmethod
    def on_ports(cls, dynamodb_port: int, moto_port: int) -> Endpoints:
        return cls(services.endpoint_url(dynamodb_port), services.endpoint_url(moto_port))


def format_number(value: float) -> str:
    # "5" rather than "5.0" in URLs and messages; repr keeps every digit otherwise.
    return str(int(value)) if value.is_integer() else repr(value)


def demo_url(feed_port: int, index: int, rate: float) -> str:
    """The upstream URL of demo connection ``index``: feed name ``demo-<index>``."""
    return f"ws://{LOOPBACK}:{feed_port}/demo-{index}?rate={format_number(rate)}"


def is_foreign_aws_setting(name: str) -> bool:
    """Whether ``name`` is one of the caller's AWS settings no local process inherits."""
    return name in NOT_INHERITED or name.startswith(_ENDPOINT_PREFIX)


def local_aws_settings(endpoints: Endpoints) -> dict[str, str]:
    """Placeholder credentials, a region, and the DynamoDB, SQS and Secrets Manager
    endpoints (the only services the worker and the router call). boto3 reads these
    variables itself; no component passes ``endpoint_url`` (docs/DESIGN.md §4.9)."""
    return {
        "AWS_ACCESS_KEY_ID": LOCAL_CREDENTIALS,
        "AWS_SECRET_ACCESS_KEY": LOCAL_CREDENTIALS,
        "AWS_DEFAULT_REGION": LOCAL_REGION,
        "AWS_REGION": LOCAL_REGION,
        "AWS_ENDPOINT_URL_DYNAMODB": endpoints.dynamodb,
        "AWS_ENDPOINT_URL_SQS": endpoints.sqs,
        SECRETS_MANAGER_ENDPOINT: endpoints.secrets_manager,
    }


def use_local_aws(environ: MutableMapping[str, str], endpoints: Endpoints) -> None:
    """Point ``environ`` (``os.environ``, for clients made in this very process) at the
    local servers: the same settings a child process gets."""
    for name in [name for name in environ if is_foreign_aws_setting(name)]:
        del environ[name]
    environ.update(local_aws_settings(endpoints))


def _local_env(
    base: Mapping[str, str], endpoints: Endpoints, table: str, queue_url: str
) -> dict[str, str]:
    """``base`` (the caller's environment) minus foreign AWS settings, plus the local
    endpoints, credentials, table and queue, and the repository on the import path."""
    env = {name: value for name, value in base.items() if not is_foreign_aws_setting(name)}
    python_path = [str(services.REPO_ROOT), *filter(None, [base.get("PYTHONPATH")])]
    env.update(local_aws_settings(endpoints))
    env.update(
        {
            worker_settings.TABLE_NAME: table,
            worker_settings.QUEUE_URL: queue_url,
            "PYTHONPATH": os.pathsep.join(python_path),
            # Log lines reach the file as they happen, for `tail -f` and the harness.
            "PYTHONUNBUFFERED": "1",
        }
    )
    return env


def local_router_settings(
    *,
    table: str,
    queue_url: str,
    allowed_hosts: str = LOCAL_UPSTREAM_HOSTS,
    upstream_protocols: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The router's own settings for local use (docs/DESIGN.md §7): ``ws://`` admitted,
    upstreams limited to ``allowed_hosts``, secrets under :data:`LOCAL_SECRET_PREFIX`,
    and the plug-in protocols the workers register (:func:`protocol_settings`)."""
    return {
        router_settings.TABLE_NAME: table,
        router_settings.QUEUE_URL: queue_url,
        router_settings.ALLOWED_UPSTREAM_HOSTS: allowed_hosts,
        router_settings.ALLOW_INSECURE_WS: "true",
        router_settings.ALLOWED_SECRET_PREFIX: LOCAL_SECRET_PREFIX,
        **protocol_settings(upstream_protocols),
    }


def protocol_settings(upstream_protocols: Mapping[str, str] | None) -> dict[str, str]:
    """``UPSTREAM_PROTOCOLS``, one value for the workers and the router alike (none
    without plug-ins), as a deployment sets it."""
    if not upstream_protocols:
        return {}
    return {UPSTREAM_PROTOCOLS: registry_text(upstream_protocols)}


def router_env(
    base: Mapping[str, str],
    *,
    endpoints: Endpoints,
    table: str,
    queue_url: str,
    allowed_hosts: str = LOCAL_UPSTREAM_HOSTS,
    upstream_protocols: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The environment of ``python -m local_stack.api_server``: the local AWS settings
    and :func:`local_router_settings` (a caller's own ``UPSTREAM_PROTOCOLS`` does not
    pass: the router's must be the workers')."""
    env = _local_env(base, endpoints, table, queue_url)
    env.pop(UPSTREAM_PROTOCOLS, None)
    env.update(
        local_router_settings(
            table=table,
            queue_url=queue_url,
            allowed_hosts=allowed_hosts,
            upstream_protocols=upstream_protocols,
        )
    )
    env["POWERTOOLS_SERVICE_NAME"] = "websocket-fleet-router"
    return env


def worker_env(
    base: Mapping[str, str],
    *,
    endpoints: Endpoints,
    table: str,
    queue_url: str,
    worker_id: str,
    health_file: Path,
    settings: Mapping[str, str | None] | None = None,
) -> dict[str, str]:
    """The environment of one worker: the local AWS settings, its id and health file,
    then ``settings`` (worker variables of docs/DESIGN.md §4.9 and handler options); a None value
    removes the variable, so the worker's own default applies even if the caller's
    environment sets it."""
    env = _local_env(base, endpoints, table, queue_url)
    env.update(
        {
            worker_settings.WORKER_ID: worker_id,
            worker_settings.HEALTH_FILE: str(health_file),
        }
    )
    for name, value in (settings or {}).items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    return env
