"""Connection runners of one worker (one ConnectionSettings, as a worker shares it)
speaking registered plug-in protocols and built-in specs side by side, against small
upstreams on loopback: a name this worker does not have parks, a plug-in that refuses
its options parks only its own connection, and ``resolve_url`` runs before each
connect, its failures failing the attempt like a failed connect."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Mapping
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from websockets.asyncio.server import ServerConnection

from examples.tickline.fake_feed import TicklineFeed
from examples.tickline.fake_feed import serving as serving_tickline
from examples.tickline.protocol import factory as tickline_factory
from tests.unit.test_connection_runner import (
    TIMING,
    FakeStore,
    Recorder,
    runner_settings,
    wait_for,
)
from tests.unit.test_runner_upstreams import REF, Secrets, Upstream, run, serving
from worker.connection import ConnectionRunner
from worker.connection_settings import ConnectionSettings
from worker.connection_state import Ending
from worker.credentials import SecretCache
from worker.protocol_plugins import ProtocolPlugins
from worker.upstream_protocol import JsonSeqProtocol, Message, ResolveUrlError, Unreadable
from wsfleet.lease_rules import Lease
from wsfleet.protocol_specs import parse_spec

pytestmark = pytest.mark.timeout(30)

EPOCH = 4
API_KEY = "tk-value-that-must-never-be-logged"


class Resolving:
    """A plug-in that asks for its URL before each connect (as a service that hands
    out stream URLs would): json-seq frames, the URL's ``ticket`` numbered per call."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int, dict[str, Any]]] = []
        self.fail: BaseException | None = None
        self.delay = 0.0

    def resume_url(self, ws_url: str, last_seq: int) -> str:
        return JsonSeqProtocol().resume_url(ws_url, last_seq)

    async def resolve_url(self, ws_url: str, last_seq: int, secret: Mapping[str, Any]) -> str:
        self.calls.append((ws_url, last_seq, dict(secret)))
        await asyncio.sleep(self.delay)
        if self.fail is not None:
            raise self.fail
        return f"{ws_url}&ticket={len(self.calls)}"

    def decode(self, data: str | bytes) -> Message | Unreadable:
        frame = JsonSeqProtocol().decode(data)
        assert isinstance(frame, Message | Unreadable)
        return frame


def shared_settings(
    handler: Recorder, store: FakeStore, plugins: ProtocolPlugins, **overrides: Any
) -> ConnectionSettings:
    """What every connection of one worker shares."""
    return runner_settings(store, handler, plugins=plugins, **overrides)


def runner(
    settings: ConnectionSettings,
    connection_id: str,
    url: str,
    protocol: dict[str, Any] | None,
    *,
    secret: str | None = None,
) -> ConnectionRunner:
    """A runner of ``connection_id``, whose item stores ``protocol`` as the router
    wrote it."""
    stored = (
        None if protocol is None else parse_spec(protocol, plugins=settings.plugins.names).to_item()
    )
    lease = Lease(
        connection_id,
        "w-test",
        EPOCH,
        1,
        url,
        0,
        session_gen=1,
        protocol=stored,
        auth_secret=secret,
    )
    loop = asyncio.get_running_loop()
    return ConnectionRunner(settings, lease, loop.time() + TIMING.fence_after)


def seqs(handler: Recorder, connection_id: str) -> list[int]:
    return [d.seq for d in handler.deliveries if d.connection_id == connection_id]


TICKLINE = {"name": "tickline", "options": {"channel": "quotes", "heartbeat_seconds": 0.2}}
FIELD = {"name": "json-field", "options": {"sequence": "/n", "payload": "/v", "resume": "none"}}


async def test_one_worker_runs_a_plugin_connection_and_a_built_in_one_side_by_side():
    tickline = TicklineFeed(api_key=API_KEY, account="acme", close_after=6)
    plain = Upstream(message=lambda n: json.dumps({"n": n, "v": n * 10}))
    secrets = Secrets(api_key=API_KEY, account="acme")
    handler, store = Recorder(), FakeStore()
    settings = shared_settings(
        handler,
        store,
        ProtocolPlugins({"tickline": tickline_factory}),
        secrets=SecretCache(secrets.read, ttl=300),
    )
    async with serving_tickline(tickline) as tickline_url, serving(plain):
        ticks = runner(settings, "ticks", tickline_url, TICKLINE, secret=REF)
        fields = runner(settings, "fields", plain.url, FIELD)
        tasks = [run(ticks), run(fields)]
        await wait_for(
            lambda: len(seqs(handler, "ticks")) >= 15 and len(seqs(handler, "fields")) >= 15, 15
        )
        ticks.stop()
        fields.stop()
        outcomes = await asyncio.wait_for(asyncio.gather(*tasks), 5)
    assert [o.ending for o in outcomes] == [Ending.SHUTDOWN, Ending.SHUTDOWN]
    assert store.parks == []
    # Each in order, nothing twice: the plug-in resumed across the feed's closes.
    for connection_id in ("ticks", "fields"):
        got = seqs(handler, connection_id)
        assert got == list(range(1, len(got) + 1))
    payloads = {d.connection_id: d.payload for d in handler.deliveries if d.seq == 3}
    assert payloads["fields"] == 30
    assert payloads["ticks"]["channel"] == "quotes"
    assert len(tickline.streams) >= 3
    assert tickline.refused_tickets == 0
    assert tickline.sessions == len(tickline.streams)  # one session call per connect


async def test_a_protocol_this_worker_does_not_have_parks_with_a_reason():
    upstream = Upstream()
    handler, store = Recorder(), FakeStore()
    async with serving(upstream):
        # The router (another deployment's) knew acme-feed; this worker has tickline.
        settings = shared_settings(handler, store, ProtocolPlugins({"tickline": tickline_factory}))
        lease_spec = json.dumps({"name": "acme-feed", "options": {"channel": "q"}})
        lease = Lease("c1", "w-test", EPOCH, 1, upstream.url, 0, session_gen=1, protocol=lease_spec)
        loop = asyncio.get_running_loop()
        parked = ConnectionRunner(settings, lease, loop.time() + TIMING.fence_after)
        outcome = await asyncio.wait_for(run(parked), 5)
    assert outcome.ending is Ending.PARKED
    assert store.parks == [
        (
            EPOCH,
            0,
            "protocol 'acme-feed' is not registered on this worker "
            "(it has json-seq, json-field, live, tickline)",
        )
    ]
    assert upstream.connections == []


async def test_a_plugin_that_refuses_its_options_parks_only_that_connection():
    tickline = TicklineFeed(api_key=API_KEY, account="acme")
    secrets = Secrets(api_key=API_KEY, account="acme")
    handler, store = Recorder(), FakeStore()
    settings = shared_settings(
        handler,
        store,
        ProtocolPlugins({"tickline": tickline_factory}),
        secrets=SecretCache(secrets.read, ttl=300),
    )
    refused = {"name": "tickline", "options": {"channel": "", "heartbeat_seconds": 0.2}}
    async with serving_tickline(tickline) as url:
        good = runner(settings, "good", url, TICKLINE, secret=REF)
        bad = runner(settings, "bad", url, refused, secret=REF)
        good_task, bad_task = run(good), run(bad)
        outcome = await asyncio.wait_for(bad_task, 5)
        await wait_for(lambda: len(seqs(handler, "good")) >= 10, 10)
        assert not good_task.done()
        good.stop()
        await asyncio.wait_for(good_task, 5)
    assert outcome.ending is Ending.PARKED
    assert bad.parked_reason == (
        "protocol 'tickline' refused its options: ValueError: channel must be a non-empty "
        "string without spaces"
    )
    assert [reason for _, _, reason in store.parks] == [bad.parked_reason]
    assert seqs(handler, "bad") == []
    assert len(tickline.streams) == 1  # the refused one never connected


def resolving_settings(plugin: Resolving, **overrides: Any) -> tuple[ConnectionSettings, Recorder]:
    handler = Recorder()
    settings = shared_settings(
        handler,
        FakeStore(),
        ProtocolPlugins({"resolving": lambda: plugin}),
        secrets=SecretCache(Secrets(api_key=API_KEY).read, ttl=300),
        **overrides,
    )
    return settings, handler


@dataclasses.dataclass
class QueryResumed(Upstream):
    """Resumes from the URL's ``from_seq``, as the json-seq demo feed does."""

    async def handler(self, ws: ServerConnection) -> None:
        assert ws.request is not None
        start = int(parse_qs(urlsplit(ws.request.path).query)["from_seq"][0])
        self.numbering = lambda _, sent: start + sent  # one connection at a time
        await super().handler(ws)


async def test_resolve_url_runs_before_each_connect_with_the_checkpoint_and_the_secret():
    plugin = Resolving()
    upstream = QueryResumed(close_after=4)
    settings, handler = resolving_settings(plugin)
    async with serving(upstream):
        connection = runner(settings, "c1", upstream.url, {"name": "resolving"}, secret=REF)
        task = run(connection)
        await wait_for(lambda: len(handler.finished) >= 12, 10)
        connection.stop()
        await asyncio.wait_for(task, 5)
    assert handler.finished == list(range(1, len(handler.finished) + 1))
    connects = upstream.connections
    assert len(connects) >= 3
    # Every connect went to the URL the plug-in gave for it, asked for just before.
    assert [parse_qs(urlsplit(seen.path).query)["ticket"] for seen in connects] == [
        [str(n)] for n in range(1, len(connects) + 1)
    ]
    for number, (ws_url, last_seq, secret) in enumerate(plugin.calls[: len(connects)]):
        assert last_seq == 4 * number
        assert ws_url == JsonSeqProtocol().resume_url(upstream.url, last_seq)
        assert secret == {"api_key": API_KEY}


@pytest.mark.parametrize(
    ("fail", "delay", "reason"),
    [
        (RuntimeError("https://user:pw@host/x refused"), 0.0, "resolve_url failed: RuntimeError"),
        (ResolveUrlError("session refused: HTTP 401"), 0.0, "session refused: HTTP 401"),
        (None, 5.0, "resolve_url timed out"),
    ],
    ids=["raises", "own reason", "too slow"],
)
async def test_a_failed_resolve_url_fails_the_attempt_like_a_failed_connect(fail, delay, reason):
    plugin = Resolving()
    plugin.fail, plugin.delay = fail, delay
    upstream = Upstream()
    settings, _ = resolving_settings(plugin, fail_after=0.6, open_timeout=0.2)
    async with serving(upstream):
        connection = runner(settings, "c1", upstream.url, {"name": "resolving"}, secret=REF)
        outcome = await asyncio.wait_for(run(connection), 10)
    assert outcome.ending is Ending.PARKED
    assert connection.parked_reason == f"no message handled for 0.6 s: {reason}"
    assert connection.health.last_error == reason
    assert len(plugin.calls) >= 2  # retried with backoff, as a connect is
    assert upstream.connections == []
