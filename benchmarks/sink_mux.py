"""The three built-in sinks side by side in one worker, for :mod:`benchmarks.sink_e2e`
(``HANDLER=benchmarks.sink_mux:factory``): each connection's batches go to the sink its
id names, made by that sink's own factory from its own settings.

``SINK_MUX_SINKS`` lists the sinks to make (``kinesis``, ``firehose``, ``sqs_fifo``,
comma-separated); a connection id starts with the sink's name and a dash
(:func:`connection_prefix`: ``kinesis-``, ``firehose-``, ``sqs-fifo-``: an id may not
hold ``_``). A batch is one connection's (the worker calls a batch handler per
connection), so each sink gets exactly the calls it would get as the worker's only
handler; only the process, its event loop and its CPU are shared.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import Final, Protocol

from worker.delivery import Delivery
from worker.plugins import PluginError
from worker.sinks import firehose, kinesis, sqs_fifo

SINK_MUX_SINKS: Final = "SINK_MUX_SINKS"
SINK_NAMES: Final = ("kinesis", "firehose", "sqs_fifo")


class Sink(Protocol):
    async def handle_batch(self, deliveries: Sequence[Delivery]) -> None: ...


FACTORIES: Final[dict[str, Callable[[], Sink]]] = {
    "kinesis": kinesis.factory,
    "firehose": firehose.factory,
    "sqs_fifo": sqs_fifo.factory,
}


def connection_prefix(sink: str) -> str:
    """How the ids of ``sink``'s connections start."""
    return sink.replace("_", "-") + "-"


def sink_of(connection_id: str) -> str | None:
    """The sink a connection id names, if any."""
    return next((s for s in SINK_NAMES if connection_id.startswith(connection_prefix(s))), None)


class SinkMux:
    """A batch handler that hands each batch to the sink of its connection."""

    def __init__(self, sinks: Mapping[str, Sink]) -> None:
        self._sinks = dict(sinks)

    async def handle_batch(self, deliveries: Sequence[Delivery]) -> None:
        # One connection's batch: the sink of its first delivery takes it whole.
        name = sink_of(deliveries[0].connection_id)
        sink = self._sinks.get(name or "")
        if sink is None:
            raise RuntimeError(
                f"connection {deliveries[0].connection_id!r} names no sink of {sorted(self._sinks)}"
            )
        await sink.handle_batch(deliveries)


def sinks_from_env(env: Mapping[str, str]) -> list[str]:
    raw = env.get(SINK_MUX_SINKS, "")
    names = [name.strip() for name in raw.split(",") if name.strip()]
    unknown = sorted(set(names) - set(SINK_NAMES))
    if not names or unknown:
        raise PluginError(
            f"{SINK_MUX_SINKS} must list sinks of {', '.join(SINK_NAMES)}, got {raw!r}"
        )
    return names


def factory() -> SinkMux:
    """``HANDLER=benchmarks.sink_mux:factory``."""
    return SinkMux({name: FACTORIES[name]() for name in sinks_from_env(os.environ)})
