"""The worked example of a protocol plug-in (examples/tickline/protocol.py): its
framing, its options, and, in a real connection runner against the fake feed on
loopback, each part of the interface: a session call before every connect
(``resolve_url``), the subscription with the secret's account (``open_frames``), ticks
and answered pings (``decode``), heartbeats and a quiet stream left (``attached``), and
no tick lost or repeated across the feed's closes."""

from __future__ import annotations

import asyncio
import json
import logging
import re
from typing import Any

import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from examples.tickline.fake_feed import NO_HEARTBEAT, TicklineFeed, serving, tick
from examples.tickline.protocol import TicklineProtocol, factory
from tests.unit.test_connection_runner import FakeStore, Recorder, wait_for
from tests.unit.test_runner_plugins import runner as make_runner
from tests.unit.test_runner_plugins import seqs, shared_settings
from tests.unit.test_runner_upstreams import REF, Secrets, run
from worker.connection import ConnectionRunner
from worker.connection_state import Ending
from worker.credentials import SecretCache
from worker.protocol_plugins import ProtocolPlugins
from worker.upstream_protocol import Message, OpenFrameError, Reply, Unreadable

pytestmark = pytest.mark.timeout(30)

KEY = "tk-51e2-value-that-must-never-be-logged"
ACCOUNT = "acme"


def configured(**options: Any) -> TicklineProtocol:
    protocol = factory()
    protocol.configure({"channel": "quotes", **options})
    return protocol


# --- the plug-in alone ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("frame", "expected"),
    [
        ('D 7 {"channel": "q", "price": 99.5}', Message(7, {"channel": "q", "price": 99.5})),
        ("P 42", Reply("O 42")),
        ("D 0 {}", Unreadable("no seq >= 1")),
        ("D x {}", Unreadable("no seq >= 1")),
        ("D ² {}", Unreadable("no seq >= 1")),
        ("D 3 not-json", Unreadable("tick is not JSON")),
        ("X something", Unreadable("unknown frame kind 'X'")),
        (b"D 1 {}", Unreadable("binary frame")),
    ],
)
def test_frames_are_read_by_their_first_letter(frame, expected):
    assert configured().decode(frame) == expected


def test_it_subscribes_with_the_secrets_account_from_the_next_seq():
    protocol = configured()
    assert protocol.resume_url("wss://feed.example.com/tickline", 41) == (
        "wss://feed.example.com/tickline"
    )
    assert protocol.open_frames(41, {"account": ACCOUNT}) == ["SUB acme quotes 42"]
    with pytest.raises(OpenFrameError, match="no usable account field"):
        protocol.open_frames(0, {})
    assert protocol.resumable


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({}, "channel must be"),
        ({"channel": "a b"}, "channel must be"),
        ({"channel": "q", "heartbeat_seconds": 0}, "heartbeat_seconds must be"),
        ({"channel": "q", "quiet_seconds": True}, "quiet_seconds must be"),
        ({"channel": "q", "from": 3}, "unknown options ['from']"),
    ],
)
def test_options_it_cannot_use_are_refused(options, says):
    with pytest.raises(ValueError, match=re.escape(says)):
        factory().configure(options)


# --- in a connection runner, against the fake feed ------------------------------------------


def tickline_runner(
    url: str, secrets: Secrets, handler: Recorder, store: FakeStore, **options: Any
) -> ConnectionRunner:
    settings = shared_settings(
        handler,
        store,
        ProtocolPlugins({"tickline": factory}),
        secrets=SecretCache(secrets.read, ttl=300),
        fail_after=1.0,
    )
    spec = {"name": "tickline", "options": {"channel": "quotes", **options}}
    return make_runner(settings, "acme-quotes", url, spec, secret=REF)


async def test_every_tick_once_in_order_across_the_feeds_closes(caplog):
    caplog.set_level(logging.DEBUG)
    feed = TicklineFeed(api_key=KEY, account=ACCOUNT, close_after=8, ping_every=3)
    secrets = Secrets(api_key=KEY, account=ACCOUNT)
    handler, store = Recorder(), FakeStore()
    async with serving(feed) as url:
        runner = tickline_runner(url, secrets, handler, store, heartbeat_seconds=0.2)
        task = run(runner)
        await wait_for(lambda: len(handler.finished) >= 30, 15)
        runner.stop()
        outcome = await asyncio.wait_for(task, 5)
    assert outcome.ending is Ending.SHUTDOWN
    got = seqs(handler, "acme-quotes")
    assert got == list(range(1, len(got) + 1))
    assert [d.payload for d in handler.deliveries] == [tick("quotes", n) for n in got]
    # A session (and a ticket of its own) for every stream, each stream subscribed
    # from where the previous one ended; every ping answered.
    streams = feed.streams
    assert len(streams) >= 4
    assert feed.sessions == len(streams)
    assert feed.refused_tickets == feed.refused_sessions == 0
    assert len({s.ticket for s in streams}) == len(streams)
    assert [s.subscribe for s in streams[:4]] == [f"SUB acme quotes {1 + 8 * n}" for n in range(4)]
    assert sum(s.pongs for s in streams) >= 2 * len(streams) - 2
    assert all(s.closed_because is None for s in streams)
    assert KEY not in "\n".join(
        f"{r.getMessage()} {r.__dict__!r}"
        for r in caplog.records
        if not r.name.startswith("websockets.server")
    )


async def test_heartbeats_keep_a_stream_open_and_a_quiet_one_is_left_and_resumed():
    feed = TicklineFeed(api_key=KEY, account=ACCOUNT, quiet_after=5, heartbeat_timeout=0.5)
    secrets = Secrets(api_key=KEY, account=ACCOUNT)
    handler, store = Recorder(), FakeStore()
    async with serving(feed) as url:
        runner = tickline_runner(
            url, secrets, handler, store, heartbeat_seconds=0.1, quiet_seconds=0.6
        )
        task = run(runner)
        await wait_for(lambda: len(feed.streams) >= 3 and len(handler.finished) >= 15, 15)
        runner.stop()
        await asyncio.wait_for(task, 5)
    first = feed.streams[0]
    # Quiet for 0.6 s while the heartbeats (every 0.1 s, the feed wants one per 0.5 s)
    # kept it open: the plug-in left it, the worker connected again and resumed.
    assert first.closed_because is None
    assert first.heartbeats >= 5
    assert feed.streams[1].subscribe == "SUB acme quotes 6"
    assert seqs(handler, "acme-quotes")[:15] == list(range(1, 16))
    assert runner.health.reconnects >= 2


async def test_without_heartbeats_the_feed_closes_the_stream():
    """The fake holds clients to the heartbeat rule (what the plug-in's hook is for)."""
    feed = TicklineFeed(api_key=KEY, account=ACCOUNT, heartbeat_timeout=0.3)
    async with serving(feed) as url:
        stream = json.loads(await _session(url, KEY))["stream"]
        async with connect(url.replace("/tickline", stream)) as ws:
            await ws.send(f"SUB {ACCOUNT} quotes 1")
            with pytest.raises(ConnectionClosed) as closed:
                await asyncio.wait_for(_read_until_closed(ws), 5)
    assert closed.value.rcvd is not None
    assert closed.value.rcvd.code == NO_HEARTBEAT
    assert feed.streams[0].closed_because == "no heartbeat"


async def test_a_refused_session_fails_each_attempt_until_the_connection_parks():
    feed = TicklineFeed(api_key=KEY, account=ACCOUNT)
    secrets = Secrets(api_key="tk-wrong", account=ACCOUNT)
    handler, store = Recorder(), FakeStore()
    async with serving(feed) as url:
        runner = tickline_runner(url, secrets, handler, store)
        outcome = await asyncio.wait_for(run(runner), 10)
    assert outcome.ending is Ending.PARKED
    assert runner.parked_reason == "no message handled for 1 s: session refused: HTTP 401"
    assert feed.refused_sessions >= 2
    assert feed.streams == []


async def _read_until_closed(ws: ClientConnection) -> None:
    while True:
        await ws.recv()


async def _session(url: str, key: str) -> str:
    host, port = url.removeprefix("ws://").split("/")[0].split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(f"GET /session HTTP/1.1\r\nHost: {host}\r\nX-Api-Key: {key}\r\n\r\n".encode())
    await writer.drain()
    head = await reader.readuntil(b"\r\n\r\n")
    length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
    body = await reader.readexactly(length)
    writer.close()
    return body.decode()
