"""A fake of a subscribe-style market-data WebSocket API, shaped like the big exchanges'
trade feeds, for the walkthrough in README.md and its test.

    python -m examples.market_data.fake_feed --port 9100 --api-key-file KEY_FILE \\
        --token-file TOKEN_FILE [--rate 10] [--host 127.0.0.1]

It prints ``fake market feed listening on ws://HOST:PORT`` once listening and serves
until SIGTERM or SIGINT, then exits 0.

- The handshake must carry the header ``X-API-Key`` with the content of
  ``--api-key-file`` (read at every handshake: rewriting the file rotates the key);
  otherwise it is answered with HTTP 401.
- Within 10 s the client sends one frame::

      {"op": "subscribe", "channel": "trades", "symbols": ["BTC-USD", "ETH-USD"],
       "token": "<the content of --token-file>", "from_sequence": 1}

  A wrong or missing token, or any other frame, closes the connection with 1008.
  ``from_sequence`` (an integer >= 1, default 1) is where the stream starts.
- Then one trade every ``1 / rate`` seconds::

      {"type": "trade", "channel": "trades", "sequence": 7,
       "data": {"symbol": "BTC-USD", "price": "64211.37", "size": "0.4182",
                "ts": 1767225600600}}

  ``sequence`` counts per URL path (``ws://HOST:PORT/<path>``). Trade n of a path is
  the same on every connection subscribed to the same symbols: its symbol, price and
  size follow from the path and n, its ``ts`` from n and the time the path was first
  subscribed to (trade n is ``(n - 1) / rate`` seconds after trade 1). A client that
  resumes with ``from_sequence`` gets exactly the trades it missed.

Neither the key nor the token is ever logged.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import logging
import signal
import zlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from websockets.asyncio.server import ServerConnection, serve
from websockets.exceptions import ConnectionClosed
from websockets.frames import CloseCode
from websockets.http11 import Request, Response

from local_stack.clock import now_ms
from local_stack.feed import key_matches, key_source

logger = logging.getLogger("examples.market_data.fake_feed")

KEY_HEADER = "X-API-Key"
SUBSCRIBE_TIMEOUT_S = 10.0
#: Where each symbol trades, give or take 1%; any other symbol trades around 100.
BASE_PRICES = {"BTC-USD": 64_000.0, "ETH-USD": 3_200.0, "SOL-USD": 150.0}


class SubscribeError(ValueError):
    """The client's first frame is not a valid subscription; the text says why."""


def trade(path: str, sequence: int, symbols: Sequence[str]) -> dict[str, str]:
    """Symbol, price and size of trade ``sequence`` of ``path``: the same every time."""
    digest = zlib.crc32(f"{path}\n{sequence}".encode())
    symbol = symbols[digest % len(symbols)]
    price = BASE_PRICES.get(symbol, 100.0) * (1 + ((digest >> 4) % 20_001 - 10_000) / 1e6)
    size = ((digest >> 12) % 9_999 + 1) / 10_000
    return {"symbol": symbol, "price": f"{price:.2f}", "size": f"{size:.4f}"}


def parse_subscribe(frame: str | bytes, token: str | None) -> tuple[list[str], int]:
    """The symbols and the first sequence a subscribe frame asks for."""
    try:
        sub = json.loads(frame)
    except ValueError:
        sub = None
    if not isinstance(sub, dict) or (sub.get("op"), sub.get("channel")) != ("subscribe", "trades"):
        raise SubscribeError('expected {"op": "subscribe", "channel": "trades", ...}')
    given = sub.get("token")
    if not isinstance(given, str) or not key_matches(given, token):
        raise SubscribeError("invalid token")
    symbols = sub.get("symbols")
    if not isinstance(symbols, list) or not symbols or not all(isinstance(s, str) for s in symbols):
        raise SubscribeError("symbols must be a non-empty list of strings")
    start = sub.get("from_sequence", 1)
    if not isinstance(start, int) or isinstance(start, bool) or start < 1:
        raise SubscribeError("from_sequence must be an integer >= 1")
    return symbols, start


class FakeMarketFeed:
    def __init__(
        self, rate: float, api_key: Callable[[], str | None], token: Callable[[], str | None]
    ) -> None:
        self.rate = rate
        self._api_key = api_key
        self._token = token
        self._first_ts: dict[str, int] = {}
        """Per path, the ``ts`` of trade 1."""

    def message(self, path: str, sequence: int, symbols: Sequence[str]) -> dict[str, Any]:
        if path not in self._first_ts:  # the first subscription: its first trade is now
            self._first_ts[path] = now_ms() - round((sequence - 1) * 1000 / self.rate)
        ts = self._first_ts[path] + round((sequence - 1) * 1000 / self.rate)
        data = {**trade(path, sequence, symbols), "ts": ts}
        return {"type": "trade", "channel": "trades", "sequence": sequence, "data": data}

    def check_key(self, connection: ServerConnection, request: Request) -> Response | None:
        """The handshake goes on only with the right key."""
        if key_matches(request.headers.get(KEY_HEADER), self._api_key()):
            return None
        logger.info("%s: HTTP 401, no valid %s", urlsplit(request.path).path, KEY_HEADER)
        return connection.respond(401, f"{KEY_HEADER} missing or wrong\n")

    async def serve_one(self, ws: ServerConnection) -> None:
        assert ws.request is not None
        path = urlsplit(ws.request.path).path
        with contextlib.suppress(ConnectionClosed):  # the client left: nothing to do
            try:
                frame = await asyncio.wait_for(ws.recv(), SUBSCRIBE_TIMEOUT_S)
                symbols, start = parse_subscribe(frame, self._token())
            except (TimeoutError, SubscribeError) as error:
                reason = str(error) or "subscribe expected"
                logger.info("%s: closed with 1008: %s", path, reason)
                await ws.close(CloseCode.POLICY_VIOLATION, reason)
                return
            logger.info("%s: subscribed to %s from sequence %d", path, symbols, start)
            began = asyncio.get_running_loop().time()
            for sent, sequence in enumerate(itertools.count(start)):
                due = began + sent / self.rate - asyncio.get_running_loop().time()
                await asyncio.sleep(max(0.0, due))
                await ws.send(json.dumps(self.message(path, sequence, symbols)))


async def run(host: str, port: int, feed: FakeMarketFeed) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with serve(feed.serve_one, host, port, process_request=feed.check_key) as server:
        bound = server.sockets[0].getsockname()[1]
        print(f"fake market feed listening on ws://{host}:{bound}", flush=True)
        await stop.wait()
        logger.info("stopping")


def _rate(raw: str) -> float:
    rate = float(raw)
    if not 0 < rate < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a number > 0, got {raw!r}")
    return rate


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="A fake market-data feed (trades).")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=9100)
    parser.add_argument("--rate", type=_rate, default=10.0, help="trades/s per connection")
    parser.add_argument("--api-key-file", type=Path, required=True, help=f"the {KEY_HEADER}")
    parser.add_argument("--token-file", type=Path, required=True, help="the subscribe token")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    feed = FakeMarketFeed(
        args.rate, key_source(key_file=args.api_key_file), key_source(key_file=args.token_file)
    )
    asyncio.run(run(args.host, args.port, feed))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
