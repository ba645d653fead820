"""``python -m local_stack --sink kinesis`` end to end: the workers write every message
into the stream in moto, the consumer applies each once through the deduper, and what
it applied is exactly what the workers checkpointed."""

from __future__ import annotations

import re
from collections import defaultdict

import pytest

from tests.integration.test_local_stack import DEMO_SEQ, run_local_stack
from tests.support.timing import scaled

APPLIED = re.compile(r"^applied connection_id=(\S+) seq_gen=(\d+) seq=(\d+) epoch=(\d+) ", re.M)


@pytest.mark.fleet
@pytest.mark.timeout(scaled(180))
def test_every_message_reaches_the_consumer_once(tmp_path):
    state_dir = tmp_path / "state"
    result = run_local_stack(
        [
            "--sink",
            "kinesis",
            "--base-port",
            "0",
            "--workers",
            "2",
            "--connections",
            "3",
            "--duration",
            "12",
            "--no-view",
            "--state-dir",
            str(state_dir),
        ],
        timeout=scaled(150),
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "starting moto (SQS, CloudWatch, Kinesis)" in result.stdout, output
    assert re.search(r"^sink: kinesis, every message into the stream ", result.stdout, re.M)
    assert re.search(
        r"^\[\d+s\] workers 2/2 alive .* \| sink consumer: tally applied=", result.stdout, re.M
    ), output

    final = next(line for line in result.stdout.splitlines() if line.startswith("after shutdown:"))
    checkpoints = {cid: int(seq) for cid, seq in DEMO_SEQ.findall(final)}
    assert set(checkpoints) == {"demo-1", "demo-2", "demo-3"}, final

    log = (state_dir / "logs" / "sink-consumer.log").read_text()
    applied: dict[str, list[int]] = defaultdict(list)
    for cid, seq_gen, seq, _ in APPLIED.findall(log):
        assert seq_gen == "0"
        applied[cid].append(int(seq))
    # Each message handled is in the stream once it is checkpointed: the consumer
    # applied exactly 1..the final checkpoint, once each, in order.
    assert {cid: seqs for cid, seqs in applied.items()} == {
        cid: list(range(1, last + 1)) for cid, last in checkpoints.items()
    }
    total = sum(checkpoints.values())
    summary = f"sink consumer: tally applied={total} skipped=0 malformed=0 "
    assert summary in result.stdout, output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--sink", "kinesis", "--handler", "worker.delivery:LogHandler"], "--sink sets"),
        (["--sink", "firehose"], "invalid choice: 'firehose'"),
    ],
)
def test_a_sink_with_a_handler_or_an_unknown_sink_is_refused(args, message, tmp_path):
    result = run_local_stack([*args, "--state-dir", str(tmp_path / "state")], timeout=scaled(60))
    assert result.returncode == 2
    assert message in result.stderr
    assert not (tmp_path / "state").exists()
