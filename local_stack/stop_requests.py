"""SIGINT, SIGTERM and SIGHUP of the local stack runner, turned into an orderly shutdown;
SIGTERM turned into Ctrl-C for the benchmarks."""

from __future__ import annotations

import contextlib
import enum
import os
import signal
import sys
from collections.abc import Iterator
from types import FrameType
from typing import Any


class Phase(enum.Enum):
    STARTING = "starting"
    RUNNING = "running"
    STOPPING = "stopping"


def _notify(text: str) -> None:
    # A raw write: a signal handler may run in the middle of a print() on a buffered
    # stream, and re-entering it would raise.
    with contextlib.suppress(OSError):
        os.write(sys.stderr.fileno(), text.encode())


class StopRequests:
    """SIGINT, SIGTERM and SIGHUP (the terminal went away), turned into an orderly
    shutdown: the children run in their own sessions, so nothing else stops them.

    The handler never raises while the runner owns children it has not recorded yet, or
    while it shuts down, so an impatient second Ctrl-C cannot leave orphans:

    - starting: the first signal stops the startup after the current step; a second one
      aborts a server's readiness wait (the only long step, and one that stops its own
      process on any exception) with KeyboardInterrupt;
    - running: the first signal ends the view loop;
    - stopping: a further signal sets :attr:`hurry`: stop waiting for the workers to
      release their leases, kill what is left and stop the servers with short timeouts.
    """

    def __init__(self) -> None:
        self.phase = Phase.STARTING
        self.signal: signal.Signals | None = None
        self.hurry = False
        self._abortable = False
        self._previous: dict[signal.Signals, Any] = {}

    def requested(self) -> bool:
        """Whether a stop signal has arrived (a method: the answer changes under the
        caller's feet, which a narrowed attribute would hide from the type checker)."""
        return self.signal is not None

    def install(self) -> None:
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            self._previous[signum] = signal.signal(signum, self._handle)

    def restore(self) -> None:
        for signum, previous in self._previous.items():
            # None means a handler installed from C, which Python cannot reinstate.
            if previous is not None:
                signal.signal(signum, previous)
        self._previous.clear()

    @contextlib.contextmanager
    def abortable(self) -> Iterator[None]:
        """Within this block a second signal during startup raises KeyboardInterrupt."""
        self._abortable = True
        try:
            yield
        finally:
            self._abortable = False

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if self.phase is Phase.STOPPING:
            if not self.hurry:
                self.hurry = True
                _notify(f"\n{name} again: not waiting any longer, killing what is left\n")
            return
        if self.signal is None:
            self.signal = signal.Signals(signum)
            if self.phase is Phase.STARTING:
                _notify(f"\n{name}: stopping after the current startup step (again to abort it)\n")
            return
        if self.phase is Phase.STARTING and self._abortable:
            raise KeyboardInterrupt


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Within the block, SIGTERM raises KeyboardInterrupt like a Ctrl-C does, so the
    ``finally`` blocks that stop child processes run on either."""

    def interrupt(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
