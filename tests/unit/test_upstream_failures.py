"""When a failing upstream is parked: the classification and the failing clock."""

from __future__ import annotations

import asyncio
import errno
import socket
import ssl

import pytest
from websockets.asyncio.client import connect
from websockets.datastructures import Headers
from websockets.exceptions import (
    ConnectionClosedError,
    InvalidHandshake,
    InvalidStatus,
    InvalidURI,
)
from websockets.frames import Close
from websockets.http11 import Response

from worker.upstream_failures import (
    AttemptFailed,
    FailingClock,
    Verdict,
    describe,
    permanent_refusal,
)

T0 = 1_800_000_000_000
FAIL_AFTER_MS = 600_000


def status(code: int) -> InvalidStatus:
    return InvalidStatus(Response(code, "", Headers(), b"secret body"))


@pytest.mark.parametrize(
    ("error", "reason"),
    [
        (status(404), "HTTP 404 from upstream"),
        (status(400), "HTTP 400 from upstream"),
        (status(401), "HTTP 401 from upstream"),
        (status(403), "HTTP 403 from upstream"),
        (status(410), "HTTP 410 from upstream"),
        (status(499), "HTTP 499 from upstream"),
        (status(408), None),  # Request Timeout: may pass
        (status(429), None),  # Too Many Requests: may pass
        (status(500), None),
        (status(503), None),
        (status(301), None),
        (InvalidURI("ws://h/x?token=s3cret", "bad"), "invalid upstream URI"),
        (
            ssl.SSLCertVerificationError(1, "certificate verify failed"),
            "upstream TLS certificate not trusted",
        ),
        (ssl.SSLError(1, "handshake failure"), None),
        (ConnectionRefusedError(111, "Connection refused"), None),
        (TimeoutError(), None),
        (ConnectionClosedError(None, None), None),
        (OSError(113, "No route to host"), None),
        (None, None),
    ],
)
def test_permanent_refusals(error, reason):
    assert permanent_refusal(error) == reason


@pytest.mark.parametrize(
    ("error", "text"),
    [
        (None, "closed before a message"),
        (status(503), "HTTP 503"),
        (ConnectionRefusedError(111, "Connection refused"), "connection refused"),
        (InvalidURI("ws://h/x?token=s3cret", "bad"), "invalid URI"),
        (ConnectionClosedError(None, None), "connection lost"),
        (ConnectionClosedError(Close(1011, "s3cret"), None), "closed by upstream (1011)"),
        (InvalidHandshake("s3cret"), "invalid handshake"),
        (socket.gaierror(-2, "Name or service not known s3cret"), "host not found"),
        (TimeoutError("s3cret"), "timed out"),
        (ConnectionResetError(errno.ECONNRESET, "s3cret"), "network error ECONNRESET"),
        (ssl.SSLCertVerificationError(1, "s3cret"), "TLS certificate not trusted"),
        (ssl.SSLError(1, "s3cret"), "TLS error"),
        (OSError("s3cret"), "OSError"),
        (ValueError("s3cret"), "ValueError"),
    ],
)
def test_descriptions_name_the_failure_and_never_the_url(error, text):
    assert describe(error) == text
    assert "s3cret" not in describe(error)


def test_an_upstream_that_closed_after_messages_is_told_apart():
    assert describe(None, delivered=True) == "closed by upstream"
    assert describe(None, delivered=False) == "closed before a message"


def test_a_permanent_refusal_parks_at_once_and_writes_no_mark():
    clock = FailingClock(FAIL_AFTER_MS)
    assert clock.attempt_failed(status(404), T0) == AttemptFailed(
        Verdict.PARK, record=False, reason="HTTP 404 from upstream"
    )


# (ms after the first failure, error, verdict, record)
STREAK = [
    (0, ConnectionRefusedError(), Verdict.RETRY, True),  # the streak begins: one write
    (250, ConnectionRefusedError(), Verdict.RETRY, False),
    (300_000, status(503), Verdict.RETRY, False),
    (599_999, None, Verdict.RETRY, False),
    (600_000, ConnectionRefusedError(), Verdict.PARK, False),
]


def test_a_streak_without_a_handled_message_parks_once_its_time_runs_out():
    clock = FailingClock(FAIL_AFTER_MS)
    for offset, error, verdict, record in STREAK:
        failed = clock.attempt_failed(error, T0 + offset)
        if failed.record:
            clock.recorded()
        assert (offset, failed.verdict, failed.record) == (offset, verdict, record)
        if verdict is Verdict.RETRY:
            assert failed.park_in == (FAIL_AFTER_MS - offset) / 1000
    assert failed.reason == "no message handled for 600 s: connection refused"


def test_a_handled_message_ends_the_streak_with_one_write():
    clock = FailingClock(FAIL_AFTER_MS)
    assert clock.message_handled() is False  # healthy: no write, ever
    assert clock.attempt_failed(None, T0).record is True
    clock.recorded()
    assert clock.message_handled() is True  # remove the mark
    clock.cleared()
    assert clock.message_handled() is False
    # A new streak starts its own clock.
    failed = clock.attempt_failed(ConnectionRefusedError(), T0 + 900_000)
    assert (failed.verdict, failed.record, failed.park_in) == (Verdict.RETRY, True, 600.0)


def test_a_mark_that_was_not_written_is_tried_again_and_a_failed_removal_too():
    clock = FailingClock(FAIL_AFTER_MS)
    assert clock.attempt_failed(None, T0).record is True
    assert clock.attempt_failed(None, T0 + 10).record is True  # first write failed
    clock.recorded()
    assert clock.attempt_failed(None, T0 + 20).record is False
    assert clock.message_handled() is True
    assert clock.message_handled() is True  # the removal failed: once more


def test_a_new_owner_goes_on_from_the_recorded_start():
    """The clock travels with the item: a move does not restart it."""
    clock = FailingClock(FAIL_AFTER_MS, failing_since_ms=T0)
    failed = clock.attempt_failed(ConnectionRefusedError(), T0 + 599_000)
    assert (failed.verdict, failed.record, failed.park_in) == (Verdict.RETRY, False, 1.0)
    assert clock.attempt_failed(ConnectionRefusedError(), T0 + 600_000).verdict is Verdict.PARK
    # ...and it removes the mark it inherited once a message is handled.
    assert FailingClock(FAIL_AFTER_MS, failing_since_ms=T0).message_handled() is True


@pytest.mark.parametrize(("ms", "text"), [(600_000, "600"), (3_000, "3"), (1_500, "1.5")])
def test_the_reason_names_the_configured_time(ms, text):
    clock = FailingClock(ms, failing_since_ms=T0)
    assert clock.attempt_failed(None, T0 + ms).reason == (
        f"no message handled for {text} s: closed before a message"
    )


async def refusal_of(status_line: bytes) -> BaseException:
    """What the worker's websockets client raises against a real server on loopback
    that answers the handshake with ``status_line``."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(status_line + b"\r\nContent-Type: text/plain\r\n\r\nno such feed\n")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        async with connect(f"ws://127.0.0.1:{port}/feed", open_timeout=5):
            pass
    except Exception as error:
        return error
    finally:
        server.close()
        await server.wait_closed()
    raise AssertionError("the handshake passed")


@pytest.mark.parametrize("version", [b"HTTP/1.0", b"HTTP/1.1"])
async def test_a_refusal_answered_in_either_http_version_parks_at_once(version):
    """A plain server's 404 in HTTP/1.0 was an invalid handshake to websockets, and
    backed off until the failing clock ran out instead of parking."""
    error = await refusal_of(version + b" 404 Not Found")
    assert permanent_refusal(error) == "HTTP 404 from upstream"
    assert describe(error) == "HTTP 404"
    retryable = await refusal_of(version + b" 503 Service Unavailable")
    assert permanent_refusal(retryable) is None
    assert describe(retryable) == "HTTP 503"
