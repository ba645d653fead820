"""Where a worker's CPU goes on the per-message path: py-spy samples of one worker
with a no-op handler reading ``rate=0`` feeds, as in :mod:`benchmarks.throughput`.

``python -m benchmarks.hot_profile [--connections 8] [--seconds 15] [--handler-mode single]``

py-spy (``requirements-dev.txt``) attaches to the running worker without pausing it
(``--nonblocking``) and records raw stacks; of the event loop's stacks this prints the
functions with the most samples of their own (the innermost frame), and those with
the most samples anywhere on the stack. Python frames only: time in C code is
counted against the Python function that called it.
"""

from __future__ import annotations

import argparse
import collections
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.profiles import ours
from benchmarks.report import emit, machine, table
from local_stack.clock import wait_until
from local_stack.server_group import LocalServers
from local_stack.stop_requests import sigterm_as_interrupt
from worker import config as worker_settings
from wsfleet import accelerators

LOOP_FRAME = "Runner.run "
"""Stacks without this frame are not the event loop's (the worker runs its loop in an
``asyncio.Runner``, on either event loop). uvloop's own work is C, which py-spy does
not show: its samples count as ``Runner.run``'s own."""

BASE_SHARE = 0.9
"""Frames on at least this share of the loop's stacks (the loop itself, ``main``)
are left out of the "anywhere" list."""

HANDLERS = {
    "single": "benchmarks.handlers:noop_factory",
    "batch": "benchmarks.handlers:noop_batch_factory",
}


def parse_raw(text: str) -> tuple[collections.Counter[str], collections.Counter[str], int]:
    """Own and inclusive sample counts per function from py-spy's raw (collapsed)
    output: one line per distinct stack, ``frame;frame;...;frame count``."""
    own: collections.Counter[str] = collections.Counter()
    anywhere: collections.Counter[str] = collections.Counter()
    total = 0
    for line in text.splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = [_function(frame) for frame in stack.split(";")]
        frames = [f for f in frames if f]
        if not any(f.startswith(LOOP_FRAME) for f in frames):
            continue  # another thread: the session renew, the executor
        total += count
        own[frames[-1]] += count
        for name in set(frames):
            anywhere[name] += count
    return own, anywhere, total


def _function(frame: str) -> str:
    """``name (path/to/module.py:123)`` -> ``name (module.py)``; thread lines dropped."""
    frame = frame.strip()
    if frame.startswith("process ") or frame.startswith("thread "):
        return ""
    name, _, where = frame.partition(" (")
    path = where.rstrip(")").rsplit(":", 1)[0]
    parts = Path(path).parts
    short = "/".join(parts[-2:]) if len(parts) >= 2 else path
    return f"{name} ({short})"


def profile(args: argparse.Namespace, work_dir: Path) -> dict[str, Any]:
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    raw_path = work_dir / "stacks.txt"
    with LocalServers(work_dir, feeds=args.feeds, feed_rate=0.0) as stack:
        deployment = stack.deployment("profile")
        [worker] = deployment.start_workers(
            ["prof"],
            {
                **ours(None).env,
                worker_settings.HANDLER: HANDLERS[args.handler_mode],
                **({worker_settings.EVENT_LOOP: args.event_loop} if args.event_loop else {}),
                **({worker_settings.JSON_DECODER: args.json_decoder} if args.json_decoder else {}),
            },
        )
        for index in range(args.connections):
            cid = f"prof-{index}"
            deployment.start_connection(cid, stack.feed_url(cid, {"rate": 0}, index=index))
        wait_until(
            lambda: len(worker.logged("upstream connected")) >= args.connections,
            30,
            "every connection to be open",
        )
        time.sleep(args.warmup)
        subprocess.run(
            [
                py_spy,
                "record",
                "--pid",
                str(worker.pid),
                "--duration",
                str(args.seconds),
                "--rate",
                str(args.rate),
                "--format",
                "raw",
                "--nonblocking",
                "--output",
                str(raw_path),
            ],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deployment.stop_workers()
    if args.raw_out is not None:
        shutil.copyfile(raw_path, args.raw_out)
    own, anywhere, total = parse_raw(raw_path.read_text())
    return {
        "benchmark": "hot_profile",
        "handler_mode": args.handler_mode,
        "connections": args.connections,
        "samples": total,
        "own": [[name, n, round(100 * n / total, 1)] for name, n in own.most_common(args.top)],
        "anywhere": [
            [name, n, round(100 * n / total, 1)]
            for name, n in [(k, v) for k, v in anywhere.most_common() if v < BASE_SHARE * total][
                : args.top
            ]
        ],
        "machine": machine(),
    }


def render(result: dict[str, Any]) -> str:
    return (
        "own samples (innermost frame)\n"
        + table(["function", "samples", "%"], result["own"])
        + "\n\nsamples anywhere on the stack\n"
        + table(["function", "samples", "%"], result["anywhere"])
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.hot_profile", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--connections", type=int, default=8)
    parser.add_argument("--feeds", type=int, default=2)
    parser.add_argument("--warmup", type=float, default=3.0)
    parser.add_argument("--seconds", type=int, default=15)
    parser.add_argument("--rate", type=int, default=200, help="py-spy samples per second")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--raw-out", type=Path, help="keep py-spy's raw stacks here")
    parser.add_argument("--handler-mode", choices=sorted(HANDLERS), default="single")
    parser.add_argument(
        "--event-loop", choices=accelerators.EVENT_LOOPS, help="default: the worker's"
    )
    parser.add_argument(
        "--json-decoder", choices=accelerators.JSON_DECODERS, help="default: the worker's"
    )
    args = parser.parse_args(argv)
    try:
        with sigterm_as_interrupt(), tempfile.TemporaryDirectory(prefix="hot-profile-") as tmp:
            result = profile(args, Path(tmp))
    except KeyboardInterrupt:
        print("interrupted; every child process has been stopped", file=sys.stderr)
        return 130
    emit(
        f"hot profile, one worker, {args.connections} connections at rate=0, "
        f"{args.handler_mode} handler, {result['samples']} samples",
        render(result),
        result,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
