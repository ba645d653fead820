"""The bounded inflater of compressed upstream frames."""

from __future__ import annotations

import gzip
import zlib

import pytest

from worker.inflating import Inflater, Refused

TEXT = b'{"seq": 7, "price": 101.5}'


def deflate_raw(data: bytes) -> bytes:
    packer = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    return packer.compress(data) + packer.flush()


@pytest.mark.parametrize(
    ("mode", "packed"),
    [
        ("gzip", gzip.compress(TEXT)),
        ("zlib", zlib.compress(TEXT)),
        ("deflate", deflate_raw(TEXT)),
        ("auto", gzip.compress(TEXT)),
        ("auto", zlib.compress(TEXT)),
    ],
)
def test_each_format_inflates(mode, packed):
    assert Inflater(mode, 1 << 20)(packed) == TEXT


def test_auto_passes_a_frame_that_is_not_compressed_as_it_came():
    assert Inflater("auto", 1 << 20)(TEXT) == TEXT


@pytest.mark.parametrize("mode", ["gzip", "zlib", "deflate"])
def test_what_is_not_of_the_format_is_refused(mode):
    assert Inflater(mode, 1 << 20)(b"\x1f\x8b garbage") == Refused(f"not {mode} data")


def test_a_truncated_frame_is_refused():
    packed = gzip.compress(TEXT)
    assert Inflater("gzip", 1 << 20)(packed[:-12]) == Refused("truncated gzip data")


def test_a_bomb_is_refused_after_one_byte_past_the_limit():
    bomb = gzip.compress(b"\0" * (64 << 20))  # 64 MiB in about 64 KiB
    assert Inflater("gzip", 1 << 20)(bomb) == Refused(f"inflates past {1 << 20} bytes (refused)")


def test_exactly_the_limit_inflates():
    assert Inflater("zlib", 100)(zlib.compress(b"a" * 100)) == b"a" * 100
    assert isinstance(Inflater("zlib", 99)(zlib.compress(b"a" * 100)), Refused)


def test_an_unknown_mode_is_a_programming_error():
    with pytest.raises(ValueError, match="unknown inflate mode"):
        Inflater("brotli", 1)
