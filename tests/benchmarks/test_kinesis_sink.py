"""The Kinesis sink benchmark's arithmetic for real Kinesis's per-shard write limits."""

from __future__ import annotations

from benchmarks.kinesis_sink import per_shard


def test_small_records_are_limited_by_the_record_count() -> None:
    figures = per_shard(rate=3000.0, size=200.0)
    assert figures["shards_for_records"] == 3.0
    assert figures["shards_for_bytes"] == round(3000 * 200 / 2**20, 2)
    assert figures["shards_needed"] == 3
    assert figures["limited_by"] == "records"
    assert figures["records_per_shard_at_limit"] == 1000
    assert figures["records_per_full_request"] == 500


def test_large_records_are_limited_by_the_bytes() -> None:
    # 4 KiB records: a shard takes 256 of them per second, a request 1,280 by size
    # but 500 by count.
    figures = per_shard(rate=1000.0, size=4096.0)
    assert figures["limited_by"] == "bytes"
    assert figures["shards_needed"] == 4
    assert figures["records_per_shard_at_limit"] == 256
    assert figures["records_per_full_request"] == 500
    # 20 KiB records: 5 MiB per request holds 256.
    assert per_shard(rate=10.0, size=20480.0)["records_per_full_request"] == 256
