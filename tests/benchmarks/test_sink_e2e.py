"""The sink end-to-end run: its audit of the consumers' effect logs, its options and the
handler that runs the three sinks side by side (pure), and its short form: real workers
writing through the Kinesis, SQS FIFO and Firehose sinks into moto, behind the fault
endpoint, through SIGKILLs and SIGTERMs, a consumer per sink taking each message once:
nothing lost, nothing applied twice, out of order only after an older owner's."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from benchmarks.sink_consumers import Superseded
from benchmarks.sink_e2e import (
    THROTTLE_SHARE,
    Effect,
    audit,
    audit_connection,
    parse_args,
    render,
    sink_figures,
)
from benchmarks.sink_mux import SinkMux, connection_prefix, sink_of, sinks_from_env
from tests.benchmarks.test_chaos_short import summary_of
from tests.support.processes import run_module
from tests.support.timing import scaled
from worker.delivery import Delivery
from worker.plugins import PluginError
from wsfleet.envelope import Envelope


def effects(cid: str, *seqs: int, seq_gen: int = 0, epoch: int = 1) -> list[Effect]:
    return [Effect(cid, seq_gen, seq, epoch=epoch, lag_ms=0) for seq in seqs]


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
    assert found.out_of_order_after_superseded == 0  # one owner: nothing explains it
    assert found.beyond == 1
    assert found.applied == 7


def test_out_of_order_after_an_older_owners_higher_seq_is_told_apart() -> None:
    # Owner 1's late request lands 6 and 7 while owner 2 is at 3: owner 2's 4 and 5
    # come late. Then 9 of owner 2, and 8 of owner 2 after it: no older owner's seq.
    log = [
        *effects("a", 1, 2, 3, epoch=2),
        *effects("a", 6, 7, epoch=1),
        *effects("a", 4, 5, 9, 8, epoch=2),
    ]
    found = audit_connection("a", log, sent_through=9)
    assert (found.out_of_order, found.out_of_order_after_superseded) == (3, 2)
    assert found.lost == 0


def test_seq_gens_order_apart_and_every_connection_is_audited() -> None:
    log = [*effects("a", 5, 6, seq_gen=1), *effects("a", 1, seq_gen=2), *effects("b", 1)]
    found = audit(log, {"a": 6, "b": 2, "c": 1})
    assert found["a"].out_of_order == 0
    assert found["a"].seq_gens == 2
    assert (found["b"].lost, found["c"].lost, found["c"].applied) == (1, 1, 0)


def test_a_sinks_violations_spare_what_an_older_owner_explains() -> None:
    audits = audit(
        [*effects("a", 1, 2, 3, epoch=2), *effects("a", 5, epoch=1), *effects("a", 4, epoch=2)],
        {"a": 5},
    )
    totals, violations = sink_figures(audits, ordered=True, count=5)
    assert (totals["out_of_order"], totals["out_of_order_after_superseded"]) == (1, 1)
    assert violations == []
    unexplained = audit(effects("a", 1, 3, 2), {"a": 3})
    _, violations = sink_figures(unexplained, ordered=True, count=3)
    assert violations == ["1 applied out of order without an older owner's seq before"]


def test_a_sink_read_in_no_order_is_not_audited_for_order_but_for_the_rest() -> None:
    audits = audit([*effects("a", 3, 1, 2, 2), *effects("b", 1)], {"a": 3, "b": 1, "c": 2})
    totals, violations = sink_figures(audits, ordered=False, count=3)
    assert totals["out_of_order"] is None
    assert (totals["lost"], totals["applied_twice"], totals["unfinished"]) == (2, 1, 2)
    assert violations == ["2 lost", "1 applied twice", "2 connections unfinished"]


def test_the_run_takes_every_sink_by_default_and_a_throttle_above_what_it_offers() -> None:
    options = parse_args(["--connections", "10", "--rate", "2"])
    assert options.sinks == ("kinesis", "firehose", "sqs_fifo")
    assert options.message_bytes == 2048
    assert options.throttle_rate == THROTTLE_SHARE * 10 * 2
    faults = options.faults()
    assert faults.throttle == options.throttle_rate
    assert faults.delay_seconds[1] < 10  # below the sinks' read timeout
    one = parse_args(["--sink", "sqs_fifo", "--throttle", "0", "--refuse", "0"])
    assert one.sinks == ("sqs_fifo",)
    assert one.faults().throttle is None


@pytest.mark.parametrize(
    "argv",
    [
        ["--sink", "kafka"],
        ["--refuse", "2"],
        ["--delay-min", "8", "--delay-max", "2"],
        ["--message-bytes", "-1"],
        ["--workers", "1"],
    ],
)
def test_bad_options_are_refused(argv: list[str]) -> None:
    with pytest.raises(SystemExit):
        parse_args(argv)


def test_the_report_shows_an_unordered_sink_without_order() -> None:
    figures = {
        "messages_sent": 10,
        "records_read": 12,
        "applied": 10,
        "skipped_copies": 2,
        "early": 0,
        "late": 0,
        "gaps": 0,
        "lost": 0,
        "applied_twice": 0,
        "out_of_order": None,
        "out_of_order_after_superseded": None,
        "superseded_reads": None,
        "beyond": 0,
        "unfinished": 0,
        "requests": 5,
        "records_sent": 14,
        "refused": 1,
        "throttled": 1,
        "delayed_requests": 1,
        "late_requests": 0,
        "failed_requests": 0,
        "answers_lost": 0,
        "failed_calls": 0,
        "batches_sent_again": 0,
        "apply_lag_ms": {"p50": 1.0, "p99": 2.0, "max": 3.0},
    }
    result = {
        "options": {
            "minutes": 1.0,
            "workers": 3,
            "connections": 1,
            "rate": 2.0,
            "message_bytes": 2048,
            "refuse": 0.03,
            "throttle_rate": 3.0,
            "delay": 0.05,
            "delay_min": 3.0,
            "delay_max": 7.0,
            "request_errors": 0.01,
            "failed_calls": 0.005,
        },
        "per_connection": 10,
        "faults": {},
        "workers_started": 3,
        "leases_held_after_shutdown": 0,
        "sinks": {"firehose": figures},
        "violations": [],
    }
    text = render(result)
    assert "n/a (unordered)" in text
    assert text.endswith("violations: 0")


def test_superseded_reads_are_records_of_an_older_owner_after_a_newer_ones() -> None:
    seen = Superseded()
    for epoch, seq in [(1, 1), (2, 1), (1, 2), (2, 2), (3, 3), (1, 4)]:
        seen.see(Envelope("a", epoch, 0, seq, 0, {}).to_bytes())
    seen.see(Envelope("b", 1, 0, 1, 0, {}).to_bytes())  # another connection's own order
    seen.see(b"not an envelope")
    assert seen.count == 2


def test_the_mux_names_a_sink_by_the_connections_prefix() -> None:
    assert [connection_prefix(s) for s in ("kinesis", "firehose", "sqs_fifo")] == [
        "kinesis-",
        "firehose-",
        "sqs-fifo-",
    ]
    assert sink_of("sqs-fifo-007") == "sqs_fifo"
    assert sink_of("kinesis-1") == "kinesis"
    assert sink_of("kinesisx-1") is None
    assert sinks_from_env({"SINK_MUX_SINKS": "kinesis, sqs_fifo"}) == ["kinesis", "sqs_fifo"]
    with pytest.raises(PluginError, match="SINK_MUX_SINKS"):
        sinks_from_env({"SINK_MUX_SINKS": "kinesis,kafka"})
    with pytest.raises(PluginError, match="SINK_MUX_SINKS"):
        sinks_from_env({})


async def test_the_mux_hands_each_batch_to_its_connections_sink() -> None:
    calls: list[tuple[str, list[int]]] = []

    class Sink:
        def __init__(self, name: str) -> None:
            self.name = name

        async def handle_batch(self, deliveries: Sequence[Delivery]) -> None:
            calls.append((self.name, [d.seq for d in deliveries]))

    mux = SinkMux({"kinesis": Sink("k"), "sqs_fifo": Sink("s")})
    await mux.handle_batch([Delivery("sqs-fifo-1", 1, seq, {}, "w") for seq in (1, 2)])
    await mux.handle_batch([Delivery("kinesis-1", 1, 5, {}, "w")])
    assert calls == [("s", [1, 2]), ("k", [5])]
    with pytest.raises(RuntimeError, match="names no sink"):
        await mux.handle_batch([Delivery("firehose-1", 1, 1, {}, "w")])


SHORT_RUN = ["--minutes", "1.5", "--workers", "3", "--connections", "10", "--fault-every", "20"]
SINKS = ("kinesis", "firehose", "sqs_fifo")


@pytest.mark.fleet
@pytest.mark.timeout(scaled(360))
def test_short_run_loses_nothing_and_applies_each_message_once_through_every_sink() -> None:
    result = run_module("benchmarks.sink_e2e", SHORT_RUN, scaled(330))
    output = f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    assert result.returncode == 0, output
    summary = summary_of(result.stdout)
    assert summary["violations"] == [], output
    assert set(summary["sinks"]) == set(SINKS)
    for name in SINKS:
        sink = summary["sinks"][name]
        assert sink["lost"] == 0, name
        assert sink["applied_twice"] == 0, name
        assert sink["unfinished"] == 0, name
        assert sink["beyond"] == 0, name
        assert sink["messages_sent"] == 10 * 180, name
        assert sink["applied"] == sink["messages_sent"], name
        # Read in order, a seq comes after a higher one only after an older owner's.
        if name != "firehose":
            assert sink["out_of_order"] == sink["out_of_order_after_superseded"], name
        # The endpoint did what it says, to every sink.
        assert sink["refused"] > 0, (name, sink)
        assert sink["throttled"] > 0, (name, sink)
        assert sink["delayed_requests"] > 0, (name, sink)
        assert sink["failed_requests"] > 0, (name, sink)
    assert summary["leases_held_after_shutdown"] == 0
    # The run did what it says: workers killed and stopped, copies in the destinations.
    assert summary["faults"].get("sigkill", 0) >= 3, summary["faults"]
    assert summary["faults"].get("sigterm", 0) >= 3, summary["faults"]
    assert sum(s["skipped_copies"] for s in summary["sinks"].values()) > 0
