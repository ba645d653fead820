"""Upstreams whose sequence starts over (a documented maintenance: after a reconnect,
or mid-stream) and feeds numbered by a chain, against a real server on loopback:
every message the upstream sent is handed on, each under one ``(seq_gen, seq)``; the
new generation is recorded before anything of it is handed on; a broken chain is a
counted gap. And the state's classification as a table."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest

from tests.support.restarting_upstream import RestartingUpstream
from tests.support.rule_upstreams import serving
from tests.unit.test_connection_runner import FakeStore, Recorder, new_metrics, wait_for
from tests.unit.test_runner_batches import BatchRecorder
from tests.unit.test_runner_upstreams import run, runner_for
from worker.connection_state import ConnectionState, Frame, Restarts
from worker.delivery import Delivery
from wsfleet import metric_names as m
from wsfleet.protocol_specs import InvalidProtocolError, parse_spec
from wsfleet.timing import LeaseTiming

pytestmark = pytest.mark.timeout(30)


def ids(deliveries: Sequence[Delivery]) -> list[str]:
    return [d.payload["id"] for d in deliveries]


def names(deliveries: Sequence[Delivery]) -> list[tuple[int, int]]:
    return [(d.seq_gen, d.seq) for d in deliveries]


async def held(
    upstream: RestartingUpstream,
    protocol: dict[str, Any],
    until_ids: int,
    *,
    store: FakeStore | None = None,
    handler: Recorder | BatchRecorder | None = None,
    metrics: Any = None,
) -> tuple[Recorder | BatchRecorder, FakeStore]:
    """Run one connection against ``upstream`` until ``until_ids`` messages were
    handed on, then stop it."""
    store = store or FakeStore()
    handler = handler or Recorder()
    async with serving(upstream):
        runner = runner_for(
            store,
            handler,  # type: ignore[arg-type]
            upstream.url,
            protocol=protocol,
            metrics=metrics or new_metrics(),
        )
        task = run(runner)
        await wait_for(lambda: len(handler.deliveries) >= until_ids, 20)
        runner.stop()
        await asyncio.wait_for(task, 5)
    return handler, store


async def test_a_restart_after_a_reconnect_begins_a_generation_and_loses_nothing():
    upstream = RestartingUpstream(restart_every=20, close_on_restart=True)
    metrics = new_metrics()
    handler, store = await held(upstream, {"name": "json-seq"}, 35, metrics=metrics)
    delivered = handler.deliveries
    # Every message the upstream sent in both numberings, in order, none twice.
    assert ids(delivered) == upstream.sent_ids[: len(delivered)]
    assert names(delivered)[:20] == [(0, seq) for seq in range(1, 21)]
    assert names(delivered)[20:] == [(1, seq) for seq in range(1, len(delivered) - 19)]
    assert store.generations == [(0, 1, 1, 20)]
    assert metrics.snapshot()[m.SEQUENCE_RESETS] == 1
    assert store.releases[-1][1] == delivered[-1].seq  # checkpointed in the new numbering


async def test_a_mid_stream_restart_is_taken_for_copies_by_default_and_counted():
    upstream = RestartingUpstream(restart_every=10, close_on_restart=False)
    metrics = new_metrics()
    handler, _ = await held(upstream, {"name": "json-seq"}, 12, metrics=metrics)
    # The documented default: a seq at or below the checkpoint mid-stream is a copy
    # (on_connect). Dropped, but counted: the loss shows.
    assert names(handler.deliveries)[:10] == [(0, seq) for seq in range(1, 11)]
    assert metrics.snapshot()[m.SEQUENCE_COPIES] >= 10


@pytest.mark.parametrize("batches", [False, True], ids=["single", "batch"])
async def test_a_mid_stream_restart_with_restarts_anytime_loses_nothing(batches):
    upstream = RestartingUpstream(restart_every=10, close_on_restart=False, restarts_left=2)
    spec = {"name": "json-seq", "options": {"restarts": "anytime"}}
    handler = BatchRecorder() if batches else Recorder()
    _, store = await held(upstream, spec, 28, handler=handler)
    delivered = handler.deliveries
    assert ids(delivered) == upstream.sent_ids[: len(delivered)]
    assert names(delivered)[:20] == [(0, s) for s in range(1, 11)] + [(1, s) for s in range(1, 11)]
    assert [gen for gen, _ in names(delivered)[20:]] == [2] * (len(delivered) - 20)
    assert store.generations == [(0, 1, 1, 10), (1, 2, 1, 10)]


async def test_a_restart_not_recorded_hands_nothing_of_it_on_and_is_met_again():
    upstream = RestartingUpstream(restart_every=10, close_on_restart=True)
    store = FakeStore(generation_refusals=2)
    handler, _ = await held(upstream, {"name": "json-seq"}, 15, store=store)
    delivered = handler.deliveries
    assert names(delivered)[:10] == [(0, s) for s in range(1, 11)]
    # The third attempt landed; nothing of the new numbering was handed on before it,
    # and from it on every message was (what the upstream sent meanwhile and would
    # not send again is the cost of a restart nobody could record).
    ((_, _, first, _),) = store.generations
    assert names(delivered)[10:] == [(1, s) for s in range(first, first + len(delivered) - 10)]
    sent = upstream.sent_ids
    assert ids(delivered)[10:] == sent[sent.index(f"run2-{first}") :][: len(delivered) - 10]
    assert upstream.connections >= 4  # left twice without handing anything on


async def test_a_chain_with_steps_of_any_size_is_followed_and_a_broken_link_counted():
    chain = {"name": "json-field", "options": {"sequence": "/seq", "prev": "/prev"}}
    upstream = RestartingUpstream(restart_every=1000, chain_step=7, skip_link_at=5)
    metrics = new_metrics()
    handler, _ = await held(upstream, chain, 12, metrics=metrics)
    delivered = handler.deliveries
    # Steps of 7 are no gap; the missing fifth link is one, taken (the stream cannot
    # resume) and counted.
    assert [d.seq for d in delivered][:6] == [7, 14, 21, 28, 42, 49]
    assert ids(delivered) == upstream.sent_ids[: len(delivered)]
    assert metrics.snapshot()[m.SEQUENCE_GAPS] == 1


# --- the classification, as a table -----------------------------------------------------

TIMING = LeaseTiming.from_lease()


@pytest.mark.parametrize(
    ("restarts", "seq", "after", "prev", "first", "verdict"),
    [
        (Restarts.ON_CONNECT, 11, None, None, False, Frame.NEXT),
        (Restarts.ON_CONNECT, 11, None, None, True, Frame.NEXT),
        (Restarts.ON_CONNECT, 13, None, None, False, Frame.GAP),
        (Restarts.ON_CONNECT, 10, None, None, False, Frame.DUPLICATE),
        (Restarts.ON_CONNECT, 1, None, None, False, Frame.DUPLICATE),
        (Restarts.ON_CONNECT, 1, None, None, True, Frame.RESET),
        (Restarts.ON_CONNECT, 10, None, None, True, Frame.RESET),
        (Restarts.ANYTIME, 1, None, None, False, Frame.RESET),
        (Restarts.ANYTIME, 12, 11, None, False, Frame.NEXT),
        (Restarts.ANYTIME, 11, 11, None, False, Frame.RESET),
        (Restarts.NEVER, 1, None, None, True, Frame.DUPLICATE),
        (Restarts.NEVER, 10, None, None, False, Frame.DUPLICATE),
        # A chain: the step is whatever it is; what counts is the link.
        (Restarts.ON_CONNECT, 17, None, 10, False, Frame.NEXT),
        (Restarts.ON_CONNECT, 17, None, 12, False, Frame.GAP),
        (Restarts.ON_CONNECT, 17, None, 0, False, Frame.GAP),
        (Restarts.ON_CONNECT, 40, 30, 30, False, Frame.NEXT),
        (Restarts.ON_CONNECT, 9, None, 8, True, Frame.RESET),
        (Restarts.NEVER, 9, None, 8, False, Frame.DUPLICATE),
    ],
)
def test_classify(restarts, seq, after, prev, first, verdict):
    state = ConnectionState(TIMING, checkpoint=10, deadline=100.0, restarts=restarts)
    assert state.classify(seq, after, prev=prev, first=first) is verdict


def test_a_chain_starts_with_whatever_comes_first():
    state = ConnectionState(TIMING, checkpoint=0, deadline=100.0)
    assert state.classify(500, prev=493) is Frame.NEXT
    assert state.classify(500, prev=0) is Frame.NEXT


def test_a_new_generation_counts_from_just_before_its_first_message():
    state = ConnectionState(TIMING, checkpoint=200, deadline=100.0, seq_gen=3)
    state.new_generation(4, 1)
    assert (state.seq_gen, state.checkpoint) == (4, 0)
    assert state.classify(1) is Frame.NEXT
    state.new_generation(5, 50)
    assert (state.seq_gen, state.checkpoint) == (5, 49)
    with pytest.raises(ValueError, match="does not follow"):
        state.new_generation(5, 1)
    with pytest.raises(ValueError, match="does not follow"):
        state.new_generation(6, 0)


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({"name": "json-seq", "options": {"restarts": "sometimes"}}, "restarts must be one of"),
        ({"name": "live", "options": {"restarts": "anytime"}}, "unknown ['restarts']"),
        ({"name": "json-seq", "options": {"prev": "/p"}}, "unknown ['prev']"),
        ({"name": "json-field", "options": {"sequence": "/s", "prev": "p"}}, "prev"),
    ],
)
def test_the_router_refuses_sequence_options_that_cannot_work(options, says):
    with pytest.raises(InvalidProtocolError) as refused:
        parse_spec(options)
    assert says in str(refused.value)


def test_the_router_takes_the_sequence_options():
    for restarts in ("on_connect", "anytime", "never"):
        parse_spec({"name": "json-seq", "options": {"restarts": restarts}})
    parse_spec(
        {"name": "json-field", "options": {"sequence": "/u", "prev": "/pu", "restarts": "never"}}
    )
