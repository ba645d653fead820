"""A small library of the handler's own: what a trade of the market-data feed is
(examples/market_data/README.md), checked with pydantic."""

from __future__ import annotations

from decimal import Decimal

from pydantic import BaseModel, ConfigDict, Field


class Trade(BaseModel):
    """``{"symbol": "BTC-USD", "price": "64211.37", "size": "0.4182", "ts": 1767...}``:
    prices and sizes arrive as decimal text and stay exact."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    symbol: str = Field(min_length=1, max_length=32)
    price: Decimal = Field(gt=0)
    size: Decimal = Field(gt=0)
    ts: int = Field(ge=0, description="trade time, epoch milliseconds")
