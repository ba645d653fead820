"""Typed requests and views of the router (HTTP API bodies and EventBridge details)."""

from __future__ import annotations

import json
import math
from decimal import Decimal
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from wsfleet.schema import CONNECTION_ID_PATTERN

MAX_METADATA_BYTES = 4096

ConnectionId = Annotated[str, Field(pattern=CONNECTION_ID_PATTERN, min_length=1, max_length=128)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


def _check_metadata(value: dict[str, Any] | None) -> dict[str, Any] | None:
    if value is None:
        return None
    encoded = json.dumps(value, separators=(",", ":"), allow_nan=False)
    if len(encoded.encode()) > MAX_METADATA_BYTES:
        raise ValueError(f"metadata is larger than {MAX_METADATA_BYTES} bytes of JSON")
    return value


class StartRequest(_Strict):
    """``POST /connections`` body; ``connection_id`` is generated when absent."""

    connection_id: ConnectionId | None = None
    ws_url: Annotated[str, Field(min_length=1, max_length=2048)]
    metadata: dict[str, Any] | None = None

    _metadata = field_validator("metadata")(_check_metadata)


class StartDetail(_Strict):
    """EventBridge ``Start Connection`` detail (the id is required: events are retried)."""

    connection_id: ConnectionId
    ws_url: Annotated[str, Field(min_length=1, max_length=2048)]
    metadata: dict[str, Any] | None = None

    _metadata = field_validator("metadata")(_check_metadata)


class StopDetail(_Strict):
    """EventBridge ``Stop Connection`` detail."""

    connection_id: ConnectionId


def to_dynamodb_value(value: Any) -> Any:
    """JSON metadata as DynamoDB can store it: floats become Decimals."""
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError("metadata numbers must be finite")
        return Decimal(repr(value))
    if isinstance(value, dict):
        return {k: to_dynamodb_value(v) for k, v in value.items()}
    if isinstance(value, list):
        return [to_dynamodb_value(v) for v in value]
    return value
