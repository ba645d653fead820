"""A batch handler (``handle_batch``) on one runner against a real feed on loopback
and a fake store (see test_connection_runner): each call gets every message already
buffered, contiguous and in seq order, each seq once; the checkpoint passes a batch
only once its call returned; the fence bounds a batch call like a single one (none
starts at or after the deadline, the one in flight is cut and called again whole
after a renew); a failed batch is retried whole, or skipped whole and counted per
message. A batch stops at ``MAX_BATCH_MESSAGES`` or ``MAX_BATCH_BYTES``, the rest
staying buffered for the next call; a blocked call stalls the upstream instead of
frames piling up in the worker."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Sequence

import pytest
from websockets.asyncio.server import ServerConnection, serve

from tests.unit import test_connection_runner as runner_support
from tests.unit.test_connection_runner import (
    EPOCH,
    SEQ_GEN,
    FakeStore,
    Upstream,
    feed_frame,
    make_runner,
    new_metrics,
    start,
    stop_and_wait,
    upstream,
    wait_for,
)
from worker.connection import ConnectionRunner, Outcome
from worker.connection_state import Ending
from worker.delivery import Delivery
from wsfleet import metric_names as m

pytestmark = pytest.mark.timeout(30)

feed_url = runner_support.feed_url  # the same in-process feed fixture


def now() -> float:
    return asyncio.get_running_loop().time()


class BatchRecorder:
    """Records batch calls. ``delay``: seconds each call takes (frames pile up
    meanwhile); ``on_call``: a hook run inside that call (1-based), before it returns
    (it may raise)."""

    def __init__(
        self,
        delay: float = 0.0,
        *,
        on_call: dict[int, Callable[[], Awaitable[None]]] | None = None,
    ) -> None:
        self.calls: list[tuple[float, list[int]]] = []
        self.returned: list[list[int]] = []
        self.deliveries: list[Delivery] = []
        self.delay = delay
        self.on_call = dict(on_call or {})

    async def handle_batch(self, deliveries: Sequence[Delivery]) -> None:
        seqs = [d.seq for d in deliveries]
        self.calls.append((now(), seqs))
        self.deliveries.extend(deliveries)
        hook = self.on_call.pop(len(self.calls), None)
        if hook is not None:
            await hook()
        if self.delay:
            await asyncio.sleep(self.delay)
        self.returned.append(seqs)

    def handled(self) -> list[int]:
        return [seq for batch in self.returned for seq in batch]

    def batches(self) -> list[list[int]]:
        return [seqs for _, seqs in self.calls]


async def test_every_message_once_in_order_in_batches_of_what_is_buffered(feed_url):
    metrics = new_metrics()
    store = FakeStore()
    handler = BatchRecorder(delay=0.1)  # 40 msg/s: about 4 pile up per call
    runner = make_runner(store, handler, feed_url, metrics=metrics)  # type: ignore[arg-type]
    task = start(runner)
    await wait_for(lambda: len(handler.handled()) >= 30, 10)
    outcome = await stop_and_wait(runner, task)
    handled = handler.handled()
    assert handled == list(range(1, len(handled) + 1))  # each seq once, in order
    assert handler.batches() == handler.returned  # none called twice
    assert max(len(batch) for batch in handler.returned) > 1
    assert all(batch == list(range(batch[0], batch[-1] + 1)) for batch in handler.returned)
    assert all(
        (d.connection_id, d.epoch, d.seq_gen, d.worker_id) == ("c1", EPOCH, SEQ_GEN, "w-test")
        for d in handler.deliveries
    )
    assert all(d.payload["seq"] == d.seq for d in handler.deliveries)
    assert outcome.last_seq == handled[-1]
    assert store.releases == [(EPOCH, handled[-1])]
    assert metrics.snapshot()[m.MESSAGES_PROCESSED] == len(handled)


async def test_no_batch_call_starts_at_or_after_the_deadline_and_a_renew_resumes(feed_url):
    store = FakeStore()
    handler = BatchRecorder(delay=0.05)
    runner = make_runner(store, handler, feed_url)  # type: ignore[arg-type]
    deadline = runner.fence_deadline
    task = start(runner, renew=False)
    await wait_for(lambda: now() > deadline + 0.4, 3)
    assert handler.calls, "batches flowed before the deadline"
    assert all(t < deadline for t, _ in handler.calls)
    assert runner.checkpoint == handler.handled()[-1]
    resume_from = runner.checkpoint + 1
    renewed_at = now()
    runner.session_renewed(renewed_at)
    handled_before = len(handler.handled())
    await wait_for(lambda: len(handler.handled()) > handled_before + 3, 5)
    later = [seqs for t, seqs in handler.calls if t >= renewed_at]
    assert later[0][0] == resume_from  # what was buffered during the pause comes first
    assert len(later[0]) > 1
    handled = handler.handled()
    assert handled == list(range(1, len(handled) + 1))
    outcome = await stop_and_wait(runner, task)
    assert (outcome.ending, outcome.released) == (Ending.SHUTDOWN, True)


async def test_a_batch_call_in_flight_is_cut_at_the_deadline_and_called_again_whole(feed_url):
    metrics = new_metrics()
    store = FakeStore()
    cut: list[float] = []

    async def runs_past_the_deadline() -> None:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cut.append(now())
            raise

    handler = BatchRecorder(on_call={3: runs_past_the_deadline})
    runner = make_runner(store, handler, feed_url, metrics=metrics)  # type: ignore[arg-type]
    deadline = runner.fence_deadline
    task = start(runner, renew=False)
    await wait_for(lambda: cut, 3)
    assert deadline <= cut[0] < deadline + 0.5
    await asyncio.sleep(0.3)  # paused: nothing called, nothing checkpointed
    assert len(handler.calls) == 3
    cut_batch = handler.batches()[2]
    assert runner.checkpoint == cut_batch[0] - 1
    renewed_at = now()
    runner.session_renewed(renewed_at)
    await wait_for(lambda: len(handler.returned) >= 4, 3)
    assert handler.batches()[3] == cut_batch  # the same batch again, whole
    assert handler.calls[3][0] >= renewed_at
    assert metrics.snapshot()[m.HANDLER_ERRORS] == 0  # the deadline, not the handler
    outcome = await stop_and_wait(runner, task)
    assert outcome.last_seq >= cut_batch[-1]
    assert store.releases == [(EPOCH, outcome.last_seq)]


@pytest.mark.parametrize("skip", [False, True])
async def test_a_failed_batch_is_retried_whole_or_skipped_whole(feed_url, skip):
    async def fails() -> None:
        await asyncio.sleep(0.2)  # let more frames pile up behind it
        raise ValueError("bad batch")

    metrics = new_metrics()
    store = FakeStore()
    handler = BatchRecorder(on_call={2: fails})
    runner = make_runner(
        store,
        handler,  # type: ignore[arg-type]
        feed_url,
        metrics=metrics,
        skip_failed_messages=skip,
    )
    task = start(runner)
    await wait_for(lambda: len(handler.returned) >= 4, 5)
    outcome = await stop_and_wait(runner, task)
    failed = handler.batches()[1]
    after = handler.batches()[2]
    counts = metrics.snapshot()
    assert counts[m.HANDLER_ERRORS] == len(failed)  # counted per message
    if skip:
        assert after[0] == failed[-1] + 1  # past the whole batch
        assert set(failed).isdisjoint(handler.handled())
    else:
        assert after == failed  # the same batch again, whole
        handled = handler.handled()
        assert handled == list(range(1, len(handled) + 1))
    assert outcome.last_seq == handler.returned[-1][-1]
    assert counts[m.MESSAGES_PROCESSED] == len(handler.handled())


async def test_a_graceful_stop_drains_the_batch_in_flight(feed_url):
    store = FakeStore()
    handler = BatchRecorder(delay=0.3)
    runner = make_runner(store, handler, feed_url)  # type: ignore[arg-type]
    task = start(runner)
    await wait_for(lambda: len(handler.calls) >= 2, 5)  # the second call is in flight
    runner.stop()
    outcome = await asyncio.wait_for(task, 3)
    assert handler.returned == handler.batches()  # none cut short
    assert outcome.last_seq == handler.returned[-1][-1]
    assert store.releases == [(EPOCH, outcome.last_seq)]


# --- noise, duplicates and gaps inside a batch -------------------------------------------


def slow_batches(
    url: str, first_call: asyncio.Event
) -> tuple[ConnectionRunner, BatchRecorder, asyncio.Task[Outcome]]:
    """A running connection to ``url`` whose batch calls take 0.3 s each, so what the
    upstream sends meanwhile piles up into the next batch; ``first_call`` is set once
    the first call is running."""

    async def started() -> None:
        first_call.set()

    handler = BatchRecorder(delay=0.3, on_call={1: started})
    runner = make_runner(FakeStore(), handler, url)  # type: ignore[arg-type]
    return runner, handler, start(runner)


async def test_noise_and_duplicates_inside_a_batch_are_dropped_on_the_same_connection():
    """Frames that pile up behind a slow call: a ping (answered), garbage, a frame
    with no seq and duplicates of what the batch already holds are left out of it; the
    connection is kept (one upstream connection)."""

    async def noisy(ws: ServerConnection, from_seq: int) -> None:
        await ws.send(json.dumps({"type": "ping", "n": 1}))  # before any message
        await ws.send(feed_frame(from_seq))
        await first_call.wait()  # the rest piles up behind the first call
        for frame in (
            feed_frame(from_seq + 1),
            feed_frame(from_seq + 2),
            "not json",
            feed_frame(from_seq + 2),  # a duplicate of this batch's own last message
            feed_frame(from_seq + 1),  # and of an earlier one, past the checkpoint
            json.dumps({"type": "ping", "n": 2}),
            json.dumps({"seq": 0}),
            feed_frame(from_seq + 3),
        ):
            await ws.send(frame)
        await up.read_all(ws)

    first_call = asyncio.Event()
    async with upstream(noisy) as up:
        runner, handler, task = slow_batches(up.url, first_call)
        await wait_for(lambda: len(handler.handled()) >= 4, 5)
        await wait_for(lambda: len(up.received) >= 2, 5)
        outcome = await stop_and_wait(runner, task)
    assert handler.batches() == [[1], [2, 3, 4]]
    assert [json.loads(frame)["n"] for frame in up.received] == [1, 2]  # both answered
    assert [from_seq for _, from_seq in up.connections] == [1]
    assert outcome.last_seq == 4


async def test_a_gap_inside_a_batch_delivers_what_came_before_it_then_resumes_after_it():
    async def gapped(ws: ServerConnection, from_seq: int) -> None:
        if from_seq == 1:
            await ws.send(feed_frame(1))
            await first_call.wait()  # the rest piles up behind the first call
            for seq in (2, 3, 5, 6):  # 4 is missing
                await ws.send(feed_frame(seq))
        else:
            for seq in range(from_seq, from_seq + 3):
                await ws.send(feed_frame(seq))
        await up.read_all(ws)

    first_call = asyncio.Event()
    async with upstream(gapped) as up:
        runner, handler, task = slow_batches(up.url, first_call)
        await wait_for(lambda: len(handler.handled()) >= 6, 5)
        outcome = await stop_and_wait(runner, task)
    assert handler.batches()[:2] == [[1], [2, 3]]  # the batch ends before the gap
    # Resumed from right after what was handled: nothing asked for twice.
    assert [from_seq for _, from_seq in up.connections] == [1, 4]
    handled = handler.handled()
    assert handled == list(range(1, len(handled) + 1))
    assert outcome.last_seq == handled[-1]


# --- the batch caps ----------------------------------------------------------------------


def padded_frame(seq: int) -> str:
    """A frame of the same length whatever the seq (JSON allows the spaces)."""
    return f'{{"seq": {seq:6d}, "pad": "{"x" * 40}"}}'


async def piled_up_batches(
    frames: Callable[[int], str | bytes], last: int, **caps: int
) -> tuple[list[list[int]], Outcome, list[int]]:
    """Frame 1, then, once the first call runs (it takes 0.3 s, as every call does),
    frames 2 to ``last`` at once: they pile up behind it. The batches, the outcome and
    the ``from_seq`` of each upstream connection, with ``caps`` (``max_batch_messages``,
    ``max_batch_bytes``) set on the connection."""

    async def piles_up(ws: ServerConnection, from_seq: int) -> None:
        await ws.send(frames(from_seq))
        await first_call.wait()
        for seq in range(from_seq + 1, last + 1):
            await ws.send(frames(seq))
        await up.read_all(ws)

    async def started() -> None:
        first_call.set()

    first_call = asyncio.Event()
    async with upstream(piles_up) as up:
        handler = BatchRecorder(delay=0.3, on_call={1: started})
        store = FakeStore()
        runner = make_runner(store, handler, up.url, **caps)  # type: ignore[arg-type]
        task = start(runner)
        await wait_for(lambda: len(handler.handled()) >= last, 10)
        outcome = await stop_and_wait(runner, task)
    assert handler.batches() == handler.returned  # none called twice
    assert store.releases == [(EPOCH, last)]
    return handler.batches(), outcome, [from_seq for _, from_seq in up.connections]


async def test_a_batch_stops_at_the_message_cap_and_the_rest_waits_for_the_next_call():
    batches, outcome, connections = await piled_up_batches(feed_frame, 11, max_batch_messages=3)
    assert batches == [[1], [2, 3, 4], [5, 6, 7], [8, 9, 10], [11]]
    assert connections == [1]  # the rest stayed buffered: nothing asked for again
    assert outcome.last_seq == 11


@pytest.mark.parametrize("binary", [False, True])
@pytest.mark.parametrize(
    ("frames_per_cap", "extra_bytes", "expected"),
    [
        (3, 0, [[1], [2, 3, 4], [5, 6, 7], [8, 9, 10], [11]]),  # exactly three fit
        (3, -1, [[1], [2, 3], [4, 5], [6, 7], [8, 9], [10, 11]]),  # one byte short of 3
    ],
)
async def test_a_batch_stops_at_the_byte_cap_counted_in_frames_as_received(
    frames_per_cap, extra_bytes, expected, binary
):
    size = len(padded_frame(1))
    assert {len(padded_frame(seq)) for seq in range(1, 12)} == {size}

    def frames(seq: int) -> str | bytes:
        return padded_frame(seq).encode() if binary else padded_frame(seq)

    batches, outcome, connections = await piled_up_batches(
        frames, 11, max_batch_bytes=frames_per_cap * size + extra_bytes
    )
    assert batches == expected
    assert connections == [1]
    assert outcome.last_seq == 11


async def test_a_message_over_the_byte_cap_goes_alone():
    batches, outcome, _ = await piled_up_batches(feed_frame, 4, max_batch_bytes=1)
    assert batches == [[1], [2], [3], [4]]
    assert outcome.last_seq == 4


@pytest.mark.parametrize("binary", [False, True])
async def test_a_frame_counts_its_utf8_bytes_not_its_characters(binary):
    """The first message of a batch is counted from what websockets returned: a
    non-ASCII text is longer in bytes than in characters; a binary frame is bytes."""

    def accented(seq: int) -> str | bytes:
        text = json.dumps({"seq": seq, "text": "é" * 20}, ensure_ascii=False)
        return text.encode() if binary else text

    text = json.dumps({"seq": 1, "text": "é" * 20}, ensure_ascii=False)
    size = len(text.encode())
    assert size == len(text) + 20
    # Counted in characters, the first of a batch would leave room for a second.
    batches, _, _ = await piled_up_batches(accented, 5, max_batch_bytes=2 * size - 1)
    assert batches == [[1], [2], [3], [4], [5]]


async def test_a_capped_batch_cut_at_the_deadline_is_called_again_whole(feed_url):
    """The caps change what a batch holds, not its rules: the cut batch comes again
    with the same seqs, and what stayed buffered behind it follows in order."""
    cut: list[float] = []

    async def runs_past_the_deadline() -> None:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cut.append(now())
            raise

    store = FakeStore()
    # 0.2 s a call at 40 msg/s: about 8 pile up behind each call, 3 go into the next.
    handler = BatchRecorder(delay=0.2, on_call={3: runs_past_the_deadline})
    runner = make_runner(store, handler, feed_url, max_batch_messages=3)  # type: ignore[arg-type]
    task = start(runner, renew=False)
    await wait_for(lambda: cut, 3)
    cut_batch = handler.batches()[2]
    assert len(cut_batch) == 3
    assert runner.checkpoint == cut_batch[0] - 1
    runner.session_renewed(now())
    await wait_for(lambda: len(handler.returned) >= 6, 5)
    outcome = await stop_and_wait(runner, task)
    assert handler.batches()[3] == cut_batch  # the same batch again, whole
    assert all(len(batch) <= 3 for batch in handler.batches())
    handled = handler.handled()
    assert handled == list(range(1, len(handled) + 1))
    assert outcome.last_seq == handled[-1]
    assert store.releases == [(EPOCH, handled[-1])]


async def test_a_blocked_batch_call_stalls_the_upstream_instead_of_buffering():
    """The pump reads only once a call has returned, and websockets stops reading the
    socket once more than ``max_queue`` frames wait: while a call is blocked, TCP
    pushes back until the upstream's sends stall, a few MiB later (the sockets'
    buffers). Once it returns, what was held comes in capped batches, each seq once,
    on the same upstream connection."""
    pad = "x" * 16_000
    sent = 0

    async def floods(ws: ServerConnection, from_seq: int) -> None:
        nonlocal sent
        seq = from_seq
        while True:
            await ws.send(json.dumps({"seq": seq, "pad": pad}))
            sent = seq
            seq += 1
            await asyncio.sleep(0)  # a send with room in the buffer does not yield

    async def blocks() -> None:
        first_call.set()
        await release.wait()

    async def stalled() -> int:
        while True:
            before = sent
            await asyncio.sleep(0.2)
            if sent == before:
                return before

    first_call, release = asyncio.Event(), asyncio.Event()
    up = Upstream(floods)
    # Uncompressed, so the socket buffers fill after a few hundred frames (deflated,
    # this padding would take tens of thousands).
    async with serve(up._serve, "127.0.0.1", 0, compression=None) as server:
        up.url = f"ws://127.0.0.1:{server.sockets[0].getsockname()[1]}/floods"
        handler = BatchRecorder(on_call={1: blocks})
        runner = make_runner(
            FakeStore(),
            handler,  # type: ignore[arg-type]
            up.url,
            max_batch_messages=10,
            # A pong waits behind the unread frames: no keepalive verdict meanwhile.
            ping_interval=30.0,
            ping_timeout=30.0,
        )
        task = start(runner)
        await asyncio.wait_for(first_call.wait(), 5)
        held = await asyncio.wait_for(stalled(), 10)
        assert held < 2_000  # 32 MB: more than the socket buffers hold
        release.set()
        await wait_for(lambda: len(handler.handled()) >= held, 10)
        outcome = await stop_and_wait(runner, task)
    handled = handler.handled()
    assert handled == list(range(1, len(handled) + 1))
    assert max(len(batch) for batch in handler.batches()) == 10
    assert [from_seq for _, from_seq in up.connections] == [1]
    assert outcome.last_seq == handled[-1]
