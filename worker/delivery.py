"""The public extension point: what a handler receives and must provide."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from worker.plugins import PluginError, load_factory

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Delivery:
    """One upstream message, fenced: a sink that keeps the highest ``epoch`` it has
    seen per connection can reject deliveries from a superseded lease holder, and
    ``(connection_id, seq)`` identifies a message for de-duplication."""

    connection_id: str
    epoch: int
    seq: int
    payload: Any
    worker_id: str


@runtime_checkable
class Handler(Protocol):
    """Calls are sequential per connection and concurrent across connections. A
    message counts as delivered once ``handle`` is entered; the checkpoint passes it
    only after ``handle`` returned. Raising means: not handled (retried by default)."""

    async def handle(self, delivery: Delivery) -> None: ...


class LogHandler:
    """The default handler: records each message in the structured log."""

    async def handle(self, delivery: Delivery) -> None:
        log.info(
            "message",
            extra={
                "connection_id": delivery.connection_id,
                "epoch": delivery.epoch,
                "seq": delivery.seq,
                "payload": delivery.payload,
            },
        )


def load_handler(spec: str | None) -> Handler:
    """The handler named by ``HANDLER`` (``module:factory``), or :class:`LogHandler`."""
    if not spec:
        return LogHandler()
    handler = load_factory(spec, setting="HANDLER")
    if not isinstance(handler, Handler):
        raise PluginError(f"HANDLER: {spec} made {handler!r}, which has no handle(delivery)")
    return handler
