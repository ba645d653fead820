"""The per-message path of one connection: from an open upstream connection's frames
to handler calls, for a handler of single messages and for a batch handler alike.

Every decision (duplicate, gap or next frame; call the handler, wait or stop; retry,
skip or wait after a failure) is taken by the pure
:class:`~worker.connection_state.ConnectionState`; the calls themselves go through
:class:`~worker.handler_calls.HandlerCalls`, which bounds them. The pump makes no
object but the :class:`~worker.delivery.Delivery` (and the decoded frame); its common
case (the next seq, a call that may start and returns) is a few comparisons against
the state's fields, and every other case goes through the state's decisions. A batch
handler (``handle_batch``) gets every message already buffered in one call, up to
``MAX_BATCH_MESSAGES`` messages and ``MAX_BATCH_BYTES`` bytes of frames as received.

Memory stays bounded under a handler slower than its upstream: the pump reads the
next frames only once a call has returned, and websockets stops reading the socket
while more than ``max_queue`` frames wait (16 by default, as the upstream link
connects), so the socket buffers fill and TCP stops the upstream instead of frames
piling up here. One connection then holds ``max_queue`` frames plus those of the
socket read that crossed it (at most 256 KiB on the wire, decompressed), each at most
``MAX_MESSAGE_BYTES``, and the batch in the call.

The pump keeps what only the deliveries know: when the checkpoint last moved
(:attr:`MessagePump.advanced_at`, for the page and the release), and, for a stream
that cannot resume, the gap between the last delivery before a reconnect and the
first after it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from typing import Any

from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosedOK
from websockets.frames import Opcode

from worker import event_loops
from worker.connection_settings import ConnectionSettings
from worker.connection_state import Call, ConnectionState, Failure, Frame
from worker.delivery import Delivery, batch_call, make_delivery
from worker.failing_mark import FailingMark
from worker.handler_calls import DeadlineReachedError, HandlerCalls
from worker.sequence_restarts import SequenceRestarts
from worker.upstream_protocol import (
    Heard,
    Message,
    Reply,
    Unreadable,
    UpstreamProtocol,
    is_resumable,
    reader,
)
from wsfleet import metric_names as m
from wsfleet.backoff import backoff_delays
from wsfleet.lease_rules import Lease

log = logging.getLogger(__name__)

GAP_IN_SEQS = "gap in upstream seqs"
"""Why the pump leaves an upstream connection itself (the page's last error)."""
RESTART_NOT_RECORDED = "sequence restart not recorded"
"""The upstream started its sequence over and the new generation could not be
written: nothing of it is handed on; the connection is made again."""


class MessagePump:
    def __init__(
        self,
        settings: ConnectionSettings,
        lease: Lease,
        protocol: UpstreamProtocol,
        state: ConnectionState,
        calls: HandlerCalls,
        failing: FailingMark,
        restarts: SequenceRestarts,
        resumed: asyncio.Event,
    ) -> None:
        """``resumed``: set when a session renew moves the fence deadline, or when the
        connection ends (a paused pump waits for it)."""
        self._s = settings
        self._lease = lease
        self._state = state
        self._calls = calls
        self._failing_mark = failing
        self._failing = failing.clock
        self._restarts = restarts
        self._resumed = resumed
        self._read = reader(protocol)
        self._resumable = is_resumable(protocol)
        self._loop = asyncio.get_running_loop()
        self._clock = event_loops.clock(self._loop)
        self._tally = settings.metrics.handled
        self.advanced_at: float | None = None
        """Loop time of the last checkpoint advance (None: none in this hold)."""
        self._left_because: str | None = None
        """Why the pump left the current upstream connection itself, if it did."""
        self._copies_seen = False
        """A copy was dropped on the current upstream connection (logged once each)."""
        self._gap_open = False
        """A stream that cannot resume has (re)connected: its first delivery measures
        the gap since the previous one."""
        self._gap_from: float | None = None
        """Loop time of this hold's last delivery before the current upstream
        connection (None: none in this hold; the lease's ``advanced_at_ms`` then)."""

    async def receive(self, ws: ClientConnection) -> str | None:
        """Hand the upstream's messages to the handler until this upstream connection
        must be left (a gap, the connection ending) or it closes (a normal close ends
        the iteration, others raise). Why the pump left it itself (a gap), if it did."""
        self._left_because = None
        self._copies_seen = False
        if not self._resumable:
            self._gap_open, self._gap_from = True, self.advanced_at
        handle_batch = batch_call(self._s.handler)
        if handle_batch is None:
            await self._receive(ws)
        else:
            await self._receive_batches(ws, handle_batch)
        return self._left_because

    async def _receive(self, ws: ClientConnection) -> None:
        """One call per message."""
        s = self._s
        handle: Callable[[Delivery], Awaitable[None]] = s.handler.handle  # type: ignore[union-attr]
        state = self._state
        clock = self._clock
        read = self._read
        call = self._calls.call
        handled = self._handled
        lease = self._lease
        connection_id, epoch, seq_gen = lease.connection_id, lease.epoch, lease.seq_gen
        worker_id = s.worker_id
        task = asyncio.current_task()
        assert task is not None
        first = True
        async for data in messages(ws):
            frame = read(data)
            if isinstance(frame, tuple):
                seq, payload = frame
                prev = None
            elif isinstance(frame, Message):
                seq, payload, prev = frame.seq, frame.payload, frame.prev
            else:
                await self._not_a_message(ws, frame)
                continue
            # seq == checkpoint + 1 past the first message is Frame.NEXT; the state
            # classifies the rest.
            if seq != state.checkpoint + 1 or prev is not None or first:
                verdict = state.classify(seq, prev=prev, first=first)
                first = False
                if verdict is Frame.RESET:
                    if not await self._restart(seq):
                        return
                    seq_gen = state.seq_gen
                elif verdict is not Frame.NEXT and not self._takes(verdict):
                    if self._out_of_order(verdict, seq):
                        continue
                    return
            delivery = make_delivery(connection_id, epoch, seq, payload, worker_id, seq_gen)
            # The common case, inline: the call may start (ConnectionState.before_call
            # says GO exactly when now < go_until) and returns.
            if clock() < state.go_until:
                failure = await call(task, handle, delivery)
                if failure is None:
                    if handled(seq, 1):
                        await self._failing_mark.clear()
                    continue
                call_now: Call | None = Call.GO
            else:
                call_now, failure = None, None
            if not await self._deliver(task, handle, delivery, seq, 1, call_now, failure):
                return

    async def _receive_batches(
        self,
        ws: ClientConnection,
        handle_batch: Callable[[Sequence[Delivery]], Awaitable[None]],
    ) -> None:
        """As :meth:`_receive`, with a batch handler: each call gets every message
        already buffered when the previous call returned, in seq order, up to the
        batch caps (what is left stays buffered for the next call); a gap ends the
        batch before it (and then this upstream connection)."""
        s = self._s
        max_messages = s.max_batch_messages
        max_bytes = s.max_batch_bytes
        state = self._state
        clock = self._clock
        read = self._read
        call = self._calls.call
        handled = self._handled
        lease = self._lease
        connection_id, epoch, seq_gen = lease.connection_id, lease.epoch, lease.seq_gen
        worker_id = s.worker_id
        buffered = ws.recv_messages.frames.queue
        take = _buffered_message(ws)
        task = asyncio.current_task()
        assert task is not None
        first = True
        async for data in messages(ws):
            batch: list[Delivery] = []
            last = state.checkpoint
            leave = False
            restart: tuple[int, Any] | None = None
            # Bytes of the frames read for this batch. A text frame carries UTF-8:
            # its length in characters is its size when it is ASCII, as JSON mostly is.
            size = len(data)
            if type(data) is str and not data.isascii():
                size = len(data.encode())
            while True:
                frame = read(data)
                prev = None
                if isinstance(frame, tuple):
                    seq, payload = frame
                elif isinstance(frame, Message):
                    seq, payload, prev = frame.seq, frame.payload, frame.prev
                else:
                    await self._not_a_message(ws, frame)
                    seq = 0
                if not seq:
                    pass
                # seq == last + 1 past the first message is Frame.NEXT; the state
                # classifies the rest.
                elif seq == last + 1 and prev is None and not first:
                    last = seq
                    batch.append(
                        make_delivery(connection_id, epoch, seq, payload, worker_id, seq_gen)
                    )
                else:
                    verdict = state.classify(seq, last, prev=prev, first=first)
                    first = False
                    if verdict is Frame.NEXT or self._takes(verdict):
                        last = seq
                        batch.append(
                            make_delivery(connection_id, epoch, seq, payload, worker_id, seq_gen)
                        )
                    elif verdict is Frame.RESET:
                        # The batch ends before it; it begins a generation of its own.
                        restart = seq, payload
                        break
                    elif not self._out_of_order(verdict, seq, last):
                        leave = True
                        break
                # A whole message already buffered (websockets keeps the data frames
                # it received there; the first of a fragmented message is not final
                # and the batch stops before it): recv returns it at once. At either
                # cap it stays there for the next call.
                if not buffered:
                    break
                head = buffered[0]
                if not head.fin:
                    break
                size += len(head.data)
                if size > max_bytes or len(batch) >= max_messages:
                    break
                taken = take()
                data = await ws.recv() if taken is None else taken
            if batch:
                # The common case inline, as in _receive.
                if clock() < state.go_until:
                    failure = await call(task, handle_batch, batch)
                    if failure is None:
                        if handled(last, len(batch)):
                            await self._failing_mark.clear()
                        if leave:
                            return
                        if restart is None:
                            continue
                    call_now: Call | None = Call.GO
                else:
                    call_now, failure = None, None
                delivered = failure is None and call_now is not None
                if not delivered and not await self._deliver(
                    task, handle_batch, batch, last, len(batch), call_now, failure
                ):
                    return
            if restart is not None:
                seq, payload = restart
                if not await self._restart(seq):
                    return
                seq_gen = state.seq_gen
                first_of_generation = [
                    make_delivery(connection_id, epoch, seq, payload, worker_id, seq_gen)
                ]
                if not await self._deliver(task, handle_batch, first_of_generation, seq, 1):
                    return
            if leave:
                return

    async def _not_a_message(self, ws: ClientConnection, frame: Reply | Unreadable | Heard) -> None:
        """Answer an application-level ping; log and skip an unreadable frame; a
        control frame the protocol took needs nothing."""
        if isinstance(frame, Reply):
            await ws.send(frame.data)
            return
        if isinstance(frame, Heard):
            return
        self._s.metrics.count(m.UNREADABLE_FRAMES, 1)
        log.warning(
            "unreadable upstream frame skipped",
            extra={"connection_id": self._lease.connection_id, "reason": frame.reason},
        )

    def _takes(self, verdict: Frame) -> bool:
        """A message past a gap that is delivered anyway: the stream cannot resume,
        so there is nothing to ask for again; it goes on from there (§4.6), the gap
        counted."""
        if verdict is not Frame.GAP or self._resumable:
            return False
        self._s.metrics.count(m.SEQUENCE_GAPS, 1)
        return True

    def _out_of_order(self, verdict: Frame, seq: int, after: int | None = None) -> bool:
        """A message that is not the next one (``after``: the last seq of the batch
        being gathered): True for a duplicate (dropped); False for a gap (leave this
        upstream connection, resume from the checkpoint)."""
        if verdict is not Frame.GAP:
            self._s.metrics.count(m.SEQUENCE_COPIES, 1)
            if not self._copies_seen:
                self._copies_seen = True
                log.warning(
                    "a message at or below the checkpoint dropped as a copy (an upstream"
                    " that starts its sequence over mid-stream needs restarts: anytime)",
                    extra={
                        "connection_id": self._lease.connection_id,
                        "checkpoint": self._state.checkpoint if after is None else after,
                        "received": seq,
                    },
                )
            return True
        self._s.metrics.count(m.SEQUENCE_GAPS, 1)
        self._left_because = GAP_IN_SEQS
        log.warning(
            "gap in upstream seqs; reconnecting to resume",
            extra={
                "connection_id": self._lease.connection_id,
                "expected": (self._state.checkpoint if after is None else after) + 1,
                "received": seq,
            },
        )
        return False

    async def _restart(self, seq: int) -> bool:
        """The upstream started its sequence over at ``seq``: record the new generation
        before anything of it is handed on. False when that could not be done: the
        pump leaves this upstream connection, and the next one meets the restart
        again (nothing of the new numbering was handed on)."""
        state = self._state
        previous = state.checkpoint
        new_gen = await self._restarts.begin(state.seq_gen, seq, previous)
        if new_gen is None:
            self._left_because = RESTART_NOT_RECORDED
            return False
        state.new_generation(new_gen, seq)
        self._s.metrics.count(m.SEQUENCE_RESETS, 1)
        log.warning(
            "the upstream started its sequence over: a new sequence generation begins",
            extra={
                "connection_id": self._lease.connection_id,
                "seq_gen": new_gen,
                "previous_last_seq": previous,
                "first_seq": seq,
            },
        )
        return True

    async def _deliver(
        self,
        task: asyncio.Task[Any],
        call: Callable[[Any], Awaitable[None]],
        arg: Any,
        last: int,
        count: int,
        call_now: Call | None = None,
        failure: BaseException | None = None,
    ) -> bool:
        """Hand one message, or one batch of ``count`` messages ending at seq ``last``,
        to the handler until it is handled (or skipped); False when the connection
        must stop reading instead. A batch is retried, skipped or cut whole.

        ``call_now``, ``failure``: a first attempt made by the caller (what
        :meth:`ConnectionState.before_call` said and, for ``GO``, how the call
        failed); this goes on from there."""
        s = self._s
        state = self._state
        loop = self._loop
        calls = self._calls
        delays: Iterator[float] | None = None
        while True:
            if call_now is None:
                call_now = state.before_call(loop.time())
                failure = await calls.call(task, call, arg) if call_now is Call.GO else None
            if call_now is not Call.GO:
                if call_now is not Call.PAUSE:
                    return False
                call_now = None
                await self._paused()
                continue
            call_now = None
            if failure is None:
                if self._handled(last, count):
                    await self._failing_mark.clear()
                return True
            hit_deadline = isinstance(failure, DeadlineReachedError)
            verdict = state.call_failed(last, hit_deadline=hit_deadline)
            # What the log lines below name; it decides nothing.
            seqs = (  # pragma: no mutate
                {"seq": last} if count == 1 else {"seq": last - count + 1, "last_seq": last}
            )
            if verdict is Failure.PAUSE:
                log.warning(
                    "handler call cut at the session's fence deadline; waiting for a renew",
                    extra={"connection_id": self._lease.connection_id, **seqs},
                )
                continue
            s.metrics.count(m.HANDLER_ERRORS, count)
            log.error(
                "handler failed"
                + ("; message skipped" if verdict is Failure.SKIP else "; retrying"),
                extra={"connection_id": self._lease.connection_id, **seqs, "error": repr(failure)},
            )
            if verdict is Failure.SKIP:
                s.metrics.count(m.MESSAGES_SKIPPED, count)
                return True
            if delays is None:
                delays = backoff_delays(initial=0.1, maximum=10.0, rng=s.rng.random)
            await asyncio.sleep(next(delays))

    def _handled(self, last: int, count: int) -> bool:
        """A call of ``count`` messages up to seq ``last`` returned: pass the
        checkpoint over them. True when the failing mark must now be cleared."""
        self._state.call_returned(last)
        self.advanced_at = self._clock()
        self._tally.messages += count
        if self._gap_open:
            self._measure_gap()
        failing = self._failing
        # message_handled() has nothing to do unless a failing streak is on.
        return (failing.failing_since_ms is not None or failing.on_item) and (
            failing.message_handled()
        )

    async def _paused(self) -> None:
        """Wait, handling nothing, until a session renew moves the fence deadline or
        the connection ends."""
        self._resumed.clear()
        state = self._state
        if state.may_handle(self._loop.time()) or state.stopping:
            return
        log.warning(
            "session fence deadline passed: pausing",
            extra={"connection_id": self._lease.connection_id, "epoch": self._lease.epoch},
        )
        await self._resumed.wait()

    def _measure_gap(self) -> None:
        """The first delivery of a stream that cannot resume after it (re)connected:
        what was sent since the previous delivery (this hold's, or the previous
        owner's) is lost; the time between the two is the gap."""
        self._gap_open = False
        s = self._s
        if self._gap_from is not None and self.advanced_at is not None:
            gap_ms = (self.advanced_at - self._gap_from) * 1000
        elif self._lease.advanced_at_ms is not None:
            gap_ms = s.wall_ms() - self._lease.advanced_at_ms
        else:
            return  # nothing delivered before: nothing to miss
        gap_ms = max(0, round(gap_ms))
        s.metrics.upstream_gap(gap_ms)
        log.info(
            "stream cannot resume: gap since the previous delivery",
            extra={"connection_id": self._lease.connection_id, "gap_ms": gap_ms},
        )


def _buffered_message(ws: ClientConnection) -> Callable[[], str | bytes | None]:
    """What ``ws.recv()`` would return at once, taken without its machinery (a few
    coroutine layers, a lock flag, a join): a whole message already buffered, as
    websockets' assembler returns it (and with its flow control: reading resumes
    once few enough frames wait). None when ``recv`` must do it: nothing buffered,
    a fragmented message, text that is not UTF-8 (websockets fails the connection)."""
    assembler = ws.recv_messages
    buffered = assembler.frames.queue
    resume = assembler.maybe_resume
    text, binary = Opcode.TEXT, Opcode.BINARY

    def take() -> str | bytes | None:
        if not buffered:
            return None
        head = buffered[0]
        if not head.fin:
            return None
        try:
            if head.opcode is text:
                data: str | bytes = str(head.data, "utf-8")
            elif head.opcode is binary:
                data = bytes(head.data)
            else:
                return None
        except UnicodeDecodeError:
            return None
        buffered.popleft()
        resume()
        return data

    return take


async def messages(ws: ClientConnection) -> AsyncIterator[str | bytes]:
    """``async for data in ws``, with the messages already buffered taken at once
    (:func:`_buffered_message`); it ends as websockets' own iteration does, on a
    normal close, and raises on any other."""
    take = _buffered_message(ws)
    recv = ws.recv
    while True:
        data = take()
        if data is None:
            try:
                data = await recv()
            except ConnectionClosedOK:
                return
        yield data
