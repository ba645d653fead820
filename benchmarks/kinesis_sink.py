"""Throughput of the Kinesis sink on one worker (moto), and what it means for real
Kinesis's write limits per shard.

``python -m benchmarks.kinesis_sink [--connections 8] [--rate 0] [--rounds 3]
[--window 10] [--shards 4]``

One worker with ``HANDLER=worker.sinks.kinesis:factory`` owns ``--connections``
connections of the demo feed, at ``--rate`` messages/s each (0: as fast as it reads),
and writes every message as an envelope into a stream of ``--shards`` shards in moto
(the local stack's Kinesis, serialised). Per round, the same measurement as
:mod:`benchmarks.throughput`'s worker: messages handled per second (the worker's
``messages_processed``: a batch counts once ``PutRecords`` took it), the worker's CPU,
and moto's CPU over the round. Then a sample of the stream's records gives the bytes
Kinesis bills per record (data and partition key).

The estimate for real Kinesis: a shard takes at most 1,000 records/s and 1 MiB/s of
writes, so a worker's rate R of records of B bytes needs ``max(R / 1000, R x B /
2^20)`` shards; a ``PutRecords`` request carries at most 500 records and 5 MiB. Moto
does the work of a stream in one Python process, so the figure measured here is a
floor for the sink, not its ceiling: the ceiling is the worker's own (see
BENCHMARKS.md, "Sinks").
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Final

from benchmarks.procfs import CpuSample
from benchmarks.report import emit, machine, table
from benchmarks.throughput import worker_round
from local_stack import services
from local_stack import sink as local_sink
from local_stack.fleet import CLIENT_CONFIG
from local_stack.server_group import LocalServers
from local_stack.stop_requests import sigterm_as_interrupt
from worker.sinks.batch_rules import KINESIS_LIMITS

SHARD_RECORDS_PER_S: Final = 1000
SHARD_BYTES_PER_S: Final = 1 << 20
"""Kinesis Data Streams' write limits per shard (provisioned or on-demand alike)."""
SAMPLE_RECORDS: Final = 500


def record_bytes(kinesis: Any, stream: str) -> float:
    """Mean billed size (data + partition key) of the first records of each shard."""
    sizes: list[int] = []
    for shard in kinesis.list_shards(StreamName=stream)["Shards"]:
        iterator = kinesis.get_shard_iterator(
            StreamName=stream, ShardId=shard["ShardId"], ShardIteratorType="TRIM_HORIZON"
        )["ShardIterator"]
        records = kinesis.get_records(ShardIterator=iterator, Limit=SAMPLE_RECORDS)["Records"]
        sizes += [len(r["Data"]) + len(r["PartitionKey"].encode()) for r in records]
    if not sizes:
        raise RuntimeError("the stream holds no record to measure")
    return statistics.mean(sizes)


def per_shard(rate: float, size: float) -> dict[str, Any]:
    """What ``rate`` records/s of ``size`` bytes need of real Kinesis."""
    by_records = rate / SHARD_RECORDS_PER_S
    by_bytes = rate * size / SHARD_BYTES_PER_S
    per_request = min(KINESIS_LIMITS.max_count, int(KINESIS_LIMITS.max_bytes // max(size, 1.0)))
    return {
        "shards_for_records": round(by_records, 2),
        "shards_for_bytes": round(by_bytes, 2),
        "shards_needed": math.ceil(max(by_records, by_bytes)),
        "limited_by": "records" if by_records >= by_bytes else "bytes",
        "records_per_shard_at_limit": round(min(SHARD_RECORDS_PER_S, SHARD_BYTES_PER_S / size)),
        "records_per_full_request": per_request,
    }


def run(args: argparse.Namespace, work_dir: Path) -> dict[str, Any]:
    rounds: list[dict[str, Any]] = []
    with LocalServers(work_dir, feeds=args.feeds, feed_rate=0.0, kinesis=True) as stack:
        kinesis = services.local_client("kinesis", stack.endpoints.kinesis, config=CLIENT_CONFIG)
        for round_no in range(1, args.rounds + 1):
            stream = f"sink-throughput-{round_no}-{int(time.time())}"
            local_sink.create_stream(kinesis, stream, shards=args.shards)
            moto_0, began = CpuSample.take(stack.moto_process.process.pid), time.monotonic()
            worker = worker_round(
                stack,
                round_no,
                args.connections,
                args.warmup,
                args.window,
                "batch",
                args.rate,
                extra_env=local_sink.worker_settings_for(stack.endpoints, stream),
            )
            moto_1 = CpuSample.take(stack.moto_process.process.pid)
            worker["moto_cpu_percent_over_round"] = round(moto_0.percent_until(moto_1), 1)
            worker["round_s"] = round(time.monotonic() - began, 1)
            worker["record_bytes"] = round(record_bytes(kinesis, stream), 1)
            print(f"  round {round_no} {worker}", flush=True)
            rounds.append(worker)
        kinesis.close()
    rate = statistics.median(r["messages_per_s"] for r in rounds)
    size = statistics.median(r["record_bytes"] for r in rounds)
    return {
        "benchmark": "kinesis_sink",
        "connections": args.connections,
        "rate_per_connection": args.rate,
        "shards": args.shards,
        "window_s": args.window,
        "rounds": rounds,
        "messages_per_s": rate,
        "messages_per_cpu_s": statistics.median(r["messages_per_cpu_s"] for r in rounds),
        "record_bytes": size,
        "real_kinesis": per_shard(rate, size),
        "machine": machine(),
    }


def render(result: dict[str, Any]) -> str:
    rows = [
        [
            number,
            r["messages_per_s"],
            r["reader_cpu_percent"],
            r["messages_per_cpu_s"],
            r["moto_cpu_percent_over_round"],
            r["machine_busy_percent"],
            r["record_bytes"],
        ]
        for number, r in enumerate(result["rounds"], 1)
    ]
    headers = [
        "round",
        "records/s",
        "worker CPU %",
        "records/CPU-s",
        "moto CPU % (round)",
        "machine busy %",
        "bytes/record",
    ]
    real = result["real_kinesis"]
    return "\n".join(
        [
            table(headers, rows),
            f"median {result['messages_per_s']} records/s into moto "
            f"({result['messages_per_cpu_s']} per worker CPU-second), "
            f"{result['record_bytes']} bytes per record",
            f"real Kinesis at that rate: {real['shards_for_records']} shards by records "
            f"(1,000/s each), {real['shards_for_bytes']} by bytes (1 MiB/s each): "
            f"{real['shards_needed']} shard(s), limited by {real['limited_by']}; a shard "
            f"takes {real['records_per_shard_at_limit']} such records/s; a full PutRecords "
            f"carries {real['records_per_full_request']}",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.kinesis_sink", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--connections", type=int, default=8)
    parser.add_argument("--rate", type=float, default=0.0, help="msg/s per connection; 0: max")
    parser.add_argument("--shards", type=int, default=local_sink.SHARDS)
    parser.add_argument("--warmup", type=float, default=3.0)
    parser.add_argument("--window", type=float, default=10.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--feeds", type=int, default=1)
    args = parser.parse_args(argv)
    try:
        with sigterm_as_interrupt(), tempfile.TemporaryDirectory(prefix="kinesis-sink-") as tmp:
            result = run(args, Path(tmp))
    except KeyboardInterrupt:
        print("interrupted; every child process has been stopped", file=sys.stderr)
        return 130
    print()
    emit("Kinesis sink, one worker", render(result), result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
