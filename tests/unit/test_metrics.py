import io
import json

import pytest

from local_stack.clock import now_ms
from worker.metrics import FleetMetrics
from wsfleet import metric_names as m


def make(active=lambda: 4):
    out = io.StringIO()
    metrics = FleetMetrics(
        namespace="WebSocketFleet",
        service="websocket-fleet",
        task_id="task-1",
        active_connections=active,
        out=out,
    )
    return metrics, out


def test_emf_line_has_exactly_the_scaling_dimensions(monkeypatch):
    # Powertools would add a "service" dimension from this variable; it must not.
    monkeypatch.setenv("POWERTOOLS_SERVICE_NAME", "sneaky")
    metrics, out = make()
    metrics.count(m.MESSAGES_PROCESSED, 7)
    metrics.takeover_latency(1234)
    flushed_at = now_ms()
    metrics.flush(timestamp_ms=flushed_at)
    doc = json.loads(out.getvalue())
    directive = doc["_aws"]["CloudWatchMetrics"][0]
    assert directive["Namespace"] == "WebSocketFleet"
    assert directive["Dimensions"] == [["Service"], ["Service", "TaskId"]]
    assert "service" not in doc
    assert doc["Service"] == "websocket-fleet"
    assert doc["TaskId"] == "task-1"
    assert doc["_aws"]["Timestamp"] == flushed_at
    names = {d["Name"]: d["Unit"] for d in directive["Metrics"]}
    assert names[m.ACTIVE_CONNECTIONS] == "Count"
    assert names[m.TAKEOVER_LATENCY_MS] == "Milliseconds"
    assert set(m.COUNTERS) <= set(names)
    assert doc[m.ACTIVE_CONNECTIONS] == [4.0]
    assert doc[m.MESSAGES_PROCESSED] == [7.0]
    assert doc[m.TAKEOVER_LATENCY_MS] == [1234.0]


def test_every_period_publishes_zeros_and_resets():
    metrics, out = make(active=lambda: 0)
    metrics.count(m.LEASES_LOST)
    metrics.flush()
    metrics.flush()
    first, second = (json.loads(line) for line in out.getvalue().splitlines())
    assert first[m.LEASES_LOST] == [1.0]
    for name in m.COUNTERS:
        assert second[name] == [0.0], name
    assert second[m.ACTIVE_CONNECTIONS] == [0.0]
    assert m.TAKEOVER_LATENCY_MS not in second  # only real takeovers are published


def test_renew_lateness_is_summarised_per_period_and_reset():
    metrics, _ = make()
    assert metrics.lateness_summary() == {"renews": 0}
    for ms in range(100):  # 0..99 ms late
        metrics.renew_lateness(ms / 1000)
    metrics.renew_lateness(-0.5)  # early wake-ups count as on time
    summary = metrics.lateness_summary()
    assert summary["renews"] == 101
    assert summary["p50_ms"] == 49.0
    assert summary["p99_ms"] == 98.0
    assert summary["max_ms"] == 99.0
    metrics.flush()
    assert metrics.lateness_summary() == {"renews": 0}


@pytest.mark.parametrize("takeovers", [99, 100, 150, 250])
def test_a_mass_takeover_never_breaks_the_flush(capsys, takeovers):
    """Powertools publishes a metric on its own at 100 values and empties its set;
    the period's flush must still work, write nothing behind our back, carry every
    counter and the gauge exactly once, and drop no latency."""
    metrics, out = make()
    metrics.count(m.LEASES_ACQUIRED, takeovers)
    for ms in range(takeovers):
        metrics.takeover_latency(1000 + ms)
    documents = metrics.flush(timestamp_ms=now_ms())
    assert capsys.readouterr().out == ""  # nothing printed outside our stream
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert lines == documents
    once = [m.ACTIVE_CONNECTIONS, *m.COUNTERS]
    for name in once:
        assert sum(name in doc for doc in lines) == 1, name
    assert lines[0][m.LEASES_ACQUIRED] == [float(takeovers)]
    latencies = [v for doc in lines for v in doc.get(m.TAKEOVER_LATENCY_MS, [])]
    assert sorted(latencies) == [1000.0 + ms for ms in range(takeovers)]
    for doc in lines:
        assert len(doc.get(m.TAKEOVER_LATENCY_MS, [])) < 100  # EMF's limit per document
        (directive,) = doc["_aws"]["CloudWatchMetrics"]
        assert directive["Dimensions"] == [["Service"], ["Service", "TaskId"]]
        assert {d["Name"] for d in directive["Metrics"]} == {
            k for k in doc if k not in ("_aws", "Service", "TaskId")
        }
    # The next period is whole again.
    metrics.flush()
    last = json.loads(out.getvalue().splitlines()[-1])
    assert all(last[name] == [0.0] for name in m.COUNTERS)


def test_sessions_reaped_is_published_among_the_counters():
    assert m.SESSIONS_REAPED == "SessionsReaped"
    assert m.SESSIONS_REAPED in m.COUNTERS
    metrics, out = make()
    metrics.count(m.SESSIONS_REAPED, 2)
    metrics.count(m.RENEW_FAILURES)
    assert metrics.snapshot()[m.SESSIONS_REAPED] == 2
    metrics.flush()
    metrics.flush()
    first, second = (json.loads(line) for line in out.getvalue().splitlines())
    units = {d["Name"]: d["Unit"] for d in first["_aws"]["CloudWatchMetrics"][0]["Metrics"]}
    assert units[m.SESSIONS_REAPED] == "Count"
    assert (first[m.SESSIONS_REAPED], first[m.RENEW_FAILURES]) == ([2.0], [1.0])
    assert second[m.SESSIONS_REAPED] == [0.0]  # every period, zeros included


def test_loop_lag_and_collections_are_summarised_per_period_and_reset():
    metrics, _ = make()
    assert metrics.loop_summary() == {"lag_samples": 0, "gc0": 0, "gc1": 0, "gc2": 0}
    for ms in range(100):
        metrics.loop_lag(ms / 1000)
    metrics.gc_pause(0, 0.001)
    metrics.gc_pause(2, 0.080)
    metrics.gc_pause(2, 0.004)
    summary = metrics.loop_summary()
    assert summary == {
        "lag_samples": 100,
        "lag_p50_ms": 50.0,
        "lag_p99_ms": 99.0,
        "lag_max_ms": 99.0,
        "gc0": 1,
        "gc0_max_ms": 1.0,
        "gc1": 0,
        "gc2": 2,
        "gc2_max_ms": 80.0,
    }
    metrics.flush()
    assert metrics.loop_summary() == {"lag_samples": 0, "gc0": 0, "gc1": 0, "gc2": 0}


@pytest.mark.parametrize(("takeovers", "gaps"), [(0, 1), (0, 150), (120, 30), (5, 250)])
def test_upstream_gaps_are_values_beside_the_takeover_latencies(takeovers, gaps):
    metrics, out = make()
    for ms in range(takeovers):
        metrics.takeover_latency(1000 + ms)
    for ms in range(gaps):
        metrics.upstream_gap(5000 + ms)
    assert metrics.snapshot()[m.UPSTREAM_GAPS] == gaps
    documents = metrics.flush(timestamp_ms=now_ms())
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert lines == documents
    assert len(lines) == max(1, -(-max(takeovers, gaps) // 99))
    for name in [m.ACTIVE_CONNECTIONS, *m.COUNTERS]:
        assert sum(name in doc for doc in lines) == 1, name
    assert lines[0][m.UPSTREAM_GAPS] == [float(gaps)]
    found = sorted(v for doc in lines for v in doc.get(m.UPSTREAM_GAP_MS, []))
    assert found == [5000.0 + ms for ms in range(gaps)]
    latencies = sorted(v for doc in lines for v in doc.get(m.TAKEOVER_LATENCY_MS, []))
    assert latencies == [1000.0 + ms for ms in range(takeovers)]
    for doc in lines:
        assert len(doc.get(m.UPSTREAM_GAP_MS, [])) < 100
        units = {d["Name"]: d["Unit"] for d in doc["_aws"]["CloudWatchMetrics"][0]["Metrics"]}
        if m.UPSTREAM_GAP_MS in doc:
            assert units[m.UPSTREAM_GAP_MS] == "Milliseconds"
    metrics.flush()
    last = json.loads(out.getvalue().splitlines()[-1])
    assert m.UPSTREAM_GAP_MS not in last
    assert last[m.UPSTREAM_GAPS] == [0.0]


def test_messages_the_readers_tally_are_counted_once_and_reset_by_the_flush():
    metrics, out = make()
    metrics.handled.messages += 5  # as readers add after each call that returned
    metrics.count(m.MESSAGES_PROCESSED, 2)
    assert metrics.snapshot()[m.MESSAGES_PROCESSED] == 7
    metrics.handled.messages += 1
    assert metrics.snapshot()[m.MESSAGES_PROCESSED] == 8  # a snapshot resets nothing
    metrics.flush()
    metrics.handled.messages += 3
    metrics.flush()
    first, second = (json.loads(line) for line in out.getvalue().splitlines())
    assert first[m.MESSAGES_PROCESSED] == [8.0]
    assert second[m.MESSAGES_PROCESSED] == [3.0]
    assert metrics.snapshot()[m.MESSAGES_PROCESSED] == 0
