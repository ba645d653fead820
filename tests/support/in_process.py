"""A real :class:`Worker` in the test's own process, against DynamoDB Local and moto's
SQS, whose store calls can be held: a test orders two steps of the protocol
explicitly (hold an acquire, reap the session, let the acquire land) instead of
leaving the interleaving to luck."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support.timing import scaled
from worker.config import WorkerConfig
from worker.delivery import Delivery
from worker.fleet_worker import Worker, WorkerDeps
from worker.upstream_protocol import load_protocol
from wsfleet.lease_store import LeaseStore
from wsfleet.session_store import SessionStore
from wsfleet.timing import LeaseTiming

SCALED_TIMING = LeaseTiming.from_lease(2.0, heartbeat=0.5, reconcile=0.5)
"""The scaled timings of the tests and outside checks."""


class Hold:
    """One held call: ``entered`` is set once a call has arrived and waits;
    :meth:`release` lets it (and every later one) through."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self._go = threading.Event()
        self.calls = 0

    def wait_entered(self, within: float = 10.0) -> None:
        if not self.entered.wait(scaled(within)):
            raise AssertionError("the held call never arrived")

    async def entered_async(self, within: float = 10.0) -> None:
        await asyncio.get_running_loop().run_in_executor(None, self.wait_entered, within)

    def release(self) -> None:
        self._go.set()

    def pass_through(self) -> None:
        """Called on the caller's thread (an executor thread): wait until released."""
        self.calls += 1
        self.entered.set()
        if not self._go.wait(scaled(60.0)):
            raise TimeoutError("a held call was never released")


class Gated:
    """A proxy of a store (or client) whose named methods can be held."""

    def __init__(self, target: Any) -> None:
        self._target = target
        self._holds: dict[str, Hold] = {}
        self._failing: set[str] = set()
        self._lost: dict[str, int] = {}
        self._lock = threading.Lock()
        self.calls: dict[str, int] = {}

    def hold(self, name: str) -> Hold:
        """Hold every call of ``name`` from now on, until the hold is released."""
        hold = Hold()
        with self._lock:
            self._holds[name] = hold
        return hold

    def fail(self, name: str) -> None:
        """Every call of ``name`` raises (as a request with no answer would) until
        :meth:`heal`."""
        with self._lock:
            self._failing.add(name)

    def lose_replies(self, name: str, count: int) -> None:
        """The next ``count`` calls of ``name`` are made, and then raise as a request
        whose answer was lost would."""
        with self._lock:
            self._lost[name] = count

    def heal(self, name: str) -> None:
        with self._lock:
            self._failing.discard(name)

    def release_all(self) -> None:
        with self._lock:
            holds = list(self._holds.values())
        for hold in holds:
            hold.release()

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._target, name)
        if not callable(attribute):
            return attribute

        def call(*args: Any, **kwargs: Any) -> Any:
            with self._lock:
                hold = self._holds.get(name)
                failing = name in self._failing
                self.calls[name] = self.calls.get(name, 0) + 1
            if hold is not None:
                hold.pass_through()
                with self._lock:  # failed while it was held: it ends with no answer
                    failing = failing or name in self._failing
            if failing:
                raise ConnectionError(f"{name}: no answer (injected)")
            result = attribute(*args, **kwargs)
            with self._lock:
                lost = self._lost.get(name, 0)
                if lost:
                    self._lost[name] = lost - 1
            if lost:
                raise ConnectionError(f"{name}: applied, its answer lost (injected)")
            return result

        return call


@dataclass
class Recorder:
    """A handler that records every delivery."""

    deliveries: list[Delivery] = field(default_factory=list)

    async def handle(self, delivery: Delivery) -> None:
        self.deliveries.append(delivery)


@dataclass
class InProcessWorker:
    worker: Worker
    store: Gated
    sessions: Gated
    renewals: Gated
    """The session renew's own store, which also opens the sessions."""
    handler: Any
    task: asyncio.Task[None]
    stop: asyncio.Event


@contextlib.asynccontextmanager
async def in_process_worker(
    ddb: Any,
    table: str,
    sqs: Any,
    queue_url: str,
    tmp_path: Path,
    *,
    worker_id: str = "w-in-process",
    timing: LeaseTiming = SCALED_TIMING,
    handler: Any = None,
    store: Callable[[LeaseStore], Gated] = Gated,
    renewals_lose: Mapping[str, int] | None = None,
    **config: Any,
) -> AsyncIterator[InProcessWorker]:
    """Run a worker until the block ends (then shut it down gracefully).
    ``renewals_lose``: calls of the renew's store whose first answers are lost (by
    method name), from the start."""
    lease_store = store(LeaseStore(ddb, table, timing))
    sessions = Gated(SessionStore(ddb, table, timing))
    renewals = Gated(SessionStore(ddb, table, timing))
    for name, count in (renewals_lose or {}).items():
        renewals.lose_replies(name, count)
    handler = handler or Recorder()
    worker = Worker(
        WorkerConfig(
            table_name=table,
            queue_url=queue_url,
            worker_id=worker_id,
            timing=timing,
            health_file=tmp_path / f"{worker_id}.alive",
            **{"sqs_wait_seconds": 0, **config},
        ),
        WorkerDeps(
            store=lease_store,  # type: ignore[arg-type]
            sessions=sessions,  # type: ignore[arg-type]
            renewals=renewals,  # type: ignore[arg-type]
            sqs=sqs,
            handler=handler,
            protocol=load_protocol("json-seq"),
        ),
    )
    stop = asyncio.Event()
    task = asyncio.create_task(worker.run(stop), name=f"worker:{worker_id}")
    running = InProcessWorker(worker, lease_store, sessions, renewals, handler, task, stop)
    try:
        yield running
    finally:
        lease_store.release_all()
        sessions.release_all()
        renewals.release_all()
        stop.set()
        await asyncio.wait_for(task, scaled(60.0))


async def until(probe: Callable[[], Any], within: float = 10.0, what: str = "") -> Any:
    """Wait (polling the loop) until ``probe()`` is truthy; its value."""
    deadline = asyncio.get_running_loop().time() + scaled(within)
    while True:
        got = probe()
        if got:
            return got
        if asyncio.get_running_loop().time() >= deadline:
            raise AssertionError(f"not within {within} s: {what or probe}")
        await asyncio.sleep(0.01)
