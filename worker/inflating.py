"""Compressed application payloads: a protocol option (``"inflate"``) for upstreams that
send each message as a gzip, zlib or raw-deflate binary frame.

Inflating is bounded: a frame that inflates past the connection's message limit
(``MAX_MESSAGE_BYTES``, the limit a frame already has on the wire) is refused as
unreadable, after inflating one byte more than the limit and no further, so a
decompression bomb costs only that frame and a bounded amount of work. Text frames
pass as they are: a compressed payload is binary.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Final

from wsfleet.protocol_specs import INFLATE_MODES

GZIP_MAGIC: Final = b"\x1f\x8b"
WBITS: Final = {"gzip": 16 + zlib.MAX_WBITS, "zlib": zlib.MAX_WBITS, "deflate": -zlib.MAX_WBITS}
"""zlib's window bits for each format (``auto``: gzip or zlib by their header)."""


def _is_zlib(data: bytes) -> bool:
    # RFC 1950: deflate method, and the first two bytes a multiple of 31.
    return len(data) >= 2 and data[0] & 0x0F == 8 and (data[0] << 8 | data[1]) % 31 == 0


@dataclass(frozen=True, slots=True)
class Refused:
    """Why a frame does not inflate."""

    reason: str


class Inflater:
    """Inflates one frame at a time (a new decompressor each: frames are independent)."""

    def __init__(self, mode: str, limit: int) -> None:
        if mode not in INFLATE_MODES:
            raise ValueError(f"unknown inflate mode {mode!r}")
        self._mode = mode
        self._limit = limit

    def __call__(self, data: bytes) -> bytes | Refused:
        """The inflated payload, or why the frame is refused."""
        mode = self._mode
        if mode == "auto":
            if data.startswith(GZIP_MAGIC):
                mode = "gzip"
            elif _is_zlib(data):
                mode = "zlib"
            else:
                return data  # not compressed: as it came
        inflate = zlib.decompressobj(WBITS[mode])
        try:
            out = inflate.decompress(data, self._limit + 1)
        except zlib.error:
            return Refused(f"not {mode} data")
        if len(out) > self._limit:
            return Refused(f"inflates past {self._limit} bytes (refused)")
        if not inflate.eof:
            return Refused(f"truncated {mode} data")
        return out
