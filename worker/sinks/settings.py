"""The sinks' settings, read from the environment in one place when a sink's factory
is called, so a worker with a wrong one stops at start with a message naming it.

These are the handler's variables (``handler_environment`` in a deployment), not
worker settings (:data:`worker.config.SETTINGS`).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Final, Literal
from urllib.parse import urlsplit

from worker.config import ConfigError
from worker.plugins import PluginError

SINK_STREAM_NAME: Final = "SINK_STREAM_NAME"
SINK_DELIVERY_STREAM: Final = "SINK_DELIVERY_STREAM"
SINK_QUEUE_URL: Final = "SINK_QUEUE_URL"
SINK_MAX_ATTEMPTS: Final = "SINK_MAX_ATTEMPTS"

DEFAULT_MAX_ATTEMPTS: Final = 5
"""How many times a sink sends one record refused for a reason that is not a throttle
within one batch call before it gives up and fails the call (the worker then sends
the batch again, leaving out what the call landed in order). Throttled records are
sent again without limit (:mod:`worker.sinks.sending`)."""
MAX_ATTEMPTS_LIMIT: Final = 20

SinkKind = Literal["kinesis", "firehose", "sqs_fifo"]

_STREAM_NAME = re.compile(r"[a-zA-Z0-9_.-]{1,128}")
_STREAM_ARN = re.compile(r"arn:aws[a-z-]*:kinesis:[a-z0-9-]+:\d{12}:stream/[a-zA-Z0-9_.-]{1,128}")
_DELIVERY_STREAM_NAME = re.compile(r"[a-zA-Z0-9_.-]{1,64}")


class SinkConfigError(ConfigError, PluginError):
    """A missing or malformed sink setting; the message names the variable. A
    :class:`~worker.plugins.PluginError` too: the worker reports it as the handler's
    and exits with status 2, as for any other plug-in error."""


@dataclass(frozen=True, slots=True)
class SinkSettings:
    destination: str
    """The Kinesis stream (name or ARN), the Firehose delivery stream's name, or the
    SQS FIFO queue's URL."""
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    """Sends of one record refused other than by a throttle, within one batch call
    (>= 1)."""

    @classmethod
    def from_env(cls, kind: SinkKind, env: Mapping[str, str] | None = None) -> SinkSettings:
        env = os.environ if env is None else env
        name, check = _DESTINATIONS[kind]
        value = env.get(name, "").strip()
        if not value:
            raise SinkConfigError(f"{name} is required by the {kind} sink")
        problem = check(value)
        if problem:
            raise SinkConfigError(f"{name} {problem}, got {value!r}")
        return cls(destination=value, max_attempts=_max_attempts(env))


def _stream(value: str) -> str | None:
    if _STREAM_NAME.fullmatch(value) or _STREAM_ARN.fullmatch(value):
        return None
    return "must be a Kinesis stream name (1-128 of [a-zA-Z0-9_.-]) or a stream ARN"


def _delivery_stream(value: str) -> str | None:
    if _DELIVERY_STREAM_NAME.fullmatch(value):
        return None
    return "must be a Firehose delivery stream name (1-64 of [a-zA-Z0-9_.-])"


def _fifo_queue_url(value: str) -> str | None:
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        return "must be an SQS queue URL (https://...)"
    if not parts.path.endswith(".fifo"):
        return "must be the URL of a FIFO queue (its name ends in .fifo)"
    return None


_DESTINATIONS: Final[dict[SinkKind, tuple[str, Callable[[str], str | None]]]] = {
    "kinesis": (SINK_STREAM_NAME, _stream),
    "firehose": (SINK_DELIVERY_STREAM, _delivery_stream),
    "sqs_fifo": (SINK_QUEUE_URL, _fifo_queue_url),
}


def _max_attempts(env: Mapping[str, str]) -> int:
    raw = env.get(SINK_MAX_ATTEMPTS, "").strip()
    if not raw:
        return DEFAULT_MAX_ATTEMPTS
    try:
        value = int(raw)
    except ValueError:
        raise SinkConfigError(f"{SINK_MAX_ATTEMPTS} must be an integer, got {raw!r}") from None
    if not 1 <= value <= MAX_ATTEMPTS_LIMIT:
        raise SinkConfigError(
            f"{SINK_MAX_ATTEMPTS} must be from 1 to {MAX_ATTEMPTS_LIMIT}, got {value}"
        )
    return value
