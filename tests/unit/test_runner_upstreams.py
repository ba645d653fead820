"""One connection runner against small upstreams served in the test, on loopback:
the connection's own protocol (subscribe frames, json-field, live), credentials read
from a secret at connect time (headers, query parameters, a re-read after a 401), the
gap of a stream that cannot resume, and what parks. No secret value may show in a log
line, a reason or an error."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import json
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from websockets.asyncio.server import ServerConnection, serve
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request, Response

from tests.unit.test_connection_runner import (
    TIMING,
    FakeStore,
    Recorder,
    new_metrics,
    runner_settings,
    wait_for,
)
from worker.connection import ConnectionRunner, Outcome
from worker.connection_state import Ending
from worker.credentials import SecretCache, SecretError
from wsfleet import metric_names as m
from wsfleet.lease_rules import Lease
from wsfleet.protocol_specs import parse_spec

pytestmark = pytest.mark.timeout(30)

REF = "websocket-fleet/feed"
KEY = "k3y-value-that-must-never-be-logged"
NEW_KEY = "n3w-k3y-value-that-must-never-be-logged"
TOKEN = "t0ken-value-that-must-never-be-logged"
EPOCH = 4


@dataclass
class Seen:
    """One upstream connection as the server saw it."""

    path: str
    headers: dict[str, str]
    frames: list[str] = field(default_factory=list)
    sent: int = 0
    """Messages sent on it; all of them after its subscribe frame, if it needs one."""


@dataclass
class Upstream:
    """A small upstream: optionally requires ``X-Key`` (else HTTP 401) and a subscribe
    frame before it streams; ``message(n)`` is the text of its ``n``-th message
    (numbered from the subscribe frame's ``from_seq``, or 1); closes each connection
    after ``close_after`` messages."""

    message: Callable[[int], str | bytes] = lambda n: json.dumps({"seq": n})
    key: str | None = None
    subscribe: bool = False
    close_after: int | None = None
    numbering: Callable[[int, int], int] = lambda start, sent: start + sent
    """The number of the message after ``sent`` on a connection starting at ``start``."""
    connections: list[Seen] = field(default_factory=list)
    refusals: int = 0
    url: str = ""

    def process_request(self, connection: ServerConnection, request: Request) -> Response | None:
        if self.key is not None and request.headers.get("X-Key") != self.key:
            self.refusals += 1
            return connection.respond(401, "X-Key missing or wrong\n")
        return None

    async def handler(self, ws: ServerConnection) -> None:
        assert ws.request is not None
        seen = Seen(ws.request.path, dict(ws.request.headers.raw_items()))
        self.connections.append(seen)
        with contextlib.suppress(ConnectionClosed):
            start = 1
            if self.subscribe:
                frame = await asyncio.wait_for(ws.recv(), 5)
                assert isinstance(frame, str)
                seen.frames.append(frame)
                start = json.loads(frame).get("from_seq", 1)
            while self.close_after is None or seen.sent < self.close_after:
                await ws.send(self.message(self.numbering(start, seen.sent)))
                seen.sent += 1
                await asyncio.sleep(0.005)
            await ws.close()


@contextlib.asynccontextmanager
async def serving(upstream: Upstream) -> AsyncIterator[Upstream]:
    server = await serve(upstream.handler, "127.0.0.1", 0, process_request=upstream.process_request)
    port = server.sockets[0].getsockname()[1]
    upstream.url = f"ws://127.0.0.1:{port}/feed?a=1"
    try:
        yield upstream
    finally:
        server.close()
        await server.wait_closed()


class Secrets:
    """What Secrets Manager holds, by reference (a read counts)."""

    def __init__(self, **values: Any) -> None:
        self.values = {REF: json.dumps(values)} if values else {}
        self.reads = 0
        self._lock = threading.Lock()

    def read(self, reference: str) -> str | None:
        with self._lock:
            self.reads += 1
        if reference not in self.values:
            raise SecretError(reference, "secret not readable: ResourceNotFoundException")
        return self.values[reference]


def runner_for(
    store: FakeStore,
    handler: Recorder,
    url: str,
    *,
    protocol: dict[str, Any] | str | None = None,
    secret: str | None = None,
    secrets: Secrets | None = None,
    last_seq: int = 0,
    advanced_at_ms: int | None = None,
    **overrides: Any,
) -> ConnectionRunner:
    stored = protocol if isinstance(protocol, str) or protocol is None else None
    if isinstance(protocol, dict):
        stored = parse_spec(protocol).to_item()
    secret_cache = None if secrets is None else SecretCache(secrets.read, ttl=300)
    settings = runner_settings(store, handler, **{"secrets": secret_cache, **overrides})
    lease = Lease(
        "c1",
        "w-test",
        EPOCH,
        1,
        url,
        last_seq,
        session_gen=1,
        protocol=stored,
        auth_secret=secret,
        advanced_at_ms=advanced_at_ms,
    )
    loop = asyncio.get_running_loop()
    return ConnectionRunner(settings, lease, loop.time() + TIMING.fence_after)


def run(runner: ConnectionRunner) -> asyncio.Task[Outcome]:
    """Run with a stand-in for the session keeper: a renew every heartbeat."""
    task = asyncio.create_task(runner.run())

    async def keep() -> None:
        loop = asyncio.get_running_loop()
        while not task.done():
            await asyncio.sleep(TIMING.heartbeat)
            runner.session_renewed(loop.time())

    keeper = asyncio.create_task(keep())
    task.add_done_callback(lambda _: keeper.cancel())
    return task


def assert_no_value_in(text: str) -> None:
    for value in (KEY, NEW_KEY, TOKEN):
        assert value not in text


def logged(caplog: pytest.LogCaptureFixture) -> str:
    """Every record the worker's side logged (the upstream here is the test's own server,
    whose debug log shows what it received), with all its fields, as a formatter would
    see them; the client's handshake logger included, at DEBUG."""
    return "\n".join(
        f"{r.getMessage()} {r.__dict__!r}"
        for r in caplog.records
        if not r.name.startswith("websockets.server")
    )


# --- credentials ---------------------------------------------------------------------------


async def test_headers_and_query_come_from_the_secret_and_the_subscribe_frame_goes_first(
    caplog,
):
    caplog.set_level(logging.DEBUG)
    secrets = Secrets(headers={"X-Key": KEY}, query={"token": TOKEN}, account="acc-7")
    upstream = Upstream(
        key=KEY,
        subscribe=True,
        close_after=5,
        message=lambda n: json.dumps({"meta": {"n": n}, "v": n * 10}),
    )
    protocol = {
        "name": "json-field",
        "options": {
            "sequence": "/meta/n",
            "payload": "/v",
            "resume": "subscribe",
            "subscribe": {
                "op": "subscribe",
                "from_seq": "${from_seq}",
                "acct": "${secret:account}",
            },
        },
    }
    async with serving(upstream):
        store, handler = FakeStore(), Recorder()
        runner = runner_for(
            store, handler, upstream.url, protocol=protocol, secret=REF, secrets=secrets
        )
        task = run(runner)
        await wait_for(lambda: len(handler.finished) >= 12, 10)
        runner.stop()
        outcome = await asyncio.wait_for(task, 5)
    assert outcome.ending is Ending.SHUTDOWN
    # Every message once, in order, its payload the value at /v: the subscribe frame
    # of each connection asked for what came after the checkpoint.
    assert handler.finished == list(range(1, len(handler.finished) + 1))
    assert [d.payload for d in handler.deliveries] == [n * 10 for n in handler.finished]
    assert len(upstream.connections) >= 3
    for number, seen in enumerate(upstream.connections):
        assert seen.headers["X-Key"] == KEY
        query = parse_qs(urlsplit(seen.path).query)
        assert query == {"a": ["1"], "token": [TOKEN]}  # the stored URL plus the secret's
        (frame,) = seen.frames  # exactly one, before anything was sent
        assert json.loads(frame) == {"op": "subscribe", "from_seq": 5 * number + 1, "acct": "acc-7"}
    assert secrets.reads == 1  # cached across reconnects
    assert_no_value_in(logged(caplog))


async def test_a_refused_handshake_reads_the_secret_again_and_retries_at_once(caplog):
    caplog.set_level(logging.DEBUG)
    secrets = Secrets(headers={"X-Key": KEY})
    upstream = Upstream(key=KEY)
    async with serving(upstream):
        store, handler = FakeStore(), Recorder()
        runner = runner_for(store, handler, upstream.url, secret=REF, secrets=secrets)
        cache = runner._s.secrets
        assert cache is not None
        await cache.get(REF)  # the value other connections had read before the rotation
        secrets.values[REF] = json.dumps({"headers": {"X-Key": NEW_KEY}})
        upstream.key = NEW_KEY
        task = run(runner)
        await wait_for(lambda: len(handler.finished) >= 3, 5)
        runner.stop()
        await asyncio.wait_for(task, 5)
    assert upstream.refusals == 1
    assert [seen.headers["X-Key"] for seen in upstream.connections] == [NEW_KEY]
    assert secrets.reads == 2
    assert runner.health.reconnects == 0  # the retry was part of the same attempt
    refused = [r for r in caplog.records if "reading the secret again" in r.getMessage()]
    assert [(r.secret, r.status) for r in refused] == [(REF, 401)]  # type: ignore[attr-defined]
    assert_no_value_in(logged(caplog))


async def test_refused_again_with_the_fresh_value_parks_as_a_permanent_refusal(caplog):
    caplog.set_level(logging.DEBUG)
    secrets = Secrets(headers={"X-Key": KEY})
    upstream = Upstream(key=NEW_KEY)  # rotated upstream side only
    async with serving(upstream):
        store, handler = FakeStore(), Recorder()
        runner = runner_for(store, handler, upstream.url, secret=REF, secrets=secrets)
        outcome = await asyncio.wait_for(run(runner), 5)
    assert outcome.ending is Ending.PARKED
    assert store.parks == [(EPOCH, 0, "HTTP 401 from upstream")]
    assert upstream.refusals == 2
    assert secrets.reads == 2
    assert handler.finished == []
    assert_no_value_in(logged(caplog))


@pytest.mark.parametrize(
    ("values", "reason"),
    [
        (None, "secret not readable: ResourceNotFoundException"),
        (KEY, "secret is not a JSON object with headers/query"),
        (
            json.dumps({"headers": {"X-Key": [KEY]}}),
            "secret is not a JSON object with headers/query",
        ),
    ],
    ids=["missing", "not JSON", "not strings"],
)
async def test_a_secret_that_cannot_be_used_fails_attempts_until_the_connection_parks(
    caplog, values, reason
):
    caplog.set_level(logging.DEBUG)
    secrets = Secrets()
    if values is not None:
        secrets.values[REF] = values
    upstream = Upstream()
    async with serving(upstream):
        store, handler = FakeStore(), Recorder()
        runner = runner_for(
            store, handler, upstream.url, secret=REF, secrets=secrets, fail_after=0.6
        )
        outcome = await asyncio.wait_for(run(runner), 10)
    assert outcome.ending is Ending.PARKED
    ((_, _, parked),) = store.parks
    assert parked == f"no message handled for 0.6 s: {reason}"
    assert runner.health.last_error == reason
    assert secrets.reads >= 2  # retried with backoff, read again each time
    assert upstream.connections == []  # never connected without its credentials
    failed = [r for r in caplog.records if r.getMessage() == "upstream connection failed"]
    assert failed
    assert all(r.error == reason for r in failed)
    assert_no_value_in(logged(caplog) + parked)


async def test_a_connection_naming_a_secret_without_a_secret_store_cannot_connect():
    upstream = Upstream()
    async with serving(upstream):
        store, handler = FakeStore(), Recorder()
        runner = runner_for(store, handler, upstream.url, secret=REF, fail_after=0.3)
        outcome = await asyncio.wait_for(run(runner), 10)
    assert outcome.ending is Ending.PARKED
    assert store.parks[0][2].endswith("no secret store configured")


async def test_a_missing_secret_field_for_the_subscribe_frame_fails_the_attempt():
    secrets = Secrets(headers={})
    upstream = Upstream(subscribe=True)
    protocol = {"name": "live", "options": {"subscribe": {"key": "${secret:api_key}"}}}
    async with serving(upstream):
        store, handler = FakeStore(), Recorder()
        runner = runner_for(
            store,
            handler,
            upstream.url,
            protocol=protocol,
            secret=REF,
            secrets=secrets,
            fail_after=0.3,
        )
        outcome = await asyncio.wait_for(run(runner), 10)
    assert outcome.ending is Ending.PARKED
    assert store.parks[0][2].endswith(
        "the subscribe frame names secret field 'api_key', which the connection's secret "
        "does not have"
    )
    assert upstream.connections == []


# --- the connection's own protocol ------------------------------------------------------


async def test_a_stored_protocol_that_does_not_validate_parks_at_once():
    upstream = Upstream()
    async with serving(upstream):
        store, handler = FakeStore(), Recorder()
        runner = runner_for(
            store, handler, upstream.url, protocol='{"name":"json-field","options":{}}'
        )
        outcome = await asyncio.wait_for(run(runner), 5)
    assert outcome.ending is Ending.PARKED
    ((_, _, reason),) = store.parks
    assert reason == 'invalid protocol: json-field options: "sequence" (a JSON pointer) is required'
    assert upstream.connections == []


async def test_a_live_stream_numbers_on_across_reconnects_and_measures_each_gap():
    upstream = Upstream(message=lambda n: json.dumps({"tick": n}), close_after=4)
    async with serving(upstream):
        store, handler = FakeStore(), Recorder()
        metrics = new_metrics()
        runner = runner_for(
            store, handler, upstream.url, protocol={"name": "live"}, metrics=metrics
        )
        task = run(runner)
        await wait_for(lambda: len(handler.finished) >= 10, 10)
        runner.stop()
        outcome = await asyncio.wait_for(task, 5)
    # Local numbers, contiguous across the reconnects; each connection starts afresh
    # upstream (nothing resumes: its URL is the stored one).
    assert handler.finished == list(range(1, len(handler.finished) + 1))
    assert [d.payload for d in handler.deliveries[:8]] == [{"tick": n} for n in (1, 2, 3, 4) * 2]
    assert all(seen.path == "/feed?a=1" for seen in upstream.connections)
    # One gap per reconnect (none for the hold's first connection: nothing came before),
    # each the time from the last delivery to the first one after it (a backoff of
    # about 0.25 s plus the connect).
    reconnects = len(upstream.connections) - 1
    assert metrics.snapshot()[m.UPSTREAM_GAPS] == reconnects >= 2
    gaps = metrics._upstream_gaps
    assert len(gaps) == reconnects
    assert all(100 <= gap < 2000 for gap in gaps), gaps
    # The release leaves when the stream last moved, for the next owner's gap.
    assert outcome.released
    (advanced,) = store.advanced
    assert advanced is not None
    assert abs(advanced - time.time() * 1000) < 3000


async def test_a_new_owner_of_a_live_stream_measures_the_gap_since_the_previous_owner():
    upstream = Upstream(message=lambda n: json.dumps({"tick": n}))
    previous = time.time_ns() // 1_000_000 - 4_000
    async with serving(upstream):
        store, handler = FakeStore(), Recorder()
        metrics = new_metrics()
        runner = runner_for(
            store,
            handler,
            upstream.url,
            protocol={"name": "live"},
            metrics=metrics,
            last_seq=70,
            advanced_at_ms=previous,
        )
        task = run(runner)
        await wait_for(lambda: len(handler.finished) >= 3, 5)
        runner.stop()
        await asyncio.wait_for(task, 5)
    assert handler.finished[:3] == [71, 72, 73]  # the numbering goes on
    assert metrics.snapshot()[m.UPSTREAM_GAPS] == 1
    (gap,) = metrics._upstream_gaps
    assert 4_000 <= gap < 6_000


async def test_a_resumable_stream_measures_no_gap_and_leaves_no_advance():
    upstream = Upstream(close_after=3)
    async with serving(upstream):
        store, handler = FakeStore(), Recorder()
        metrics = new_metrics()
        runner = runner_for(
            store, handler, upstream.url, metrics=metrics, advanced_at_ms=1, last_seq=0
        )
        task = run(runner)
        await wait_for(lambda: len(upstream.connections) >= 3, 5)
        runner.stop()
        await asyncio.wait_for(task, 5)
    assert metrics.snapshot()[m.UPSTREAM_GAPS] == 0
    assert store.advanced == [None]


async def test_json_field_without_resume_goes_on_from_where_the_upstream_is():
    # Each connection of this upstream starts 100 further on: nothing can resume.
    upstream = Upstream(
        message=lambda n: json.dumps({"n": n}),
        close_after=3,
        numbering=lambda start, sent: 100 * len(upstream.connections) + sent,
    )
    async with serving(upstream):
        store, handler = FakeStore(), Recorder()
        metrics = new_metrics()
        protocol = {"name": "json-field", "options": {"sequence": "/n"}}
        runner = runner_for(store, handler, upstream.url, protocol=protocol, metrics=metrics)
        task = run(runner)
        await wait_for(lambda: len(handler.finished) >= 9, 10)
        runner.stop()
        await asyncio.wait_for(task, 5)
    assert handler.finished[:9] == [100, 101, 102, 200, 201, 202, 300, 301, 302]
    assert all(seen.path == "/feed?a=1" for seen in upstream.connections)
    assert metrics.snapshot()[m.UPSTREAM_GAPS] >= 2


async def test_json_field_resumes_through_its_url_parameter():
    upstream = Upstream(
        message=lambda n: json.dumps({"n": n}),
        close_after=3,
        numbering=lambda start, sent: _after(upstream) + sent,
    )
    async with serving(upstream):
        store, handler = FakeStore(), Recorder()
        protocol = {
            "name": "json-field",
            "options": {"sequence": "/n", "resume": "query", "resume_param": "after"},
        }
        runner = runner_for(store, handler, upstream.url, protocol=protocol)
        task = run(runner)
        await wait_for(lambda: len(handler.finished) >= 9, 10)
        runner.stop()
        await asyncio.wait_for(task, 5)
    assert handler.finished == list(range(1, len(handler.finished) + 1))
    assert [parse_qs(urlsplit(s.path).query)["after"] for s in upstream.connections[:3]] == [
        ["1"],
        ["4"],
        ["7"],
    ]


def _after(upstream: Upstream) -> int:
    return int(parse_qs(urlsplit(upstream.connections[-1].path).query)["after"][0])


async def test_failures_of_a_connection_with_a_secret_are_logged_without_the_url(caplog):
    caplog.set_level(logging.DEBUG)
    secrets = Secrets(query={"token": TOKEN})
    store, handler = FakeStore(), Recorder()
    # Nothing listens there: every attempt fails.
    runner = runner_for(
        store, handler, "ws://127.0.0.1:9/feed", secret=REF, secrets=secrets, fail_after=0.3
    )
    outcome = await asyncio.wait_for(run(runner), 10)
    assert outcome.ending is Ending.PARKED
    failed = [r for r in caplog.records if r.getMessage() == "upstream connection failed"]
    assert failed
    assert {r.error for r in failed} == {"connection refused"}  # type: ignore[attr-defined]
    assert_no_value_in(logged(caplog))


async def test_a_stream_that_cannot_resume_drops_repeats_inside_a_batch():
    """A batch handler on a stream that cannot resume: a gap is delivered past, but a
    number the batch being gathered already holds is a repeat, dropped like any other
    (each number handled once, in order)."""
    numbers = [n for k in range(1, 61) for n in ((k, k - 2) if k % 5 == 0 else (k,))]
    upstream = Upstream(
        message=lambda n: json.dumps({"n": n}),
        close_after=len(numbers),
        numbering=lambda start, sent: numbers[sent],
    )

    class Batches:
        def __init__(self) -> None:
            self.batches: list[list[int]] = []

        async def handle_batch(self, deliveries: Any) -> None:
            self.batches.append([d.seq for d in deliveries])
            await asyncio.sleep(0.05)  # messages pile up behind each call

    async with serving(upstream):
        store, handler = FakeStore(), Batches()
        protocol = {"name": "json-field", "options": {"sequence": "/n"}}
        runner = runner_for(store, handler, upstream.url, protocol=protocol)  # type: ignore[arg-type]
        task = run(runner)
        await wait_for(lambda: sum(map(len, handler.batches)) >= 60, 10)
        runner.stop()
        await asyncio.wait_for(task, 5)
    handled = [seq for batch in handler.batches for seq in batch]
    assert handled[:60] == list(range(1, 61))
    assert any(len(batch) > 3 for batch in handler.batches)  # repeats fell inside batches


def gzipped(n: int) -> bytes:
    """A message as a gzip binary frame; the 5th a bomb (16 MiB of zeros, 16 KiB
    compressed), the 8th not gzip at all."""
    if n == 5:
        return gzip.compress(b"0" * (16 << 20))
    if n == 8:
        return b"\x1f\x8bnot gzip"
    return gzip.compress(json.dumps({"seq": n, "text": "x" * 500}).encode())


async def test_gzip_frames_are_inflated_and_a_bomb_costs_only_itself():
    """An upstream whose every message is a gzip binary frame: with ``inflate`` each
    is read as its JSON; a frame that inflates past MAX_MESSAGE_BYTES, and one that is
    not gzip, are refused, counted, and the stream goes on. Without ``inflate`` not
    one message was delivered."""
    upstream = Upstream(message=gzipped, close_after=10)
    async with serving(upstream):
        store, handler = FakeStore(), Recorder()
        metrics = new_metrics()
        protocol = {"name": "json-field", "options": {"sequence": "/seq", "inflate": "gzip"}}
        runner = runner_for(
            store,
            handler,
            upstream.url,
            protocol=protocol,
            metrics=metrics,
            max_message_bytes=1 << 20,
        )
        task = run(runner)
        await wait_for(lambda: len(handler.finished) >= 8, 10)
        runner.stop()
        await asyncio.wait_for(task, 5)
    assert handler.finished[:8] == [1, 2, 3, 4, 6, 7, 9, 10]
    assert handler.deliveries[0].payload == {"seq": 1, "text": "x" * 500}
    assert metrics.snapshot()[m.UNREADABLE_FRAMES] == 2


async def test_without_inflate_a_gzip_stream_delivers_nothing_and_counts_every_frame():
    upstream = Upstream(message=gzipped, close_after=4)
    async with serving(upstream):
        store, handler = FakeStore(), Recorder()
        metrics = new_metrics()
        protocol = {"name": "json-field", "options": {"sequence": "/seq"}}
        runner = runner_for(store, handler, upstream.url, protocol=protocol, metrics=metrics)
        task = run(runner)
        await wait_for(lambda: metrics.snapshot()[m.UNREADABLE_FRAMES] >= 4, 10)
        runner.stop()
        await asyncio.wait_for(task, 5)
    assert handler.finished == []
