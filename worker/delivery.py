"""The public extension point: what a handler receives and must provide."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, fields
from typing import Any, Protocol, runtime_checkable

from worker.plugins import PluginError, load_factory

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Delivery:
    """One upstream message, fenced: a sink that keeps the highest ``epoch`` it has
    seen per connection can reject deliveries from a superseded lease holder, and
    ``(connection_id, seq_gen, seq)`` identifies a message for de-duplication."""

    connection_id: str
    epoch: int
    seq: int
    payload: Any
    worker_id: str
    seq_gen: int = 0
    """The connection's stream generation: a restart on a new stream (another URL or
    protocol) starts its seqs again from 1 under a higher ``seq_gen``, so ``seq``
    alone is unique only within one ``seq_gen``. Last, and 0 by default (a stream
    never replaced), so deliveries made by hand before it existed, in a handler's
    own tests, are still made the same way; the worker always sets it."""


def _delivery_maker() -> Callable[[str, int, int, Any, str, int], Delivery]:
    """``Delivery(connection_id, epoch, seq, payload, worker_id, seq_gen)`` for the
    per-message path: the same frozen object, made by setting its slots directly
    instead of through the generic ``object.__setattr__`` the frozen ``__init__`` uses
    per field (about a third cheaper)."""
    names = tuple(f.name for f in fields(Delivery))
    if names != ("connection_id", "epoch", "seq", "payload", "worker_id", "seq_gen"):
        raise TypeError(f"make_delivery does not know Delivery's fields {names}")
    new = object.__new__
    set_id, set_epoch, set_seq, set_payload, set_worker, set_seq_gen = (
        getattr(Delivery, name).__set__ for name in names
    )

    def make_delivery(
        connection_id: str, epoch: int, seq: int, payload: Any, worker_id: str, seq_gen: int
    ) -> Delivery:
        delivery: Delivery = new(Delivery)
        set_id(delivery, connection_id)
        set_epoch(delivery, epoch)
        set_seq(delivery, seq)
        set_payload(delivery, payload)
        set_worker(delivery, worker_id)
        set_seq_gen(delivery, seq_gen)
        return delivery

    return make_delivery


make_delivery = _delivery_maker()


@runtime_checkable
class Handler(Protocol):
    """Calls are sequential per connection and concurrent across connections. A
    message counts as delivered once ``handle`` is entered; the checkpoint passes it
    only after ``handle`` returned. Raising means: not handled (retried by default)."""

    async def handle(self, delivery: Delivery) -> None: ...


@runtime_checkable
class BatchHandler(Protocol):
    """A handler object that has ``handle_batch`` gets batches instead of single
    messages: every message already buffered for a connection when the call starts,
    contiguous and in seq order (at least one). Batch calls are sequential per
    connection and concurrent across connections; every message of a batch counts as
    delivered once ``handle_batch`` is entered, and the checkpoint passes the whole
    batch only after it returned. Raising means: none of the batch is handled; it is
    retried whole (by default) or skipped whole (``HANDLER_ERRORS=skip``)."""

    async def handle_batch(self, deliveries: Sequence[Delivery]) -> None: ...


AnyHandler = Handler | BatchHandler
"""What ``HANDLER`` may name: a batch handler is called with batches, even when it
also has ``handle``."""


def batch_call(handler: AnyHandler) -> Callable[[Sequence[Delivery]], Awaitable[None]] | None:
    """The handler's ``handle_batch``, when it has one."""
    call = getattr(handler, "handle_batch", None)
    return call if callable(call) else None


class LogHandler:
    """The default handler: records each message in the structured log."""

    async def handle(self, delivery: Delivery) -> None:
        log.info(
            "message",
            extra={
                "connection_id": delivery.connection_id,
                "epoch": delivery.epoch,
                "seq_gen": delivery.seq_gen,
                "seq": delivery.seq,
                "payload": delivery.payload,
            },
        )


def load_handler(spec: str | None) -> AnyHandler:
    """The handler named by ``HANDLER`` (``module:factory``), or :class:`LogHandler`."""
    if not spec:
        return LogHandler()
    handler = load_factory(spec, setting="HANDLER")
    if not isinstance(handler, Handler | BatchHandler):
        raise PluginError(
            f"HANDLER: {spec} made {handler!r}, which has neither handle(delivery) "
            "nor handle_batch(deliveries)"
        )
    return handler
