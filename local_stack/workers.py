"""Worker processes of a local fleet: ``python -m worker`` children, each in its own
session (a terminal's Ctrl-C reaches only the parent, which decides the order of the
shutdown), with their log and health stamp.

Launching, readiness (the event loop's first health stamp), signalling, stopping in
order (every worker SIGTERM at once, a grace period to release their leases, SIGKILL
for the rest), and reading what they log.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Final

from local_stack import services
from local_stack.clock import wait_until
from local_stack.json_lines import JsonLinesTail
from local_stack.services import ManagedProcess

#: How long a worker may take to start its event loop (first health stamp).
WORKER_READY_TIMEOUT_S: Final = 30.0
#: How long a SIGKILLed worker may take to be reaped.
_REAP_TIMEOUT_S: Final = 5.0


class WorkerStartError(RuntimeError):
    """A worker exited, or did not get going, while starting; the message quotes its log."""


@dataclass(eq=False)
class WorkerProcess(ManagedProcess):
    """One ``python -m worker`` child; its stdout (EMF) and stderr (JSON logs) go to
    ``log_path``. ``name`` is its ``WORKER_ID``."""

    health_file: Path
    """Stamped by the worker's event loop (its ``HEALTH_FILE``)."""
    _tail: JsonLinesTail = field(default_factory=JsonLinesTail, repr=False)
    _events: list[dict[str, Any]] = field(default_factory=list, repr=False)
    _terminated: bool = False

    @property
    def worker_id(self) -> str:
        return self.name

    @property
    def pid(self) -> int:
        return self.process.pid

    def signal(self, sig: signal.Signals) -> None:
        if sig == signal.SIGTERM:
            self._terminated = True
        super().signal(sig)

    def terminate(self) -> None:
        """SIGCONT (it may be paused), then SIGTERM unless one was already sent: a
        second SIGTERM that arrives after the worker's event loop has closed (its
        handlers gone) would kill it on its way out."""
        self.signal(signal.SIGCONT)
        if not self._terminated:
            self.signal(signal.SIGTERM)

    def stop(self, timeout: float = 20.0) -> int | None:
        """:meth:`terminate`, wait ``timeout``, then SIGKILL and wait again. Returns the
        exit status (negative: killed by that signal), None if it would not die."""
        self.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            return self.process.wait(timeout)
        self.signal(signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            return self.process.wait(timeout)
        return None

    # -- readiness

    def ready(self) -> bool:
        """Whether the event loop has stamped the health file (its signal handlers are
        installed by then, so a SIGTERM gets the graceful shutdown). Raises
        WorkerStartError if the worker has exited."""
        if self.health_file.exists():
            return True
        if not self.alive():
            raise WorkerStartError(
                f"{self.name} exited with status {self.process.returncode} while starting; "
                f"end of {self.log_path}:\n{self.log_tail()}"
            )
        return False

    # -- its log

    def log(self) -> str:
        """The whole log so far."""
        return self.log_path.read_text(errors="replace")

    def events(self) -> list[dict[str, Any]]:
        """Every JSON line of the log so far (read incrementally), oldest first."""
        self._events.extend(self._tail.read(self.log_path))
        return self._events

    def logged(self, message: str) -> list[dict[str, Any]]:
        """The JSON log lines whose ``message`` is ``message``."""
        return [event for event in self.events() if event.get("message") == message]


def parse_log_time(raw: str) -> float:
    """Epoch seconds of a worker log line's ``timestamp`` (Powertools' format,
    ``2026-01-01 12:00:00,123+0000``)."""
    return datetime.strptime(raw.replace(",", "."), "%Y-%m-%d %H:%M:%S.%f%z").timestamp()


def launch_worker(
    worker_id: str,
    env: Mapping[str, str],
    *,
    log_path: Path,
    health_file: Path,
    python: str = sys.executable,
) -> WorkerProcess:
    """Start ``python -m worker`` with ``env`` without waiting for it (see
    :func:`wait_ready`). ``env`` names ``health_file`` as its ``HEALTH_FILE``;
    ``python``: another interpreter (a handler directory's virtualenv)."""
    # A stamp left by a previous run would pass for readiness.
    health_file.parent.mkdir(parents=True, exist_ok=True)
    health_file.unlink(missing_ok=True)
    popen = services.spawn([python, "-m", "worker"], log_path, cwd=services.REPO_ROOT, env=env)
    return WorkerProcess(worker_id, popen, log_path, health_file)


def wait_ready(
    workers: Iterable[WorkerProcess],
    timeout: float = WORKER_READY_TIMEOUT_S,
    *,
    give_up: Callable[[], bool] = lambda: False,
) -> None:
    """Return once every worker is :meth:`~WorkerProcess.ready`, or as soon as
    ``give_up()`` is true. Raises WorkerStartError for a worker that exited, and
    TimeoutError (naming the laggards) after ``timeout`` seconds."""
    pending = list(workers)

    def all_ready() -> bool:
        pending[:] = [worker for worker in pending if not worker.ready()]
        return not pending or give_up()

    try:
        wait_until(all_ready, timeout, "workers to start")
    except TimeoutError:
        names = ", ".join(worker.name for worker in pending)
        raise TimeoutError(f"{names} not running after {timeout:g} s") from None


@dataclass(frozen=True, slots=True)
class StopResult:
    statuses: dict[str, int | None]
    """Exit status of each worker that was running (negative: killed by that signal)."""
    killed: list[str]
    """Workers that had to be SIGKILLed."""
    seconds: float

    @property
    def clean(self) -> bool:
        """Nobody was killed and every worker exited with status 0."""
        return not self.killed and all(status == 0 for status in self.statuses.values())


def stop_workers(
    workers: Iterable[WorkerProcess],
    timeout: float,
    *,
    hurry: Callable[[], bool] = lambda: False,
) -> StopResult:
    """SIGTERM every running worker at once (SIGCONT first: one may be paused), give
    them ``timeout`` seconds to release their leases with final checkpoints (or until
    ``hurry()`` is true), then SIGKILL whoever is left."""
    began = time.monotonic()
    running = [worker for worker in workers if worker.alive()]
    for worker in running:
        worker.terminate()
    with contextlib.suppress(TimeoutError):
        wait_until(
            lambda: hurry() or not any(worker.alive() for worker in running),
            timeout,
            "workers to exit",
        )
    killed = [worker for worker in running if worker.alive()]
    for worker in killed:
        worker.signal(signal.SIGKILL)
    for worker in killed:
        with contextlib.suppress(subprocess.TimeoutExpired):
            worker.process.wait(_REAP_TIMEOUT_S)
    return StopResult(
        {worker.name: worker.process.returncode for worker in running},
        [worker.name for worker in killed],
        time.monotonic() - began,
    )
