"""The slow-sink benchmark's handler and arithmetic, without a stack: the token bucket
serves calls in order at its rate, the records read back as written (a line being
written left out), and lag, losses and duplicates are counted as documented."""

from __future__ import annotations

import asyncio
import base64
from pathlib import Path

import pytest

from benchmarks import slow_sink
from benchmarks.throttled_sink import ThrottledSink, TokenBucket, read_records
from worker.delivery import make_delivery
from wsfleet.envelope import Envelope


async def test_the_bucket_serves_calls_in_order_at_its_rate():
    bucket = TokenBucket(1000.0)
    loop = asyncio.get_running_loop()
    began = loop.time()
    done: list[tuple[str, float]] = []

    async def take(name: str, tokens: int) -> None:
        await bucket.take(tokens)
        done.append((name, loop.time() - began))

    await asyncio.gather(take("a", 100), take("b", 50), take("c", 100))
    assert [name for name, _ in done] == ["a", "b", "c"]
    assert [at for _, at in done] == pytest.approx([0.1, 0.15, 0.25], abs=0.04)


def test_a_bucket_needs_a_rate():
    with pytest.raises(ValueError, match="rate must be > 0"):
        TokenBucket(0)


def test_batches_are_recorded_once_their_tokens_are_earned(tmp_path: Path):
    sink = ThrottledSink(10_000.0, tmp_path)

    def batch(cid: str, seqs: list[int]) -> list[object]:
        return [make_delivery(cid, 3, seq, {"seq": seq}, "w", 1) for seq in seqs]

    async def handle() -> None:
        await sink.handle_batch(batch("c-1", [1, 2, 3]))  # type: ignore[arg-type]
        await sink.handle_batch(batch("c-2", [7, 9]))  # type: ignore[arg-type]

    asyncio.run(handle())
    sink.close()
    (path,) = tmp_path.glob("handled-*.txt")
    with path.open("a") as out:
        out.write("c-1 3 4-1")  # a line being written: not read yet
    records = list(read_records(tmp_path))
    assert [(r.connection_id, r.epoch, list(r.seqs)) for r in records] == [
        ("c-1", 3, [1, 2, 3]),
        ("c-2", 3, [7, 9]),
    ]


def test_lag_losses_and_duplicates():
    handled = {"a": [1, 2, 3, 5], "b": [1, 2, 2, 3], "c": [1, 2, 3]}
    assert slow_sink.losses(handled) == (1, 1, ["a"])
    [row] = slow_sink.lags({"c": 100.0}, handled, 110.0, 20.0)
    # 201 is due 10 s after the connect; 4 (the next to handle) was due 0.15 s after it.
    assert row == {
        "connection_id": "c",
        "latest_seq": 201,
        "handled_seq": 3,
        "lag_messages": 198,
        "lag_seconds": 9.85,
    }


def kinesis_item(envelope: Envelope) -> dict[str, str]:
    return {"Data": base64.b64encode(envelope.to_bytes()).decode(), "PartitionKey": "k"}


def test_what_the_endpoint_took_is_read_back_per_connection_in_order() -> None:
    landed = slow_sink.LandedRecords()
    items = [kinesis_item(Envelope("c-1", 2, 0, seq, 0, {"seq": seq})) for seq in (1, 2, 3)]
    landed("kinesis", "slow-sink", items[:2])
    landed("kinesis", "slow-sink", [{"Data": base64.b64encode(b"no").decode()}, items[2]])
    landed("kinesis", "slow-sink", [kinesis_item(Envelope("c-2", 1, 0, 1, 0, None)), items[1]])
    assert landed.seqs() == {"c-1": [1, 2, 3, 2], "c-2": [1]}
    assert (landed.count(), landed.not_envelopes) == (5, 1)
    # A copy the sink sent again is a duplicate, not a loss.
    assert slow_sink.losses(landed.seqs()) == (0, 1, [])


def test_the_handler_settings_name_the_sink_and_where_it_writes(tmp_path: Path) -> None:
    throttled = slow_sink.sink_settings(50.0, tmp_path, None)
    assert throttled["HANDLER"] == slow_sink.HANDLER
    assert throttled["THROTTLE_MESSAGES_PER_SECOND"] == "50.0"

    class Endpoint:
        endpoint = "http://127.0.0.1:9"

    kinesis = slow_sink.sink_settings(50.0, tmp_path, Endpoint())  # type: ignore[arg-type]
    assert kinesis == {
        "HANDLER": "worker.sinks.kinesis:factory",
        "SINK_STREAM_NAME": slow_sink.STREAM,
        "AWS_ENDPOINT_URL_KINESIS": "http://127.0.0.1:9",
    }
    assert slow_sink.endpoint_lines(None) == []
    [line] = slow_sink.endpoint_lines({"taken": 10, "records": 25, "requests": 4, "throttled": 15})
    assert "throttled 15" in line


@pytest.mark.parametrize(
    "argv",
    [["--message-bytes", "-5"], ["--trace-memory"], ["--handler", "kafka"]],
)
def test_bad_options_are_refused(argv: list[str]) -> None:
    with pytest.raises(SystemExit):
        slow_sink.main(argv)
