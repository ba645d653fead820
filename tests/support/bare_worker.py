"""A Worker with no stores, queue or handler behind it, for tests of its own decisions."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

from worker.config import WorkerConfig
from worker.fleet_worker import Worker, WorkerDeps
from wsfleet.timing import LeaseTiming


def bare_worker(timing: LeaseTiming) -> Worker:
    store = cast(Any, SimpleNamespace(timing=timing))
    deps = WorkerDeps(
        store=store,
        sessions=store,
        renewals=store,
        sqs=cast(Any, None),
        handler=cast(Any, None),
        protocol=cast(Any, None),
    )
    return Worker(WorkerConfig(table_name="t", queue_url="q", worker_id="w", timing=timing), deps)
