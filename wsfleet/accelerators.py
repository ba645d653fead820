"""The worker's optional accelerators, uvloop (``EVENT_LOOP``) and orjson
(``JSON_DECODER``): their names and defaults, here so that the settings module (which
the CDK app loads by its path) reads them without importing the worker."""

from __future__ import annotations

import importlib.util
from typing import Final

ASYNCIO: Final = "asyncio"
UVLOOP: Final = "uvloop"
EVENT_LOOPS: Final = (ASYNCIO, UVLOOP)
JSON: Final = "json"
ORJSON: Final = "orjson"
JSON_DECODERS: Final = (JSON, ORJSON)
BUILT_IN: Final = frozenset({ASYNCIO, JSON})


def installed(name: str) -> bool:
    """Whether ``name`` can be used here (the standard library's always can)."""
    return name in BUILT_IN or importlib.util.find_spec(name) is not None


def default_event_loop() -> str:
    """uvloop where it is installed (the worker image on Linux x86_64 and arm64)."""
    return UVLOOP if installed(UVLOOP) else ASYNCIO


def default_json_decoder() -> str:
    """orjson where it is installed."""
    return ORJSON if installed(ORJSON) else JSON
