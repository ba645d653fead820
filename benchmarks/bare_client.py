"""A bare ``websockets`` client: the baseline of the throughput benchmark.

``python -m benchmarks.bare_client [--fast] --warmup 3 --window 10 URL [URL ...]``

Reads every URL concurrently, as the worker does (one connection each, JSON decode of
every message, seq order check), with nothing else: no lease, no checkpoint, no
handler. As a user would write it: asyncio's event loop and ``json.loads``; with
``--fast``, on uvloop with ``orjson.loads``, the worker's defaults, so that what the
worker's own machinery costs shows apart from what the libraries save.

Prints ``window start`` when the counting window opens, ``window end`` when it
closes, then one JSON line ``{"messages": N, "seconds": S, "cpu_seconds": C}`` (C is this
process's CPU time within the window).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import Callable
from typing import Any

from websockets.asyncio.client import connect


class Counter:
    def __init__(self) -> None:
        self.messages = 0
        self.out_of_order = 0


async def read(url: str, counter: Counter, loads: Callable[[str | bytes], Any]) -> None:
    """Read ``url`` until cancelled, counting messages."""
    expected = 1
    # The same keepalive as a worker (ping every 5 s), so only the work differs.
    async with connect(url, max_size=1 << 20, ping_interval=5.0, ping_timeout=5.0) as ws:
        async for data in ws:
            message = loads(data)
            if message["seq"] != expected:
                counter.out_of_order += 1
            expected = message["seq"] + 1
            counter.messages += 1


async def measure(
    urls: list[str], warmup: float, window: float, loads: Callable[[str | bytes], Any]
) -> dict[str, float | int]:
    counter = Counter()
    readers = [asyncio.create_task(read(url, counter, loads)) for url in urls]
    try:
        await asyncio.sleep(warmup)
        failed = [task for task in readers if task.done()]
        if failed:
            failed[0].result()  # raise what ended it
        print("window start", flush=True)
        start_messages, start_at, start_cpu = (
            counter.messages,
            time.monotonic(),
            time.process_time(),
        )
        await asyncio.sleep(window)
        messages = counter.messages - start_messages
        seconds = time.monotonic() - start_at
        cpu = time.process_time() - start_cpu
        print("window end", flush=True)
    finally:
        for task in readers:
            task.cancel()
        await asyncio.gather(*readers, return_exceptions=True)
    return {
        "messages": messages,
        "seconds": round(seconds, 3),
        "cpu_seconds": round(cpu, 3),
        "out_of_order": counter.out_of_order,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.bare_client", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--warmup", type=float, default=3.0)
    parser.add_argument("--window", type=float, default=10.0)
    parser.add_argument("--fast", action="store_true", help="uvloop and orjson")
    parser.add_argument("urls", nargs="+")
    args = parser.parse_args(argv)
    if args.fast:
        import orjson
        import uvloop

        result = uvloop.run(measure(args.urls, args.warmup, args.window, orjson.loads))
    else:
        result = asyncio.run(measure(args.urls, args.warmup, args.window, json.loads))
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
