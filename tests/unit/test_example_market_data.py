"""examples/market_data's pure parts: the fake feed's subscription rules and trades, and
what the example handler logs and records."""

from __future__ import annotations

import json
import logging
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from examples.market_data.fake_feed import SubscribeError, parse_subscribe, trade
from examples.market_data.handler import TradeHandler
from local_stack.audit import load_records
from worker.delivery import Delivery

TOKEN = "tok-1"


def subscribe(**changes: Any) -> str:
    frame = {"op": "subscribe", "channel": "trades", "symbols": ["BTC-USD"], "token": TOKEN}
    frame.update(changes)
    return json.dumps({k: v for k, v in frame.items() if v is not None})


def test_a_subscription_names_its_symbols_and_where_it_starts():
    assert parse_subscribe(subscribe(from_sequence=21), TOKEN) == (["BTC-USD"], 21)
    assert parse_subscribe(subscribe(), TOKEN) == (["BTC-USD"], 1)


@pytest.mark.parametrize(
    ("frame", "reason"),
    [
        (subscribe(token="tok-2"), "invalid token"),
        (subscribe(token=None), "invalid token"),
        (subscribe(token=7), "invalid token"),
        (subscribe(channel="quotes"), "expected"),
        ("not json", "expected"),
        (subscribe(symbols=[]), "symbols"),
        (subscribe(from_sequence=0), "from_sequence"),
        (subscribe(from_sequence="21"), "from_sequence"),
        (subscribe(from_sequence=True), "from_sequence"),
    ],
)
def test_a_bad_subscription_is_refused_with_a_reason(frame: str, reason: str):
    with pytest.raises(SubscribeError, match=reason):
        parse_subscribe(frame, TOKEN)


def test_no_subscription_passes_without_a_token_configured():
    with pytest.raises(SubscribeError, match="invalid token"):
        parse_subscribe(subscribe(token=""), None)


def test_a_trade_is_the_same_every_time_and_near_its_symbols_price():
    symbols = ["BTC-USD", "ETH-USD"]
    trades = [trade("/v1/trades", n, symbols) for n in range(1, 200)]
    assert trades == [trade("/v1/trades", n, symbols) for n in range(1, 200)]
    assert trades != [trade("/v2/trades", n, symbols) for n in range(1, 200)]
    assert {t["symbol"] for t in trades} == set(symbols)
    for t in trades:
        base = Decimal(64_000 if t["symbol"] == "BTC-USD" else 3_200)
        assert abs(Decimal(t["price"]) / base - 1) <= Decimal("0.01")
        assert Decimal("0") < Decimal(t["size"]) <= Decimal("1")


async def test_the_handler_logs_each_trade_and_records_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    payload = {"symbol": "BTC-USD", "price": "64032.64", "size": "0.2435", "ts": 1}
    handler = TradeHandler(tmp_path / "records" / "trades.jsonl")
    with caplog.at_level(logging.INFO, logger="examples.market_data"):
        await handler.handle(Delivery("btc-eth", 2, 37, payload, "w-1"))
    assert caplog.messages == ["trade btc-eth 2 37 BTC-USD 64032.64"]
    (line,) = (tmp_path / "records" / "trades.jsonl").read_text().splitlines()
    assert json.loads(line)["payload"] == payload
    (record,) = load_records(tmp_path / "records")
    assert (record.worker, record.connection_id, record.epoch, record.seq) == (
        "w-1",
        "btc-eth",
        2,
        37,
    )
