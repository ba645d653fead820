"""Application-level keepalives and answers (the spec's ``keepalive`` and ``answers``)
against upstreams on loopback that close the socket when the client breaks their
rule: each held with no close, every message delivered, and the same upstream without
the option seen to close."""

from __future__ import annotations

import asyncio
import json
import re
import time
from typing import Any

import pytest

from tests.support.rule_upstreams import RuleUpstream, serving
from tests.unit.test_connection_runner import FakeStore, Recorder, wait_for
from tests.unit.test_runner_upstreams import run, runner_for
from worker.app_rules import AppRules, Control, Due, KeepaliveClock
from wsfleet.protocol_specs import InvalidProtocolError, parse_spec

pytestmark = pytest.mark.timeout(30)


async def held_for(upstream: RuleUpstream, protocol: dict[str, Any], seconds: float) -> Recorder:
    """Run one connection against ``upstream`` for ``seconds`` (loop time), stop it,
    and give back what the handler got."""
    async with serving(upstream):
        handler = Recorder()
        runner = runner_for(FakeStore(), handler, upstream.url, protocol=protocol)
        task = run(runner)
        loop = asyncio.get_running_loop()
        until = loop.time() + seconds
        await wait_for(lambda: loop.time() >= until, seconds + 5)
        runner.stop()
        await asyncio.wait_for(task, 5)
    return handler


def assert_in_order_from_one(handler: Recorder) -> None:
    assert handler.finished
    assert handler.finished == list(range(1, len(handler.finished) + 1))


QUIET = {"message_every": 1.0, "client_silence": 0.6}
"""A quiet feed that closes a socket whose client sent nothing for 0.6 s."""


async def test_a_feed_that_wants_a_client_frame_is_held_by_an_idle_keepalive():
    keepalive = {
        "name": "json-seq",
        "options": {"keepalive": {"idle_seconds": 0.3, "frame": "ping"}},
    }
    upstream = RuleUpstream(**QUIET)  # type: ignore[arg-type]
    handler = await held_for(upstream, keepalive, 3.5)
    assert upstream.closes == []
    assert upstream.connections == 1
    assert "ping" in upstream.client_frames
    assert_in_order_from_one(handler)


async def test_without_the_keepalive_that_feed_closes_the_socket():
    upstream = RuleUpstream(**QUIET)  # type: ignore[arg-type]
    await held_for(upstream, {"name": "json-seq"}, 2.5)
    assert "client silent" in upstream.closes


GZIP_PINGS = {"gzip": True, "ping_every": 0.25, "message_every": 0.1}
"""Every frame gzip; a ping every 0.25 s, the socket closed after two unanswered."""
ANSWER_PINGS = {
    "inflate": "gzip",
    "answers": [{"match": {"pointer": "/ping"}, "reply": {"pong": "${frame:/ping}"}}],
}


async def test_gzip_frames_and_server_pings_answered_with_the_echoed_value():
    upstream = RuleUpstream(**GZIP_PINGS)  # type: ignore[arg-type]
    handler = await held_for(upstream, {"name": "json-seq", "options": ANSWER_PINGS}, 3.0)
    assert upstream.closes == []
    assert upstream.pongs_received >= 8
    assert_in_order_from_one(handler)  # the pings are not messages
    assert len(handler.finished) >= 15


async def test_unanswered_server_pings_close_the_socket():
    upstream = RuleUpstream(**GZIP_PINGS)  # type: ignore[arg-type]
    await held_for(upstream, {"name": "json-seq", "options": {"inflate": "gzip"}}, 2.0)
    assert "pings unanswered" in upstream.closes


async def test_a_keepalive_left_unanswered_recycles_the_connection_and_nothing_is_lost():
    upstream = RuleUpstream(message_every=0.1, answer_client_pings=True, answers_left=3)
    keepalive = {
        "every_seconds": 0.3,
        "frame": {"op": "ping"},
        "pong": {"pointer": "/op", "equals": "pong"},
        "timeout_seconds": 0.5,
    }
    handler = await held_for(
        upstream, {"name": "json-seq", "options": {"keepalive": keepalive}}, 3.0
    )
    assert upstream.connections >= 2  # the silent one was left, and another made
    assert_in_order_from_one(handler)  # resumed from the checkpoint: nothing lost


JSON_RPC_HEARTBEAT = {
    "ping_every": 0.25,
    "ping": lambda stamp: {
        "jsonrpc": "2.0",
        "method": "heartbeat",
        "params": {"type": "test_request", "id": stamp},
    },
    "pong_stamp": lambda doc: (
        doc.get("params", {}).get("id")
        if isinstance(doc, dict) and doc.get("method") == "public/test"
        else None
    ),
}
"""A JSON-RPC feed whose heartbeats send test_requests that must be answered with a
call (``public/test``) echoing their id, or the socket is closed."""
ANSWER_TEST_REQUESTS = {
    "answers": [
        {
            "match": {"pointer": "/params/type", "equals": "test_request"},
            "reply": {
                "jsonrpc": "2.0",
                "method": "public/test",
                "params": {"id": "${frame:/params/id}"},
            },
        }
    ]
}


async def test_a_json_rpc_feeds_test_requests_are_answered_with_a_call():
    upstream = RuleUpstream(**JSON_RPC_HEARTBEAT)  # type: ignore[arg-type]
    handler = await held_for(upstream, {"name": "json-seq", "options": ANSWER_TEST_REQUESTS}, 2.5)
    assert upstream.closes == []
    assert upstream.pongs_received >= 6
    assert_in_order_from_one(handler)
    unanswered = RuleUpstream(**JSON_RPC_HEARTBEAT)  # type: ignore[arg-type]
    await held_for(unanswered, {"name": "json-seq"}, 1.5)
    assert "pings unanswered" in unanswered.closes


MEDIA_KEEPALIVE = {
    "ping_every": 0.3,
    "unanswered_limit": 1,
    "ping": lambda stamp: {"event": "keep-alive-request", "nonce": stamp},
    "pong_stamp": lambda doc: (
        doc.get("nonce")
        if isinstance(doc, dict) and doc.get("event") == "keep-alive-response"
        else None
    ),
}
"""A media feed that sends a keep-alive request and terminates the socket if the
previous one got no response by the next."""
ANSWER_KEEPALIVE_REQUESTS = {
    "answers": [
        {
            "match": {"pointer": "/event", "equals": "keep-alive-request"},
            "reply": {"event": "keep-alive-response", "nonce": "${frame:/nonce}"},
        }
    ]
}


async def test_a_media_feeds_keep_alive_requests_are_answered():
    upstream = RuleUpstream(**MEDIA_KEEPALIVE)  # type: ignore[arg-type]
    handler = await held_for(
        upstream, {"name": "json-seq", "options": ANSWER_KEEPALIVE_REQUESTS}, 2.5
    )
    assert upstream.closes == []
    assert upstream.pongs_received >= 5
    assert_in_order_from_one(handler)
    unanswered = RuleUpstream(**MEDIA_KEEPALIVE)  # type: ignore[arg-type]
    await held_for(unanswered, {"name": "json-seq"}, 1.5)
    assert "pings unanswered" in unanswered.closes


# --- the pure parts -------------------------------------------------------------------------


def test_answers_and_the_pong_are_control_frames_and_the_rest_is_not():
    rules = AppRules.from_options(
        {
            "answers": [
                {"match": {"text": "ping"}, "reply": "pong"},
                {
                    "match": {"pointer": "/method", "equals": "test_request"},
                    "reply": {"method": "answer", "id": "${frame:/id}", "at": "${now_ms}"},
                },
            ],
            "keepalive": {"every_seconds": 5, "frame": "hb", "pong": {"pointer": "/hb_ack"}},
        }
    )
    assert rules is not None
    assert rules.classify("ping", 7) == "pong"
    assert json.loads(str(rules.classify('{"method":"test_request","id":42}', 7))) == {
        "method": "answer",
        "id": 42,
        "at": 7,
    }
    assert rules.classify('{"method":"other","id":1}', 7) is None
    assert rules.classify('{"hb_ack":true}', 7) is Control.PONG
    assert rules.classify('{"seq":1,"text":"ping"}', 7) is None
    assert rules.classify(b"\x00not json", 7) is None


def test_the_keepalive_clock_sends_on_idle_and_every_and_recycles_when_unanswered():
    clock = KeepaliveClock(idle=1.0, every=None, timeout=None, now=0.0)
    assert clock.due(0.9) is None
    assert clock.due(1.0) is Due.SEND
    clock.keepalive_sent(1.0)
    clock.sent(1.5)  # an answer went out: the idle time starts again
    assert clock.next_check() == 2.5
    every = KeepaliveClock(idle=None, every=2.0, timeout=1.0, now=0.0)
    assert every.due(2.0) is Due.SEND
    every.keepalive_sent(2.0)
    assert every.due(2.9) is None
    assert every.due(3.0) is Due.RECYCLE
    every.pong()
    assert every.due(3.0) is None
    assert every.next_check() == 4.0


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({"keepalive": {"idle_seconds": 1}}, "frame (the text or JSON value to send) is required"),
        ({"keepalive": {"frame": "p"}}, "idle_seconds or every_seconds is required"),
        ({"keepalive": {"frame": "p", "idle_seconds": 0}}, "idle_seconds must be a number"),
        ({"keepalive": {"frame": "p", "idle_seconds": 1, "timeout_seconds": 1}}, "goes with pong"),
        ({"keepalive": {"frame": "${frame:/x}", "idle_seconds": 1}}, "unknown placeholder"),
        ({"answers": []}, "must be a list of 1 to 8 rules"),
        ({"answers": [{"match": {"text": ""}, "reply": "x"}]}, "text must be a non-empty"),
        ({"answers": [{"match": {"pointer": "p"}, "reply": "x"}]}, "must be a JSON pointer"),
        ({"answers": [{"match": {"pointer": "/p", "equals": [1]}, "reply": "x"}]}, "equals must"),
        ({"answers": [{"match": {"text": "a"}}]}, 'must be {"match": ..., "reply": ...}'),
    ],
)
def test_the_router_refuses_rules_that_cannot_work(options, says):
    with pytest.raises(InvalidProtocolError, match=re.escape(says)):
        parse_spec({"name": "json-seq", "options": options})


async def test_the_last_keepalive_and_its_answer_show_on_the_connections_page_line():
    upstream = RuleUpstream(message_every=0.2, answer_client_pings=True)
    keepalive = {
        "every_seconds": 0.2,
        "frame": {"op": "ping"},
        "pong": {"pointer": "/op", "equals": "pong"},
    }
    async with serving(upstream):
        runner = runner_for(
            FakeStore(),
            Recorder(),
            upstream.url,
            protocol={"name": "json-seq", "options": {"keepalive": keepalive}},
        )
        task = run(runner)
        loop = asyncio.get_running_loop()

        def line() -> Any:
            return runner.page_entry(loop.time(), int(time.time() * 1000))

        assert line().keepalive_sent_ms is None
        await wait_for(lambda: line().keepalive_answered_ms is not None, 10)
        entry = line()
        assert entry.keepalive_sent_ms is not None
        assert entry.keepalive_answered_ms >= entry.keepalive_sent_ms - 5  # the pong came after
        runner.stop()
        await asyncio.wait_for(task, 5)
    # A feed without a keepalive says nothing.
    async with serving(RuleUpstream()) as plain:
        runner = runner_for(FakeStore(), Recorder(), plain.url, protocol={"name": "json-seq"})
        task = run(runner)
        await wait_for(lambda: runner.checkpoint >= 2, 10)
        entry = runner.page_entry(asyncio.get_running_loop().time(), int(time.time() * 1000))
        assert (entry.keepalive_sent_ms, entry.keepalive_answered_ms) == (None, None)
        runner.stop()
        await asyncio.wait_for(task, 5)
