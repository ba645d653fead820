"""The direct reading of the common frame (``worker.direct_frames``) against
websockets' own: fed the same bytes in the same pieces, a connection that reads
directly holds the same frames, sends the same answers, reaches the same state and
fails on the same byte as websockets' ``ClientConnection``, after every piece; and
against a real server on loopback it yields the same messages."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from websockets.asyncio.client import ClientConnection, connect
from websockets.asyncio.server import ServerConnection, serve
from websockets.client import ClientProtocol
from websockets.extensions.permessage_deflate import (
    ClientPerMessageDeflateFactory,
    PerMessageDeflate,
)
from websockets.frames import Frame, Opcode
from websockets.streams import StreamReader
from websockets.uri import parse_uri
from websockets.utils import accept_key

from worker.direct_frames import DirectFrameConnection, Stop, split
from worker.message_pump import messages
from worker.upstream_link import UpstreamConnection


class RecordingTransport(asyncio.Transport):
    """What a connection writes, and whether it paused the reading."""

    def __init__(self) -> None:
        super().__init__()
        self.written = bytearray()
        self.paused = False
        self.eof_written = False

    def write(self, data: Any) -> None:
        self.written += data

    def write_eof(self) -> None:
        self.eof_written = True

    def can_write_eof(self) -> bool:
        return True

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False

    def is_closing(self) -> bool:
        return False

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass

    def get_write_buffer_size(self) -> int:
        return 0

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default

    def close(self) -> None:
        pass

    def abort(self) -> None:
        pass


def opened(
    cls: type[ClientConnection], max_size: int | None, compression: bool
) -> tuple[ClientConnection, RecordingTransport, bytes]:
    """A connection of ``cls`` that sent its handshake request; the server's answer."""
    protocol = ClientProtocol(
        parse_uri("ws://upstream.test/"),
        max_size=max_size,
        extensions=[ClientPerMessageDeflateFactory()] if compression else None,
    )
    request = protocol.connect()
    protocol.send_request(request)
    protocol.data_to_send()  # the request, as if written
    connection = cls(protocol, ping_interval=None, max_queue=4)
    transport = RecordingTransport()
    connection.connection_made(transport)
    answer = (
        "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        f"Sec-WebSocket-Accept: {accept_key(request.headers['Sec-WebSocket-Key'])}\r\n"
        + ("Sec-WebSocket-Extensions: permessage-deflate\r\n" if compression else "")
        + "\r\n"
    )
    return connection, transport, answer.encode()


def sent_frames(written: bytes) -> list[tuple[Opcode, bytes]]:
    """The frames a client wrote (masked, each with its own random mask)."""
    reader = StreamReader()
    reader.feed_data(written)
    reader.feed_eof()
    frames = []
    while reader.buffer:
        parser = Frame.parse(reader.read_exact, mask=True)
        try:
            next(parser)
        except StopIteration as done:
            frame = done.value
            frames.append((frame.opcode, bytes(frame.data)))
    return frames


def seen(connection: ClientConnection, transport: RecordingTransport) -> dict[str, Any]:
    protocol = connection.protocol
    return {
        "frames": [
            (f.opcode, bytes(f.data), f.fin, f.rsv1, f.rsv2, f.rsv3)
            for f in connection.recv_messages.frames.queue
        ],
        "state": protocol.state,
        "close_rcvd": protocol.close_rcvd,
        "close_sent": protocol.close_sent,
        "parser_exc": repr(protocol.parser_exc),
        "handshake_exc": repr(protocol.handshake_exc),
        "current_size": protocol.current_size,
        "sent": sent_frames(bytes(transport.written)),
        "paused": transport.paused,
        "eof_sent": protocol.eof_sent,
    }


def header(first: int, length: int, *, wide: int = 0, masked: bool = False) -> bytes:
    """A frame header: ``wide`` 2 or 8 writes the length in that many bytes."""
    mask_bit = 0x80 if masked else 0
    if wide == 8 or length > 0xFFFF:
        return bytes([first, mask_bit | 127]) + length.to_bytes(8, "big")
    if wide == 2 or length > 125:
        return bytes([first, mask_bit | 126]) + length.to_bytes(2, "big")
    return bytes([first, mask_bit | length])


payloads = st.binary(max_size=300)
widths = st.sampled_from([0, 0, 0, 2, 8])


@st.composite
def frames(draw: st.DrawFn) -> list[bytes]:
    """A frame as an upstream may send it, valid or not (a fragmented message: its
    frames)."""
    kind = draw(
        st.sampled_from(
            [
                "text",
                "text",
                "text",
                "binary",
                "ping",
                "pong",
                "close",
                "fragmented",
                "reserved bit",
                "rsv1",
                "reserved opcode",
                "masked",
                "long control",
                "lone continuation",
                "empty",
                "unfinished fragment",
            ]
        )
    )
    if kind == "text":
        text = draw(st.text(max_size=200)).encode()
        return [header(0x81, len(text), wide=draw(widths)) + text]
    if kind == "binary":
        data = draw(payloads)
        return [header(0x82, len(data), wide=draw(widths)) + data]
    if kind == "empty":
        return [header(draw(st.sampled_from([0x81, 0x82])), 0)]
    if kind in ("ping", "pong"):
        data = draw(st.binary(max_size=125))
        return [header(0x89 if kind == "ping" else 0x8A, len(data)) + data]
    if kind == "close":
        code = draw(st.sampled_from([1000, 1001, 1011, 4000]))
        data = code.to_bytes(2, "big") + draw(st.text(max_size=20)).encode()[:100]
        return [header(0x88, len(data)) + data]
    if kind == "unfinished fragment":  # what follows it breaks the protocol, or ends it
        data = draw(payloads)
        return [header(draw(st.sampled_from([0x01, 0x02])), len(data), wide=draw(widths)) + data]
    if kind == "fragmented":
        parts = draw(st.lists(payloads, min_size=2, max_size=4))
        out = [header(draw(st.sampled_from([0x01, 0x02])), len(parts[0])) + parts[0]]
        for part in parts[1:-1]:
            if draw(st.booleans()):
                out.append(header(0x89, 1) + b"p")
            out.append(header(0x00, len(part), wide=draw(widths)) + part)
        return [*out, header(0x80, len(parts[-1])) + parts[-1]]
    data = draw(st.binary(max_size=40))
    first = {
        "reserved bit": 0xA1,
        "rsv1": 0xC1,
        "reserved opcode": 0x83,
        "masked": 0x81,
        "long control": 0x89,
        "lone continuation": 0x80,
    }[kind]
    if kind == "masked":
        return [header(first, len(data), masked=True) + b"\x00\x00\x00\x00" + data]
    if kind == "long control":
        data = b"x" * 130
    return [header(first, len(data), wide=draw(widths)) + data]


@st.composite
def compressed_texts(draw: st.DrawFn) -> list[bytes]:
    """Messages a compressing server sends: some compressed, some not."""
    encoder = PerMessageDeflate(False, False, 15, 15)
    out = []
    for text in draw(st.lists(st.text(max_size=100), max_size=6)):
        frame = Frame(Opcode.TEXT, text.encode())
        if draw(st.booleans()):
            out.append(frame.serialize(mask=False, extensions=[encoder]))
        else:
            out.append(frame.serialize(mask=False))
    return out


@dataclass
class Case:
    stream: bytes
    cuts: list[int]
    max_size: int | None
    compression: bool
    eof: bool
    answer_alone: bool
    """The handshake's answer comes in a piece of its own (as it mostly does), else
    with the first bytes of the stream."""


@st.composite
def cases(draw: st.DrawFn) -> Case:
    compression = draw(st.booleans())
    body = [frame for frames_ in draw(st.lists(frames(), max_size=12)) for frame in frames_]
    if compression:
        body += draw(compressed_texts())
        body = draw(st.permutations(body))
    stream = b"".join(body)
    # The stream may end inside a frame.
    stream = stream[: len(stream) - draw(st.sampled_from([0, 0, 0, 1, 3]))]
    # Pieces end inside frames (in headers above all) as well as between them.
    cuts, start = [], 0
    for frame in body:
        if draw(st.booleans()):
            cuts.append(start + draw(st.sampled_from([1, 2, 3, 4, len(frame) - 1, len(frame)])))
        start += len(frame)
    cuts = sorted(cuts + draw(st.lists(st.integers(0, len(stream)), max_size=4)))
    return Case(
        stream,
        cuts,
        draw(st.sampled_from([None, 64, 200, 1 << 20])),
        compression,
        draw(st.booleans()),
        draw(st.sampled_from([True, True, True, False])),
    )


async def fed(cls: type[ClientConnection], case: Case) -> list[dict[str, Any]]:
    """What the connection shows after each piece of the stream (and the EOF)."""
    connection, transport, answer = opened(cls, case.max_size, case.compression)
    stream = answer + case.stream
    views = []
    start = 0
    cuts = [len(answer) + cut for cut in case.cuts]
    if case.answer_alone:
        cuts.insert(0, len(answer))
    for cut in [*cuts, len(stream)]:
        piece = stream[start:cut]
        if piece:
            connection.data_received(piece)
            views.append(seen(connection, transport))
        start = max(start, cut)
    if case.eof:
        connection.eof_received()
        views.append(seen(connection, transport))
    return views


FRAGMENTS_OVER_THE_LIMIT = Case(
    header(0x01, 40) + b"a" * 40 + header(0x80, 40) + b"b" * 40,
    [42 + 2],  # the second frame's header: the message is over the limit
    64,
    False,
    False,
    True,
)


ENDS_INSIDE_A_FRAME = Case(header(0x81, 10) + b'{"seq"', [], None, False, True, True)
"""The truncated frame is reported as websockets reports it (its bytes, not an end at
a frame boundary)."""


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
@example(FRAGMENTS_OVER_THE_LIMIT)
@example(ENDS_INSIDE_A_FRAME)
def test_direct_reading_shows_what_websockets_shows_after_every_piece(case: Case) -> None:
    expected = asyncio.run(fed(ClientConnection, case))
    assert asyncio.run(fed(DirectFrameConnection, case)) == expected


async def plain_stream_reads_directly() -> list[bool]:
    connection, transport, answer = opened(DirectFrameConnection, 1 << 20, False)
    assert isinstance(connection, DirectFrameConnection)
    text = b'{"seq": 1}'
    states = []
    connection.data_received(answer)
    states.append(connection.reads_directly)
    connection.data_received(header(0x81, len(text)) + text + header(0x81, len(text)))
    states.append(connection.reads_directly)
    connection.data_received(text + header(0x89, 1) + b"p" + header(0x81, 2) + b"{}")
    states.append(connection.reads_directly)
    connection.data_received(header(0x88, 2) + (1000).to_bytes(2, "big"))
    states.append(connection.reads_directly)
    assert [f.data for f in connection.recv_messages.frames.queue] == [text, text, b"{}"]
    assert sent_frames(bytes(transport.written)) == [
        (Opcode.PONG, b"p"),
        (Opcode.CLOSE, (1000).to_bytes(2, "big")),
    ]
    return states


def test_direct_reading_runs_after_the_handshake_and_ends_at_the_close() -> None:
    assert asyncio.run(plain_stream_reads_directly()) == [True, True, True, False]


async def wakes_a_waiting_reader() -> str | bytes:
    connection, _, answer = opened(DirectFrameConnection, 1 << 20, False)
    connection.data_received(answer)
    waiting = asyncio.create_task(connection.recv())
    frames_ = connection.recv_messages.frames
    for _ in range(100):  # until recv() waits on its empty queue
        if frames_.get_waiter is not None:
            break
        await asyncio.sleep(0)
    assert frames_.get_waiter is not None
    connection.data_received(header(0x81, 2) + b"{}")
    return await asyncio.wait_for(waiting, timeout=5)


def test_a_frame_read_directly_wakes_a_reader_waiting_for_one() -> None:
    assert asyncio.run(wakes_a_waiting_reader()) == "{}"


async def compressed_stream_is_left_to_websockets() -> bool:
    connection, _, answer = opened(DirectFrameConnection, 1 << 20, True)
    assert isinstance(connection, DirectFrameConnection)
    encoder = PerMessageDeflate(False, False, 15, 15)
    connection.data_received(answer + Frame(Opcode.TEXT, b"plain").serialize(mask=False))
    assert connection.reads_directly
    connection.data_received(
        Frame(Opcode.TEXT, b"squeezed").serialize(mask=False, extensions=[encoder])
    )
    assert [bytes(f.data) for f in connection.recv_messages.frames.queue] == [
        b"plain",
        b"squeezed",
    ]
    return connection.reads_directly


def test_a_compressed_frame_leaves_the_rest_to_websockets() -> None:
    assert asyncio.run(compressed_stream_is_left_to_websockets()) is False


def test_split_stops_where_websockets_parser_must_take_over() -> None:
    ping = header(0x89, 1) + b"p"
    text = header(0x81, 2) + b"{}"
    frames_, pos, stop, end = split(text + ping + text, 0, 100, True)
    assert ([f.data for f in frames_], pos, stop, end) == ([b"{}"], 4, Stop.OTHER, 7)
    assert split(text + header(0x81, 101), 0, 100, True)[1:3] == (4, Stop.FAILS)
    assert split(text + header(0x81, 5) + b"{", 0, 100, True)[1:3] == (4, Stop.PARTIAL)
    assert split(text + bytes([0x81, 126, 0]), 0, 100, True)[1:3] == (4, Stop.PARTIAL)
    assert split(text, 0, 100, False)[1:] == (0, Stop.OTHER, 4)


async def mixed(ws: ServerConnection) -> None:
    async def fragments() -> Any:
        for part in ('{"seq": ', '"frag', 'mented"}'):
            yield part

    for seq in range(1, 301):
        await ws.send(f'{{"seq": {seq}, "pad": "{"é" * (seq % 7) * 40}"}}')
        if seq % 100 == 0:
            await ws.send(fragments())
            await ws.send(b"\x00\x01binary")
            await ws.ping()
            await ws.send("")
    await ws.close()


async def read_from_a_real_server(cls: type[ClientConnection]) -> tuple[list[Any], bool]:
    async with serve(mixed, "127.0.0.1", 0, compression=None) as server:
        port = server.sockets[0].getsockname()[1]
        async with connect(f"ws://127.0.0.1:{port}", max_queue=16, create_connection=cls) as ws:
            got = []
            direct = False
            async for data in messages(ws):
                got.append(data)
                direct = direct or getattr(ws, "reads_directly", False)
            return got, direct


def test_a_real_server_s_messages_come_out_as_websockets_gives_them() -> None:
    expected, _ = asyncio.run(read_from_a_real_server(ClientConnection))
    got, direct = asyncio.run(read_from_a_real_server(UpstreamConnection))
    assert got == expected
    assert len(got) == 309
    assert direct
