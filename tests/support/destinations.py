"""Reading back what the sinks wrote to moto's services, in the order a consumer reads
it."""

from __future__ import annotations

from typing import Any

from wsfleet.envelope import Envelope


def read_shard(kinesis: Any, stream: str) -> list[Envelope]:
    """Every record of the stream's first shard, in the shard's order."""
    shard = kinesis.list_shards(StreamName=stream)["Shards"][0]["ShardId"]
    iterator = kinesis.get_shard_iterator(
        StreamName=stream, ShardId=shard, ShardIteratorType="TRIM_HORIZON"
    )["ShardIterator"]
    got: list[Envelope] = []
    while True:
        answer = kinesis.get_records(ShardIterator=iterator, Limit=1000)
        got += [Envelope.from_bytes(r["Data"]) for r in answer["Records"]]
        if not answer["Records"]:
            return got
        iterator = answer["NextShardIterator"]


def drain_fifo(sqs: Any, url: str) -> list[Envelope]:
    """Every message of the queue, in the order received (deleted as received), until
    a receive finds none."""
    got: list[Envelope] = []
    while True:
        answer = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=0)
        messages = answer.get("Messages", [])
        if not messages:
            return got
        for message in messages:
            got.append(Envelope.from_bytes(message["Body"].encode()))
            sqs.delete_message(QueueUrl=url, ReceiptHandle=message["ReceiptHandle"])
