"""The example handler of examples/trade_store on its own: typed (mypy strict, its
directory the root, as on the workers' path), and fenced by epoch against DynamoDB
Local."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.examples.trade_table import create_trade_table
from worker.delivery import Delivery

HANDLER_DIR = Path(__file__).resolve().parents[2] / "examples" / "trade_store" / "handler"
TRADE = {"symbol": "ETH-USD", "price": "3208.45", "size": "1.5", "ts": 1767225600600}


@pytest.fixture
def sink_module(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    monkeypatch.syspath_prepend(str(HANDLER_DIR))
    import trade_store.sink

    yield trade_store.sink
    for name in [m for m in sys.modules if m.split(".")[0] in ("trade_store", "trade_model")]:
        del sys.modules[name]


def test_the_handler_directory_type_checks_strictly(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--config-file",
            "/dev/null",
            "--strict",
            "--cache-dir",
            str(tmp_path / "cache"),
            "-p",
            "trade_store",
            "-p",
            "trade_model",
        ],
        cwd=HANDLER_DIR,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_superseded_owner_never_overwrites_a_trade(ddb, sink_module: Any) -> None:
    table = "trades-fence"
    create_trade_table(ddb, table)
    try:
        store = sink_module.TradeStore(table, ddb)

        def batch(epoch: int, worker: str) -> list[Delivery]:
            return [Delivery("c-1", epoch, seq, TRADE, worker) for seq in (1, 2)]

        asyncio.run(store.handle_batch(batch(2, "new-owner")))
        asyncio.run(store.handle_batch(batch(1, "old-owner")))  # refused, not raised
        asyncio.run(store.handle_batch(batch(2, "new-owner-again")))  # redelivery: fine
        items = ddb.scan(TableName=table)["Items"]
        assert sorted((i["seq"]["N"], i["epoch"]["N"], i["worker"]["S"]) for i in items) == [
            ("1", "2", "new-owner-again"),
            ("2", "2", "new-owner-again"),
        ]
        assert {i["price"]["N"] for i in items} == {"3208.45"}
    finally:
        ddb.delete_table(TableName=table)


def test_a_payload_that_is_not_a_trade_fails_the_call(ddb, sink_module: Any) -> None:
    store = sink_module.TradeStore("unused", ddb)
    with pytest.raises(ValueError, match="validation error"):
        asyncio.run(store.handle_batch([Delivery("c-1", 1, 1, {"symbol": "X"}, "w")]))
