"""The demo feed served in-process on a loopback port, driven by a real WebSocket client."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.asyncio.server import Server
from websockets.exceptions import (
    ConnectionClosed,
    ConnectionClosedError,
    ConnectionClosedOK,
    InvalidStatus,
)
from websockets.frames import CloseCode
from websockets.protocol import State

from local_stack.clock import now_ms
from local_stack.feed import OVERSIZE_BYTES, feed_value, serve_feed
from tests.support.timing import scaled

# Long enough for a loaded CI machine, short enough that a hang fails fast.
RECV_TIMEOUT_S = scaled(5.0)


@dataclass
class Feed:
    server: Server
    base_url: str

    def url(self, path_and_query: str) -> str:
        return self.base_url + path_and_query


async def _start(default_rate: float) -> Feed:
    server = await serve_feed("127.0.0.1", 0, default_rate=default_rate)
    port = server.sockets[0].getsockname()[1]
    return Feed(server=server, base_url=f"ws://127.0.0.1:{port}")


async def _stop(feed: Feed) -> None:
    feed.server.close()
    await asyncio.wait_for(feed.server.wait_closed(), RECV_TIMEOUT_S)


@pytest.fixture
async def feed() -> AsyncIterator[Feed]:
    # Default rate 0 keeps the tests fast; pacing is tested explicitly.
    started = await _start(default_rate=0)
    try:
        yield started
    finally:
        await _stop(started)


def _client(url: str, **kwargs: Any) -> connect:
    # No keepalive pings: tests ping explicitly. A short close timeout keeps teardown
    # quick when the server does not answer the closing handshake.
    kwargs.setdefault("close_timeout", 0.5)
    return connect(url, ping_interval=None, open_timeout=RECV_TIMEOUT_S, **kwargs)


async def _recv(ws: ClientConnection) -> str:
    frame = await asyncio.wait_for(ws.recv(), RECV_TIMEOUT_S)
    assert isinstance(frame, str)
    return frame


async def _recv_json(ws: ClientConnection) -> dict[str, Any]:
    decoded = json.loads(await _recv(ws))
    assert isinstance(decoded, dict)
    return decoded


async def _recv_seqs(ws: ClientConnection, n: int) -> list[int]:
    return [(await _recv_json(ws))["seq"] for _ in range(n)]


async def _assert_silent(ws: ClientConnection, seconds: float) -> None:
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(ws.recv(), seconds)


async def test_resume_from_seq_replays_the_same_messages(feed: Feed) -> None:
    async with _client(feed.url("/feed-a?count=8")) as ws:
        full = [await _recv_json(ws) for _ in range(8)]
    async with _client(feed.url("/feed-a?from_seq=5&count=8")) as ws:
        resumed = [await _recv_json(ws) for _ in range(4)]

    assert [m["seq"] for m in full] == list(range(1, 9))
    assert [m["seq"] for m in resumed] == [5, 6, 7, 8]
    assert [m["value"] for m in resumed] == [m["value"] for m in full[4:]]
    assert [m["value"] for m in resumed] == [feed_value("feed-a", s) for s in range(5, 9)]
    assert {m["feed"] for m in full + resumed} == {"feed-a"}
    now = now_ms()
    assert all(abs(m["sent_at_ms"] - now) < 60_000 for m in resumed)


async def test_count_stops_after_that_seq_and_keeps_the_connection_open(feed: Feed) -> None:
    async with _client(feed.url("/feed-a?from_seq=3&count=5")) as ws:
        assert await _recv_seqs(ws, 3) == [3, 4, 5]
        await _assert_silent(ws, 0.5)
        # Idle, yet alive: pings are answered.
        latency = await asyncio.wait_for(await ws.ping(), RECV_TIMEOUT_S)
        assert latency >= 0
        assert ws.state is State.OPEN


async def test_drop_after_aborts_without_a_close_frame(feed: Feed) -> None:
    async with _client(feed.url("/feed-a?drop_after=3")) as ws:
        assert await _recv_seqs(ws, 3) == [1, 2, 3]
        with pytest.raises(ConnectionClosedError) as closed:
            await _recv(ws)
    assert closed.value.rcvd is None


async def test_close_after_closes_normally(feed: Feed) -> None:
    async with _client(feed.url("/feed-a?close_after=2")) as ws:
        assert await _recv_seqs(ws, 2) == [1, 2]
        with pytest.raises(ConnectionClosedOK) as closed:
            await _recv(ws)
    assert closed.value.rcvd is not None
    assert closed.value.rcvd.code == CloseCode.NORMAL_CLOSURE


async def test_garbage_after_sends_one_non_json_frame_then_continues(feed: Feed) -> None:
    async with _client(feed.url("/feed-a?garbage_after=2&count=5")) as ws:
        frames = [await _recv(ws) for _ in range(6)]
    with pytest.raises(json.JSONDecodeError):
        json.loads(frames[2])
    assert [json.loads(f)["seq"] for i, f in enumerate(frames) if i != 2] == [1, 2, 3, 4, 5]


async def test_oversize_after_trips_a_client_limit_of_one_mib(feed: Feed) -> None:
    async with _client(feed.url("/feed-a?oversize_after=1"), max_size=2**20) as ws:
        assert await _recv_seqs(ws, 1) == [1]
        with pytest.raises(ConnectionClosedError) as closed:
            await _recv(ws)
    assert closed.value.sent is not None
    assert closed.value.sent.code == CloseCode.MESSAGE_TOO_BIG


async def test_oversize_frame_is_followed_by_the_next_seq(feed: Feed) -> None:
    async with _client(feed.url("/feed-a?oversize_after=1&count=2"), max_size=4 * 2**20) as ws:
        first, big, second = await _recv(ws), await _recv(ws), await _recv(ws)
    assert json.loads(first)["seq"] == 1
    assert len(big.encode()) == OVERSIZE_BYTES
    assert json.loads(second)["seq"] == 2


async def test_gap_after_skips_exactly_one_seq(feed: Feed) -> None:
    async with _client(feed.url("/feed-a?gap_after=2&count=6")) as ws:
        assert await _recv_seqs(ws, 5) == [1, 2, 4, 5, 6]
        await _assert_silent(ws, 0.3)


async def test_mute_after_stops_answering_pings_and_sending(feed: Feed) -> None:
    async with _client(feed.url("/feed-a?mute_after=3")) as ws:
        assert await _recv_seqs(ws, 3) == [1, 2, 3]
        pong = await ws.ping()
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(pong, 1.0)
        await _assert_silent(ws, 0.2)
        assert ws.state is State.OPEN  # the TCP connection itself stays up

    # Once the client has gone, the server notices and lets the connection go.
    deadline = time.monotonic() + RECV_TIMEOUT_S
    while feed.server.connections:
        assert time.monotonic() < deadline, "muted connection outlived its client"
        await asyncio.sleep(0.05)


async def test_shutdown_is_not_held_up_by_a_muted_connection() -> None:
    started = await _start(default_rate=0)
    try:
        async with _client(started.url("/feed-a?mute_after=0")) as ws:
            await _assert_silent(ws, 0.3)
            began = time.monotonic()
            await _stop(started)
            assert time.monotonic() - began < scaled(2.0)
            # The server's going-away frame still goes out; only reading is muted.
            with pytest.raises(ConnectionClosed):
                await _recv(ws)
    finally:
        await _stop(started)


async def test_pings_are_answered_while_streaming(feed: Feed) -> None:
    async with _client(feed.url("/feed-a?rate=20")) as ws:
        await _recv_seqs(ws, 1)
        latency = await asyncio.wait_for(await ws.ping(), RECV_TIMEOUT_S)
        assert latency < RECV_TIMEOUT_S


@pytest.mark.parametrize(
    ("query", "complaint"),
    [
        ("?from_seq=0", "from_seq"),
        ("?rate=-2", "rate"),
        ("?drop_afer=1", "drop_afer"),
        ("?count=x", "count"),
    ],
)
async def test_invalid_parameters_close_with_1008(feed: Feed, query: str, complaint: str) -> None:
    async with _client(feed.url("/feed-a" + query)) as ws:
        with pytest.raises(ConnectionClosedError) as closed:
            await _recv(ws)
    assert closed.value.rcvd is not None
    assert closed.value.rcvd.code == CloseCode.POLICY_VIOLATION
    assert complaint in closed.value.rcvd.reason

    # The server is unharmed.
    async with _client(feed.url("/feed-a?count=1")) as ws:
        assert await _recv_seqs(ws, 1) == [1]


@pytest.mark.parametrize(("default_rate", "query"), [(0.0, "&rate=50"), (50.0, "")])
async def test_pacing_at_50_per_second(default_rate: float, query: str) -> None:
    started = await _start(default_rate=default_rate)
    try:
        began = time.monotonic()
        async with _client(started.url("/feed-a?count=20" + query)) as ws:
            messages = [await _recv_json(ws) for _ in range(20)]
        elapsed = time.monotonic() - began
    finally:
        await _stop(started)
    assert [m["seq"] for m in messages] == list(range(1, 21))
    # Seq 20 is due 19/50 = 0.38 s after the first; loose bounds for a busy machine.
    assert 0.3 <= elapsed < scaled(3.0)
    assert messages[-1]["sent_at_ms"] - messages[0]["sent_at_ms"] >= 300


async def test_pacing_catches_up_after_a_stall_instead_of_drifting(feed: Feed) -> None:
    """Seq i is due at start + i/rate. After a 1 s stall the overdue seqs 2..11 (due
    0.1..1.0 s) must go out in one burst, by the feed's own send times; a feed that
    slept 1/rate per message would spread them over 0.9 s. The threshold sits halfway
    (0.45 s), so neither outcome is near it."""
    async with _client(feed.url("/feed-a?rate=10&count=12")) as ws:
        first = await _recv_json(ws)
        # Freeze the event loop, and with it the in-process server, for 1 s.
        time.sleep(1.0)  # noqa: ASYNC251 - the stall is the point of this test
        overdue = [await _recv_json(ws) for _ in range(10)]
    assert [m["seq"] for m in [first, *overdue]] == list(range(1, 12))
    burst_ms = overdue[-1]["sent_at_ms"] - overdue[0]["sent_at_ms"]
    assert burst_ms < 450, f"overdue messages spread over {burst_ms} ms: drifting"


@pytest.mark.parametrize("status", [404, 403, 503])
async def test_refuse_answers_the_handshake_with_that_status(feed: Feed, status: int) -> None:
    with pytest.raises(InvalidStatus) as refused:
        async with _client(feed.url(f"/feed-a?refuse={status}")):
            pass
    assert refused.value.response.status_code == status
    # The same feed without the parameter still streams.
    async with _client(feed.url("/feed-a?count=2")) as ws:
        assert await _recv_seqs(ws, 2) == [1, 2]


# --- what real upstreams ask for: a key, a subscribe frame, their own fields, live -------


async def test_require_key_answers_401_without_the_feeds_key() -> None:
    server = await serve_feed("127.0.0.1", 0, default_rate=0, api_key=lambda: "k-1")
    port = server.sockets[0].getsockname()[1]
    feed = Feed(server=server, base_url=f"ws://127.0.0.1:{port}")
    try:
        for headers in (None, {"X-Demo-Key": "wrong"}):
            with pytest.raises(InvalidStatus) as refused:
                async with _client(feed.url("/k?require_key=1"), additional_headers=headers):
                    pass
            assert refused.value.response.status_code == 401
            assert b"k-1" not in refused.value.response.body
        async with _client(
            feed.url("/k?require_key=1&count=2"), additional_headers={"X-Demo-Key": "k-1"}
        ) as ws:
            assert await _recv_seqs(ws, 2) == [1, 2]
        async with _client(feed.url("/k?count=1")) as ws:  # streams without require_key
            assert await _recv_seqs(ws, 1) == [1]
    finally:
        await _stop(feed)


async def test_subscribe_waits_for_the_clients_frame_and_starts_where_it_says(feed: Feed) -> None:
    async with _client(feed.url("/s?subscribe=1&count=9")) as ws:
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(ws.recv(), 0.3)  # nothing before the subscribe frame
        await ws.send(json.dumps({"op": "subscribe", "from_seq": 7}))
        assert await _recv_seqs(ws, 3) == [7, 8, 9]
    async with _client(feed.url("/s?subscribe=1&from_seq=4&count=5")) as ws:
        await ws.send(json.dumps({"op": "subscribe"}))  # no from_seq: the URL's
        assert await _recv_seqs(ws, 2) == [4, 5]


async def test_subscribe_closes_with_1008_on_a_frame_that_is_not_an_object(feed: Feed) -> None:
    async with _client(feed.url("/s?subscribe=1")) as ws:
        await ws.send("[1]")
        with pytest.raises(ConnectionClosed) as closed:
            await asyncio.wait_for(ws.recv(), RECV_TIMEOUT_S)
    assert closed.value.rcvd is not None
    assert closed.value.rcvd.code == CloseCode.POLICY_VIOLATION
    assert closed.value.rcvd.reason == "subscribe expected"


async def test_seq_field_carries_the_number_in_another_field(feed: Feed) -> None:
    async with _client(feed.url("/f?seq_field=meta.n&from_seq=3&count=4")) as ws:
        first, second = await _recv_json(ws), await _recv_json(ws)
    assert (first["meta"], second["meta"]) == ({"n": 3}, {"n": 4})
    assert "seq" not in first
    assert first["value"] == feed_value("f", 3)


async def test_pad_sends_frames_of_that_many_bytes_that_resume_alike(feed: Feed) -> None:
    async with _client(feed.url("/p?pad=2048&count=3")) as ws:
        frames = [await _recv(ws) for _ in range(3)]
    async with _client(feed.url("/p?pad=2048&from_seq=2&count=3")) as ws:
        resumed = json.loads(await _recv(ws))
    assert [len(frame.encode()) for frame in frames] == [2048, 2048, 2048]
    decoded = [json.loads(frame) for frame in frames]
    assert [m["seq"] for m in decoded] == [1, 2, 3]
    assert [m["value"] for m in decoded] == [feed_value("p", s) for s in (1, 2, 3)]
    assert (resumed["seq"], resumed["value"]) == (2, decoded[1]["value"])


async def test_a_live_stream_starts_at_the_current_times_number(feed: Feed) -> None:
    rate = 50.0
    async with _client(feed.url(f"/l?live=1&rate={rate}&from_seq=3")) as ws:
        now = time.time()
        first = (await _recv_json(ws))["seq"]
        second = (await _recv_json(ws))["seq"]
    assert abs(first - now * rate) < rate  # within a second of the clock, not from_seq
    assert second == first + 1
