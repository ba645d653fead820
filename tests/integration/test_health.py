"""Each connection's health as the API shows it, from real worker processes against
DynamoDB Local, moto SQS and the demo feed: a healthy stream, an upstream that
refuses TCP connections, and one that answers 404 (lease 2 s; checkpoint pages every
5 s, the default, which is how fresh the health is)."""

from __future__ import annotations

from typing import Any

import pytest

from local_stack import services
from tests.support.fleet import Fleet, wait_until
from tests.support.timing import scaled

pytestmark = [pytest.mark.fleet, pytest.mark.timeout(scaled(120))]

PAGE_SECONDS = 5.0


def view(fleet: Fleet, connection_id: str) -> dict[str, Any]:
    return fleet.api.get(connection_id)


def wait_status(fleet: Fleet, connection_id: str, statuses: set[str]) -> dict[str, Any]:
    """The view once its status is one of ``statuses`` (within two page intervals of
    the worker seeing it, plus the time to get there)."""
    shown: dict[str, Any] = {}

    def reached() -> bool:
        shown.update(view(fleet, connection_id))
        return shown["status"] in statuses

    wait_until(reached, scaled(4 * PAGE_SECONDS), f"{connection_id} to be {statuses}")
    return shown


def test_the_api_tells_streaming_backing_off_and_failed_apart(fleet: Fleet):
    worker = fleet.start_worker("w")
    fleet.start_connection("healthy")
    fleet.start_connection("refused", f"ws://127.0.0.1:{services.free_port()}/nothing")
    fleet.start_connection("missing", fleet.feed("missing", refuse=404))

    healthy = wait_status(fleet, "healthy", {"streaming"})
    assert healthy["owner"] == worker.worker_id
    # The owner's own count over its last page interval; the feed sends 20 a second.
    wait_until(
        lambda: (view(fleet, "healthy")["messages_per_second"] or 0) >= 10,
        scaled(3 * PAGE_SECONDS),
        "a rate near the feed's 20 msg/s",
    )
    healthy = view(fleet, "healthy")
    assert healthy["messages_per_second"] <= 30
    assert 0 <= healthy["seconds_since_last_message"] < PAGE_SECONDS + 1
    assert (healthy["reconnects"], healthy["last_error"]) == (0, None)

    refused = wait_status(fleet, "refused", {"backing_off", "connecting"})
    wait_until(
        lambda: (view(fleet, "refused")["reconnects"] or 0) >= 2,
        scaled(3 * PAGE_SECONDS),
        "reconnects counted",
    )
    refused = view(fleet, "refused")
    assert refused["owner"] == worker.worker_id
    assert refused["last_error"] == "connection refused"
    assert refused["seconds_since_last_message"] is None
    assert refused["messages_per_second"] == 0

    missing = wait_status(fleet, "missing", {"failed"})
    assert missing["last_error"] == "HTTP 404 from upstream"
    assert missing["owner"] is None

    fleet.stop_connection("healthy")
    wait_status(fleet, "healthy", {"stopped"})


def test_a_stream_that_goes_quiet_shows_a_zero_rate_and_a_growing_silence(fleet: Fleet):
    fleet.start_worker("w")
    # 15 messages, then the feed keeps the connection open and sends nothing.
    fleet.start_connection("quiet", fleet.feed("quiet", count=15))
    fleet.wait_handling(["quiet"], scaled(15), min_seq=15)

    def silent() -> bool:
        shown = view(fleet, "quiet")
        return (
            shown["status"] == "streaming"
            and shown["messages_per_second"] == 0
            and (shown["seconds_since_last_message"] or 0) >= PAGE_SECONDS
        )

    wait_until(silent, scaled(4 * PAGE_SECONDS), "a zero rate and 5 s of silence")
    assert view(fleet, "quiet")["last_seq"] == 15
