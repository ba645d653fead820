"""The sink end-to-end run: its audit of the consumer's effect log (pure), and its
short form, real workers writing to moto's Kinesis through SIGKILLs and SIGTERMs, a
consumer taking each message once: nothing lost, nothing applied twice, nothing out of
order."""

from __future__ import annotations

import pytest

from benchmarks.sink_e2e import Effect, audit, audit_connection
from tests.benchmarks.test_chaos_short import summary_of
from tests.support.processes import run_module
from tests.support.timing import scaled


def effects(cid: str, *seqs: int, seq_gen: int = 0) -> list[Effect]:
    return [Effect(cid, seq_gen, seq, epoch=1, lag_ms=0) for seq in seqs]


def test_a_clean_log_has_nothing_to_report() -> None:
    found = audit_connection("a", effects("a", 1, 2, 3, 4), sent_through=4)
    assert (found.applied, found.lost, found.applied_twice, found.out_of_order) == (4, 0, 0, 0)
    assert (found.beyond, found.seq_gens) == (0, 1)


def test_lost_twice_out_of_order_and_never_sent_are_counted_apart() -> None:
    # 2 never comes, 3 twice, 5 after 6 (out of order, once), 9 was never sent.
    log = effects("a", 1, 3, 4, 6, 5, 3, 7, 9)
    found = audit_connection("a", log, sent_through=8)
    assert found.lost == 2  # 2 and 8
    assert found.applied_twice == 1
    assert found.out_of_order == 1  # a copy of 3 is counted as twice, not again here
    assert found.beyond == 1
    assert found.applied == 7


def test_seq_gens_order_apart_and_every_connection_is_audited() -> None:
    log = [*effects("a", 5, 6, seq_gen=1), *effects("a", 1, seq_gen=2), *effects("b", 1)]
    found = audit(log, {"a": 6, "b": 2, "c": 1})
    assert found["a"].out_of_order == 0
    assert found["a"].seq_gens == 2
    assert (found["b"].lost, found["c"].lost, found["c"].applied) == (1, 1, 0)


SHORT_RUN = ["--minutes", "1.5", "--workers", "3", "--connections", "30", "--fault-every", "20"]


@pytest.mark.fleet
@pytest.mark.timeout(scaled(360))
def test_short_run_loses_nothing_and_applies_each_message_once_in_order() -> None:
    result = run_module("benchmarks.sink_e2e", SHORT_RUN, scaled(330))
    output = f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    assert result.returncode == 0, output
    summary = summary_of(result.stdout)
    assert summary["violations"] == [], output
    assert summary["lost"] == 0
    assert summary["applied_twice"] == 0
    # moto never refuses a record, so no seq is written after a higher one.
    assert summary["out_of_order"] == 0
    assert summary["late"] == 0
    assert summary["unfinished"] == 0
    assert summary["leases_held_after_shutdown"] == 0
    assert summary["messages_sent"] == 30 * 180
    assert summary["applied"] == summary["messages_sent"]
    # The run did what it says: workers killed and stopped, copies in the stream.
    assert summary["faults"].get("sigkill", 0) >= 3, summary["faults"]
    assert summary["faults"].get("sigterm", 0) >= 3, summary["faults"]
    assert summary["skipped_copies"] > 0
