"""The environment of the processes the local stack starts: workers and the router
get the local endpoints, credentials, table and queue, and nothing of the caller's
AWS settings that would point them elsewhere."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Final

from local_stack import services
from local_stack.options import Ports
from local_stack.services import LOCAL_CREDENTIALS, LOCAL_REGION, LOOPBACK

TABLE_NAME: Final = "connections"
QUEUE_NAME: Final = "websocket-fleet-starts"
#: Worker settings the runner always sets: metrics every 10 s keep the logs readable,
#: and a short SQS long poll makes a worker's shutdown quick.
METRICS_INTERVAL_S: Final = 10
SQS_WAIT_S: Final = 2
#: Environment the workers must not inherit: a profile the runner never configured
#: would make boto3 fail or pick other credentials, and a global endpoint override
#: would compete with the per-service ones set below.
_DROPPED_ENV: Final = (
    "AWS_PROFILE",
    "AWS_DEFAULT_PROFILE",
    "AWS_SESSION_TOKEN",
    "AWS_SECURITY_TOKEN",
    "AWS_ENDPOINT_URL",
)


def format_number(value: float) -> str:
    # "5" rather than "5.0" in URLs and messages; repr keeps every digit otherwise.
    return str(int(value)) if value.is_integer() else repr(value)


def demo_url(feed_port: int, index: int, rate: float) -> str:
    """The upstream URL of demo connection ``index``: feed name ``demo-<index>``."""
    return f"ws://{LOOPBACK}:{feed_port}/demo-{index}?rate={format_number(rate)}"


def local_aws_env(base: Mapping[str, str], *, ports: Ports, queue_url: str) -> dict[str, str]:
    """``base`` (the runner's own environment) minus settings that would point boto3
    elsewhere, plus the local endpoints, credentials, table and queue."""
    env = {name: value for name, value in base.items() if name not in _DROPPED_ENV}
    python_path = [str(services.REPO_ROOT), *filter(None, [base.get("PYTHONPATH")])]
    env.update(
        {
            "AWS_ACCESS_KEY_ID": LOCAL_CREDENTIALS,
            "AWS_SECRET_ACCESS_KEY": LOCAL_CREDENTIALS,
            "AWS_DEFAULT_REGION": LOCAL_REGION,
            "AWS_REGION": LOCAL_REGION,
            # boto3 reads these itself; no component passes endpoint_url (DESIGN 4).
            "AWS_ENDPOINT_URL_DYNAMODB": services.endpoint_url(ports.dynamodb),
            "AWS_ENDPOINT_URL_SQS": services.endpoint_url(ports.moto),
            "AWS_ENDPOINT_URL_CLOUDWATCH": services.endpoint_url(ports.moto),
            "TABLE_NAME": TABLE_NAME,
            "QUEUE_URL": queue_url,
            "PYTHONPATH": os.pathsep.join(python_path),
        }
    )
    return env


def router_env(base: Mapping[str, str], *, ports: Ports, queue_url: str) -> dict[str, str]:
    """The router's settings for local use (DESIGN 7): ``ws://`` admitted, upstreams
    limited to the loopback feed."""
    env = local_aws_env(base, ports=ports, queue_url=queue_url)
    env.update(
        {
            "ALLOWED_UPSTREAM_HOSTS": f"{LOOPBACK},localhost",
            "ALLOW_INSECURE_WS": "true",
            "POWERTOOLS_SERVICE_NAME": "websocket-fleet-router",
        }
    )
    return env


def worker_env(
    base: Mapping[str, str],
    *,
    worker_id: str,
    ports: Ports,
    queue_url: str,
    health_file: Path,
    lease_seconds: float | None,
) -> dict[str, str]:
    """The environment of one worker: the local AWS settings plus its own."""
    env = local_aws_env(base, ports=ports, queue_url=queue_url)
    env.update(
        {
            "WORKER_ID": worker_id,
            "HEALTH_FILE": str(health_file),
            "METRICS_INTERVAL_SECONDS": str(METRICS_INTERVAL_S),
            "SQS_WAIT_SECONDS": str(SQS_WAIT_S),
            # Log lines reach the file as they happen, for `tail -f`.
            "PYTHONUNBUFFERED": "1",
        }
    )
    if lease_seconds is not None:
        env["LEASE_SECONDS"] = repr(lease_seconds)
    else:
        env.pop("LEASE_SECONDS", None)
    return env
