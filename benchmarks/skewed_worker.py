"""A worker whose wall clock is wrong, for :mod:`benchmarks.wall_clock`.

``python -m benchmarks.skewed_worker --offset SECONDS [--jump SECONDS --every SECONDS]``
runs ``python -m worker`` (same environment, same exit status) in this process after
replacing ``time.time`` and ``time.time_ns`` with functions that read the real wall
clock plus an offset: ``--offset`` throughout, and with ``--jump`` the clock jumps
by ``+jump`` after ``--every`` seconds, back by ``-jump`` after as many again, and so on
(offset, offset + jump, offset, ...), timed on the monotonic clock.

Only the wall clock moves: ``time.monotonic``, ``time.perf_counter`` and the event
loop's clock (``loop.time()``, itself monotonic) are left alone. The patch is applied
before the worker's modules are imported, so everything of the worker that reads
``time.time``/``time.time_ns`` sees it: its ``wall_ms`` (``worker.fleet_worker``),
the times it writes into the table (session expiries, acquire and release times,
notices) and its log timestamps. Two readers keep the real clock:

- boto3's request signing, which reads ``datetime.datetime.now`` (a C clock this
  patch does not touch), so signatures carry the real time; the start line reports
  that offset as ``signing_offset_s``. (DynamoDB Local and moto accept signatures dated
  minutes off anyway; AWS would accept up to 5 minutes.)
- the recording handler (:mod:`local_stack.recording`), which is the benchmark's
  instrument, not the system under test: its delivery records must be on the same
  clock as every other worker's for the audit to order them. Its module gets a
  ``time`` of its own (:func:`keep_real_clock`).

Before running the worker it writes one JSON line to stderr (its log):
``{"message": "wall clock skewed", "offset_s": ..., "jump_s": ..., "every_s": ...,
"signing_offset_s": ...}``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

MESSAGE = "wall clock skewed"
"""The ``message`` of the line written before the worker runs."""


@dataclass(frozen=True, slots=True)
class ClockSkew:
    """How wrong the wall clock is: ``offset`` seconds, plus ``jump`` seconds during
    every other stretch of ``every`` seconds (the first stretch without)."""

    offset: float = 0.0
    jump: float = 0.0
    every: float = 0.0
    """0: no jumps."""

    @property
    def jumps(self) -> bool:
        return self.jump != 0.0 and self.every > 0.0

    def offset_at(self, elapsed: float) -> float:
        """The offset ``elapsed`` seconds (monotonic) after the patch."""
        if not self.jumps or int(elapsed // self.every) % 2 == 0:
            return self.offset
        return self.offset + self.jump

    def argv(self) -> list[str]:
        """This skew as arguments of ``python -m benchmarks.skewed_worker``."""
        args = [f"--offset={self.offset!r}"]
        if self.jumps:
            args += [f"--jump={self.jump!r}", f"--every={self.every!r}"]
        return args

    def describe(self) -> str:
        text = f"{self.offset:+g} s"
        if self.jumps:
            text += f", {self.jump:+g} s / back every {self.every:g} s"
        return text


@dataclass
class PatchedClock:
    """The wall clock as patched by :func:`patch_wall_clock`; :meth:`restore` undoes it."""

    skew: ClockSkew
    monotonic: Callable[[], float]
    started: float
    real_time: Callable[[], float]
    real_time_ns: Callable[[], int]
    _restored: bool = field(default=False, repr=False)

    def offset_now(self) -> float:
        return self.skew.offset_at(self.monotonic() - self.started)

    def time(self) -> float:
        """The skewed ``time.time()``."""
        return self.real_time() + self.offset_now()

    def time_ns(self) -> int:
        """The skewed ``time.time_ns()``."""
        return self.real_time_ns() + round(self.offset_now() * 1e9)

    def restore(self) -> None:
        """Put the real ``time.time`` and ``time.time_ns`` back (idempotent)."""
        if not self._restored:
            time.time = self.real_time
            time.time_ns = self.real_time_ns
            self._restored = True


def patch_wall_clock(
    skew: ClockSkew, *, monotonic: Callable[[], float] = time.monotonic
) -> PatchedClock:
    """Replace ``time.time`` and ``time.time_ns`` in this process by skewed ones
    (every later ``time.time()`` call, and every ``from time import time`` from now
    on, gets them). ``monotonic`` times the jumps; it is never patched."""
    clock = PatchedClock(skew, monotonic, monotonic(), time.time, time.time_ns)
    time.time = clock.time
    time.time_ns = clock.time_ns
    return clock


@contextlib.contextmanager
def skewed_wall_clock(
    skew: ClockSkew, *, monotonic: Callable[[], float] = time.monotonic
) -> Iterator[PatchedClock]:
    """:func:`patch_wall_clock` for the ``with`` block only."""
    clock = patch_wall_clock(skew, monotonic=monotonic)
    try:
        yield clock
    finally:
        clock.restore()


def real_time_module(clock: PatchedClock) -> types.ModuleType:
    """A copy of the ``time`` module whose ``time`` and ``time_ns`` read the real clock."""
    real = types.ModuleType("time", time.__doc__)
    vars(real).update(vars(time))
    vars(real).update(time=clock.real_time, time_ns=clock.real_time_ns)
    return real


def keep_real_clock(module: types.ModuleType, clock: PatchedClock) -> None:
    """Give ``module`` (one that did ``import time``) the real wall clock back."""
    vars(module)["time"] = real_time_module(clock)


def signing_offset(clock: PatchedClock) -> float:
    """How far the clock boto3 signs requests with is from the real wall clock."""
    from botocore.compat import get_current_datetime  # after the patch

    signing = get_current_datetime(remove_tzinfo=False).timestamp()
    return signing - clock.real_time()


def parse_args(argv: list[str] | None) -> ClockSkew:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.skewed_worker", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--offset", type=float, default=0.0, help="seconds added to the wall clock")
    parser.add_argument(
        "--jump", type=float, default=0.0, help="seconds the clock jumps by, then back"
    )
    parser.add_argument("--every", type=float, default=0.0, help="seconds between jumps")
    args = parser.parse_args(argv)
    if (args.jump != 0.0) != (args.every > 0.0):
        parser.error("--jump and --every (> 0) go together")
    return ClockSkew(args.offset, args.jump, args.every)


def main(argv: list[str] | None = None) -> int:
    skew = parse_args(argv)
    clock = patch_wall_clock(skew)
    from local_stack import recording  # after the patch

    keep_real_clock(recording, clock)
    line = {
        "message": MESSAGE,
        "offset_s": skew.offset,
        "jump_s": skew.jump,
        "every_s": skew.every,
        "signing_offset_s": round(signing_offset(clock), 3) + 0.0,  # no -0.0
    }
    print(json.dumps(line), file=sys.stderr, flush=True)
    from worker.__main__ import main as worker_main  # after the patch

    return worker_main()


if __name__ == "__main__":
    raise SystemExit(main())
