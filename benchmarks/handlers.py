"""Message handlers for benchmark workers (``HANDLER=benchmarks.handlers:...``); the
recording handler of the chaos run and the latency benchmarks is
:mod:`local_stack.recording`, shared with the tests.

- :func:`noop_factory`: does nothing; the worker's own ``messages_processed`` count
  (its "worker stats" log line) tells how many messages went through.
- :func:`noop_batch_factory`: a batch handler (``handle_batch``) that does nothing; the
  worker hands it every message already buffered for a connection in one call.
- :func:`noop_without_gc_factory`: the same, and it turns off the cyclic garbage
  collector of the worker process when the worker loads it. A diagnostic for the
  density benchmark: it shows how much of the renew lateness is collector pauses.
"""

from __future__ import annotations

import gc
from collections.abc import Sequence

from worker.delivery import Delivery


class NoopHandler:
    """Handles every message instantly."""

    async def handle(self, delivery: Delivery) -> None:
        return None


class NoopBatchHandler:
    """Handles every batch instantly."""

    async def handle_batch(self, deliveries: Sequence[Delivery]) -> None:
        return None


def noop_factory() -> NoopHandler:
    """``HANDLER=benchmarks.handlers:noop_factory``."""
    return NoopHandler()


def noop_batch_factory() -> NoopBatchHandler:
    """``HANDLER=benchmarks.handlers:noop_batch_factory``."""
    return NoopBatchHandler()


def noop_without_gc_factory() -> NoopHandler:
    """``HANDLER=benchmarks.handlers:noop_without_gc_factory`` (diagnostic only: the
    process then never frees reference cycles)."""
    gc.disable()
    return NoopHandler()
