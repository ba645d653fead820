"""EMF metrics of the worker, flushed on a timer as one JSON line each period.

Every period publishes every counter (zeros included) and the ActiveConnections
gauge, because the scaling policy averages over tasks and a task that skips a
period would skew the average. Dimension sets: ``[Service]`` (fleet view and
scaling) and ``[Service, TaskId]`` (per-task view).
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Callable
from typing import Final, TextIO

from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.metrics.provider.cloudwatch_emf.cloudwatch import (
    AmazonCloudWatchEMFProvider,
)

from wsfleet import metric_names as m

log = logging.getLogger(__name__)

MALFORMED_REMEMBERED: Final = 10_000
"""Keys of malformed items remembered (so each is logged and counted once); past that
the memory starts afresh."""

VALUES_PER_DOCUMENT: Final = 99
"""Values of one metric per EMF document: EMF takes up to 100, and Powertools
publishes a metric on its own the moment it holds 100."""


class HandledTally:
    """Messages handled since the last flush, added to by every connection's reader
    after each handler call that returned: one attribute update instead of a method
    call per message. :class:`FleetMetrics` reports it as ``MessagesProcessed``."""

    __slots__ = ("messages",)

    def __init__(self) -> None:
        self.messages = 0


class FleetMetrics:
    def __init__(
        self,
        *,
        namespace: str,
        service: str,
        task_id: str,
        active_connections: Callable[[], int],
        out: TextIO | None = None,
    ) -> None:
        self._emf = AmazonCloudWatchEMFProvider(namespace=namespace)
        # Powertools adds a "service" dimension whenever a service name is known
        # (argument or POWERTOOLS_SERVICE_NAME); a metric published with
        # {Service, service} would not match a scaling policy keyed on {Service}.
        self._emf.service = None  # type: ignore[assignment]
        self._service = service
        self._task_id = task_id
        self._active = active_connections
        self._out = out
        self._counts = dict.fromkeys(m.COUNTERS, 0)
        self.handled = HandledTally()
        """``MessagesProcessed`` as the readers count it (see :class:`HandledTally`)."""
        self._takeover_latencies: list[float] = []
        self._upstream_gaps: list[float] = []
        self._renew_lateness: list[float] = []
        self._renew_gaps: list[float] = []
        self._renew_slacks: list[float] = []
        self._loop_lags: list[float] = []
        self._gc_pauses: tuple[list[float], list[float], list[float]] = ([], [], [])
        self._malformed_seen: set[str] = set()

    def count(self, name: str, value: int = 1) -> None:
        self._counts[name] += value

    def malformed_item(self, key: str, problem: str) -> None:
        """An item that cannot be decoded or run (docs/DESIGN.md §2.2): logged with
        its key and counted in ``MalformedItems`` the first time this worker meets it,
        since a malformed page or session item is read again by every pass."""
        if key in self._malformed_seen:
            return
        if len(self._malformed_seen) >= MALFORMED_REMEMBERED:
            self._malformed_seen.clear()
        self._malformed_seen.add(key)
        self._counts[m.MALFORMED_ITEMS] += 1
        log.warning("malformed item", extra={"key": key, "problem": problem})

    def takeover_latency(self, milliseconds: float) -> None:
        self._takeover_latencies.append(milliseconds)

    def upstream_gap(self, milliseconds: float) -> None:
        """A stream that cannot resume delivered again after a move or a reconnect,
        ``milliseconds`` after its previous delivery (counted as ``UpstreamGaps`` too)."""
        self._upstream_gaps.append(milliseconds)
        self._counts[m.UPSTREAM_GAPS] += 1

    def renew_lateness(self, seconds: float) -> None:
        """How late a renew was sent against its schedule (event loop lag)."""
        self._renew_lateness.append(max(0.0, seconds))

    def loop_lag(self, seconds: float) -> None:
        """How late a timer of the event loop fired (worker.loop_watch)."""
        self._loop_lags.append(max(0.0, seconds))

    def gc_pause(self, generation: int, seconds: float) -> None:
        """One collection of the cyclic garbage collector and the CPU time it took."""
        self._gc_pauses[min(generation, 2)].append(seconds)

    def loop_summary(self) -> dict[str, float | int]:
        """Event-loop lag of this period (p50, p99, max in ms) and the collector's
        collections by generation with the longest of each, in CPU ms (logged, not
        published)."""
        lags = sorted(self._loop_lags)
        summary: dict[str, float | int] = {"lag_samples": len(lags)}
        if lags:
            summary |= {
                "lag_p50_ms": _pick(lags, 0.5),
                "lag_p99_ms": _pick(lags, 0.99),
                "lag_max_ms": _pick(lags, 1.0),
            }
        for generation, pauses in enumerate(self._gc_pauses):
            summary[f"gc{generation}"] = len(pauses)
            if pauses:
                summary[f"gc{generation}_max_ms"] = round(1000 * max(pauses), 1)
        return summary

    def session_renewed(self, gap: float | None, slack: float) -> None:
        """A session renew landed ``gap`` seconds after the previous one was sent, with
        ``slack`` seconds left before the fence deadline it replaced."""
        if gap is not None:
            self._renew_gaps.append(gap)
        self._renew_slacks.append(slack)

    def session_summary(self) -> dict[str, float | int]:
        """Gaps between successful session renews (p50, p99, max, in ms) and the
        smallest slack to the fence deadline of this period (logged, not published)."""
        gaps = sorted(self._renew_gaps)
        summary: dict[str, float | int] = {"renews_landed": len(self._renew_slacks)}
        if gaps:
            summary |= {
                "gap_p50_ms": _pick(gaps, 0.5),
                "gap_p99_ms": _pick(gaps, 0.99),
                "gap_max_ms": _pick(gaps, 1.0),
            }
        if self._renew_slacks:
            summary["min_slack_ms"] = round(1000 * min(self._renew_slacks), 1)
        return summary

    def lateness_summary(self) -> dict[str, float | int]:
        """Renew lateness of this period in ms: count, p50, p99, max (not published
        as a metric; logged with each flush for operators and benchmarks)."""
        values = sorted(self._renew_lateness)
        if not values:
            return {"renews": 0}
        return {
            "renews": len(values),
            "p50_ms": _pick(values, 0.5),
            "p99_ms": _pick(values, 0.99),
            "max_ms": _pick(values, 1.0),
        }

    def snapshot(self) -> dict[str, int]:
        """Counts since the last flush (for logs and tests)."""
        self._fold_handled()
        return dict(self._counts)

    def _fold_handled(self) -> None:
        self._counts[m.MESSAGES_PROCESSED] += self.handled.messages
        self.handled.messages = 0

    def flush(self, timestamp_ms: int | None = None) -> list[dict[str, object]]:
        """Write this period's EMF lines, reset the counters, return the documents.

        The first document carries every counter and ActiveConnections exactly once,
        with up to :data:`VALUES_PER_DOCUMENT` takeover latencies and as many upstream
        gaps; further values follow in documents of their own, so none is dropped.
        Powertools publishes a metric by itself (to stdout, then empties its set) once
        it holds 100 values; keeping each document below that means everything goes
        out through here.
        """
        series = {
            m.TAKEOVER_LATENCY_MS: self._takeover_latencies,
            m.UPSTREAM_GAP_MS: self._upstream_gaps,
        }
        longest = max(len(values) for values in series.values())
        self._fold_handled()
        documents = [
            self._document(
                {
                    name: values[start : start + VALUES_PER_DOCUMENT]
                    for name, values in series.items()
                },
                timestamp_ms,
                with_counters=start == 0,
            )
            for start in range(0, max(longest, 1), VALUES_PER_DOCUMENT)
        ]
        self._counts = dict.fromkeys(m.COUNTERS, 0)
        self._takeover_latencies = []
        self._upstream_gaps = []
        self._renew_lateness = []
        self._renew_gaps = []
        self._renew_slacks = []
        self._loop_lags = []
        self._gc_pauses = ([], [], [])
        out = self._out or sys.stdout
        out.write("".join(json.dumps(doc, separators=(",", ":")) + "\n" for doc in documents))
        out.flush()
        return documents

    def _document(
        self,
        values: dict[str, list[float]],
        timestamp_ms: int | None,
        *,
        with_counters: bool,
    ) -> dict[str, object]:
        emf = self._emf
        emf.clear_metrics()
        emf.add_dimension(name=m.SERVICE_DIMENSION, value=self._service)
        emf.add_dimensions(**{m.SERVICE_DIMENSION: self._service, m.TASK_DIMENSION: self._task_id})
        if with_counters:
            emf.add_metric(name=m.ACTIVE_CONNECTIONS, unit=MetricUnit.Count, value=self._active())
            for name, count in self._counts.items():
                emf.add_metric(name=name, unit=MetricUnit.Count, value=count)
        for name, chunk in values.items():
            for value in chunk:
                emf.add_metric(name=name, unit=MetricUnit.Milliseconds, value=value)
        if timestamp_ms is not None:
            emf.set_timestamp(timestamp_ms)
        try:
            return dict(emf.serialize_metric_set())
        finally:
            emf.clear_metrics()


def _pick(ordered: list[float], q: float) -> float:
    """The ``q`` quantile of sorted seconds, in ms."""
    return round(1000 * ordered[min(len(ordered) - 1, int(q * len(ordered)))], 1)
