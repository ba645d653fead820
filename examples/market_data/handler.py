"""An example handler for the market-data feed: one log line per trade.

``HANDLER=examples.market_data.handler:factory`` on the workers. With the protocol of
README.md (``json-field``, ``"payload": "/data"``) each delivery's ``payload`` is the
``data`` object of one trade message::

    Delivery(connection_id="btc-eth", epoch=1, seq=42, worker_id="local-worker-2",
             payload={"symbol": "BTC-USD", "price": "64211.37", "size": "0.4182",
                      "ts": 1767225604100},
             seq_gen=0)

and the handler logs ``trade <connection_id> <epoch> <seq> <symbol> <price>`` (a JSON
log line of the worker, with these fields on their own as well).

With ``MARKET_DATA_RECORD_FILE=PATH`` it also appends one JSON line per delivery to
PATH: ``worker, connection_id, epoch, seq, t`` (epoch seconds when ``handle`` was
entered, the moment a message counts as delivered) and the ``payload``, the record
format :mod:`local_stack.audit` checks. Each line is one ``write(2)`` to a file opened
for appending, so several workers may share the file, and a worker killed mid-stream
leaves no torn line.

A real sink writes somewhere that outlives the worker, and is idempotent: it keeps
the highest ``epoch`` it has seen per connection and refuses lower ones (a superseded
owner), and de-duplicates on ``(connection_id, seq_gen, seq)`` (after a crash, up
to a checkpoint interval of trades is delivered again).
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Final

from worker.delivery import Delivery

RECORD_FILE_ENV: Final = "MARKET_DATA_RECORD_FILE"

log = logging.getLogger("examples.market_data")


class TradeHandler:
    def __init__(self, record_file: Path | None = None) -> None:
        self._record_fd: int | None = None
        if record_file is not None:
            record_file.parent.mkdir(parents=True, exist_ok=True)
            self._record_fd = os.open(record_file, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    async def handle(self, delivery: Delivery) -> None:
        trade = delivery.payload if isinstance(delivery.payload, dict) else {}
        symbol, price = trade.get("symbol", "?"), trade.get("price", "?")
        log.info(
            "trade %s %d %d %s %s",
            delivery.connection_id,
            delivery.epoch,
            delivery.seq,
            symbol,
            price,
            extra={
                "connection_id": delivery.connection_id,
                "epoch": delivery.epoch,
                "seq": delivery.seq,
                "symbol": symbol,
                "price": price,
            },
        )
        if self._record_fd is not None:
            record = {
                "worker": delivery.worker_id,
                "connection_id": delivery.connection_id,
                "epoch": delivery.epoch,
                "seq": delivery.seq,
                "t": time.time(),
                "payload": delivery.payload,
            }
            os.write(self._record_fd, (json.dumps(record, separators=(",", ":")) + "\n").encode())


def factory() -> TradeHandler:
    """``HANDLER=examples.market_data.handler:factory``."""
    path = os.environ.get(RECORD_FILE_ENV, "").strip()
    return TradeHandler(Path(path) if path else None)
