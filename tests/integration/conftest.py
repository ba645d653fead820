"""Fixtures shared by the store tests against DynamoDB Local."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from tests.support.stores import STORE_TIMING
from wsfleet.desired_state import DesiredStateStore
from wsfleet.item import from_attributes
from wsfleet.item_io import item_key
from wsfleet.lease_store import LeaseStore


@pytest.fixture
def store(ddb, table) -> LeaseStore:
    return LeaseStore(ddb, table, STORE_TIMING)


@pytest.fixture
def control(ddb, table) -> DesiredStateStore:
    """The router's writes."""
    return DesiredStateStore(ddb, table)


@pytest.fixture
def raw(ddb, table) -> Callable[[str], dict[str, Any]]:
    """Every attribute of a connection item as stored, index keys included."""

    def read_raw(connection_id: str) -> dict[str, Any]:
        got = ddb.get_item(TableName=table, Key=item_key(connection_id), ConsistentRead=True)
        return from_attributes(got["Item"])

    return read_raw
