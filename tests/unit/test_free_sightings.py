"""The grace before a sweep may take a freed connection (worker/free_sightings.py)."""

from __future__ import annotations

import pytest

from worker.free_sightings import FreeSightings
from wsfleet import schema

pytestmark = pytest.mark.timeout(10)


def _ids_in(shard: str, count: int) -> list[str]:
    ids = [f"c{n}" for n in range(2000) if schema.free_shard(f"c{n}") == shard]
    return ids[:count]


SHARDS = schema.free_shards()
A, B = _ids_in(SHARDS[0], 2)
OTHER = _ids_in(SHARDS[1], 1)[0]


def test_nothing_is_ready_at_first_sight() -> None:
    sightings = FreeSightings(grace=1.2)
    assert sightings.scanned([SHARDS[0]], [A, B], now=10.0) == []


def test_an_id_is_ready_once_it_has_been_free_for_the_grace() -> None:
    sightings = FreeSightings(grace=1.0)
    sightings.scanned([SHARDS[0]], [A], now=10.0)
    assert sightings.scanned([SHARDS[0]], [A, B], now=10.5) == []
    assert sightings.scanned([SHARDS[0]], [A, B], now=11.0) == [A]
    assert sightings.scanned([SHARDS[0]], [A, B], now=11.5) == [A, B]


def test_an_id_not_found_in_its_scanned_shard_is_forgotten() -> None:
    sightings = FreeSightings(grace=1.0)
    sightings.scanned([SHARDS[0]], [A], now=0.0)
    sightings.scanned([SHARDS[0]], [], now=0.5)  # taken meanwhile
    assert len(sightings) == 0
    # Freed again later: it waits a full grace again.
    assert sightings.scanned([SHARDS[0]], [A], now=5.0) == []
    assert sightings.scanned([SHARDS[0]], [A], now=6.0) == [A]


def test_a_scan_of_other_shards_keeps_what_it_did_not_look_at() -> None:
    sightings = FreeSightings(grace=1.0)
    sightings.scanned([SHARDS[0]], [A], now=0.0)
    sightings.scanned([SHARDS[1]], [OTHER], now=0.5)
    assert len(sightings) == 2
    assert sightings.scanned([SHARDS[0], SHARDS[1]], [A, OTHER], now=1.0) == [A]


def test_no_grace_takes_at_first_sight() -> None:
    sightings = FreeSightings(grace=0.0)
    assert sightings.scanned([SHARDS[0]], [A, B], now=3.0) == [A, B]
