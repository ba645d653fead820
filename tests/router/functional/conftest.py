"""The router over real HTTP (the local adapter) against DynamoDB Local and moto's
server (started once per test run by tests/conftest.py); a fresh table and queue per test."""

from __future__ import annotations

import pytest


@pytest.fixture
def api(router_api: str) -> str:
    """Base URL of the router over real HTTP."""
    return router_api
