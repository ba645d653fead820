"""A connection's upstream health as its owner reports it: status, reconnects, the
last error, and the rate between two page lines."""

from __future__ import annotations

import pytest

from worker.upstream_health import UpstreamHealth


def test_a_new_hold_is_connecting_with_nothing_to_report():
    health = UpstreamHealth(now=100.0, checkpoint=40)
    assert (health.status, health.reconnects, health.last_error) == ("connecting", 0, None)


def test_each_ended_attempt_counts_and_leaves_its_reason():
    health = UpstreamHealth(now=100.0, checkpoint=40)
    health.attempt_ended("connection refused", "backing_off")
    health.status = "connecting"
    health.attempt_ended("HTTP 503", "backing_off")
    assert (health.status, health.reconnects, health.last_error) == ("backing_off", 2, "HTTP 503")


@pytest.mark.parametrize(
    ("lines", "rates"),
    [
        ([(105.0, 90)], [10]),  # 50 messages in 5 s since the hold began
        ([(105.0, 90), (110.0, 90)], [10, 0]),  # then nothing: 0, not the old rate
        ([(105.0, 90), (105.0, 95)], [10, None]),  # no time passed: no rate
        ([(103.0, 41)], [0.33]),
        ([(105.0, 30)], [0]),  # a checkpoint behind the start (never): 0, not negative
    ],
)
def test_the_rate_is_measured_from_the_previous_line(lines, rates):
    health = UpstreamHealth(now=100.0, checkpoint=40)
    assert [health.rate_since_last(now, seq) for now, seq in lines] == rates
