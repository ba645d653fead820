"""How the built-in upstream protocols decode JSON frames (``JSON_DECODER``).

``orjson`` (the default where it is installed) parses several times faster than the
standard library's ``json``. It is used so that a handler receives what ``json.loads``
would have given it: whatever orjson refuses and the standard library accepts
(``NaN`` and ``Infinity``, numbers that overflow a float, lone surrogates, UTF-16 or
UTF-32 bytes, nesting deeper than 1,024) is decoded again by ``json.loads``. One
difference is left, because finding it would cost what orjson saves: an integer
outside -2**63 .. 2**64-1 decodes to a ``float`` under orjson, to an ``int`` under
``json`` (``JSON_DECODER=json`` keeps it exact).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from wsfleet import accelerators
from wsfleet.accelerators import JSON, ORJSON

Loads = Callable[[str | bytes], Any]


def decoder(name: str) -> Loads:
    """The ``loads`` of ``name``; raises ValueError for an unknown or missing one."""
    if name == JSON:
        return json.loads
    if name != ORJSON:
        raise ValueError(
            f"unknown JSON decoder {name!r}: one of {', '.join(accelerators.JSON_DECODERS)}"
        )
    if not accelerators.installed(ORJSON):
        raise ValueError("orjson is not installed")
    import orjson

    fast, refused, slow = orjson.loads, orjson.JSONDecodeError, json.loads

    def loads(data: str | bytes) -> Any:
        try:
            return fast(data)
        except refused:
            return slow(data)

    return loads


loads: Loads = decoder(accelerators.default_json_decoder())
"""The process's decoder: the default until :func:`use` chose another."""


def use(name: str) -> None:
    """Decode with ``name`` from now on (the worker calls this once, at start)."""
    global loads
    loads = decoder(name)
