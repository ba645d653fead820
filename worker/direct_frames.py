"""websockets' client connection, reading the common frame itself.

Almost every frame an upstream sends is a whole text or binary message in one
unmasked, uncompressed frame. websockets parses each with a generator-based parser
(``Protocol.parse`` over ``Frame.parse`` over ``StreamReader.read_exact``), then
routes it through its event list to the connection: about 45% of a worker's event
loop at saturation (docs/BENCHMARKS.md, "Throughput"). :class:`DirectFrameConnection`
splits the bytes it receives into frames itself (:func:`split`) and puts each such
frame into websockets' assembler, as websockets' own ``process_event`` would.
Every other frame (control frames, fragments, compressed or masked frames, reserved
bits or opcodes), whole, goes to websockets' parser, which therefore always waits at
a frame boundary and does what it always does with it: answers a ping, takes a pong,
starts the closing handshake, fails the connection on a protocol error.

Direct reading starts once websockets' parser waits at a frame boundary with nothing
buffered and the connection is open (after the handshake); while a fragmented
message is under way each frame goes to websockets' parser whole. It ends for good
at a close, at a frame websockets' parser fails the connection on as soon as its
header is in (a reserved opcode, a masked frame, a length over the size limit: the
rest goes to the parser as it came, so it fails at the same byte), or at a
compressed frame (a compressing upstream is read by websockets throughout:
decompression is its cost). Bytes of a frame not whole yet wait here, at most the
size limit and a header; at the end of the stream they go to websockets' parser,
which reports the truncated frame as it always does. So websockets sees the same
frames, fails on the same bytes and answers the same way as if it had read them all
(``tests/unit/test_direct_frames.py`` checks it frame for frame).

It leans on websockets' internals (the assembler's queue, the parser's generators),
pinned in ``worker/requirements.txt``: should they change, the boundary check finds
no ``at_eof`` and direct reading stays off, and the tests that require it on fail.
"""

from __future__ import annotations

import enum
from collections.abc import Generator
from typing import Any

from websockets.asyncio.client import ClientConnection
from websockets.extensions.permessage_deflate import PerMessageDeflate
from websockets.frames import Frame, Opcode
from websockets.protocol import OPEN, Protocol
from websockets.streams import StreamReader

_TEXT_HEAD = 0x81
"""FIN, no reserved bits, opcode TEXT."""
_BINARY_HEAD = 0x82
"""FIN, no reserved bits, opcode BINARY."""
_RSV1 = 0x40
"""The bit permessage-deflate sets on a compressed message's first frame."""


_OPCODES = frozenset(int(opcode) for opcode in Opcode)
"""The opcodes websockets' parser accepts (any other fails the connection as soon as
the frame's first two bytes are in)."""


class Stop(enum.Enum):
    """Why :func:`split` stopped at a frame."""

    PARTIAL = "it is not whole yet"
    OTHER = "it is whole, and for websockets' parser"
    FAILS = "websockets' parser fails the connection on its header"


def split(
    buf: bytes | bytearray, pos: int, limit: int | None, direct: bool
) -> tuple[list[Frame], int, Stop, int]:
    """The whole text and binary frames (FIN, no reserved bits, unmasked, at most
    ``limit`` bytes) from ``buf[pos:]`` on, as websockets' parser makes them; the
    position of the first frame that is not one, why it is not, and (``OTHER``)
    where that frame ends. ``direct`` False: every frame is ``OTHER``.

    ``FAILS`` when websockets' parser fails the connection on a frame as soon as its
    header is in, as it does: a reserved opcode, a masked frame (a server's frames
    are not), a length over ``limit``."""
    frames: list[Frame] = []
    append = frames.append
    end_of_buf = len(buf)
    text, binary = Opcode.TEXT, Opcode.BINARY
    while True:
        if end_of_buf - pos < 2:
            return frames, pos, Stop.PARTIAL, pos
        head = buf[pos]
        length = buf[pos + 1]
        if length & 0x80 or head & 0x0F not in _OPCODES:
            return frames, pos, Stop.FAILS, pos
        start = pos + 2
        if length == 126:
            start += 2
            if end_of_buf < start:
                return frames, pos, Stop.PARTIAL, pos
            length = (buf[pos + 2] << 8) | buf[pos + 3]
        elif length == 127:
            start += 8
            if end_of_buf < start:
                return frames, pos, Stop.PARTIAL, pos
            length = int.from_bytes(buf[pos + 2 : start], "big")
        if limit is not None and length > limit:
            return frames, pos, Stop.FAILS, pos
        end = start + length
        if end > end_of_buf:
            return frames, pos, Stop.PARTIAL, pos
        if not direct:
            return frames, pos, Stop.OTHER, end
        if head == _TEXT_HEAD:
            append(Frame(text, buf[start:end]))
        elif head == _BINARY_HEAD:
            append(Frame(binary, buf[start:end]))
        else:
            return frames, pos, Stop.OTHER, end
        pos = end


_AT_EOF = StreamReader.at_eof.__code__


def waits_for_a_frame(protocol: Protocol) -> bool:
    """Whether websockets' parser waits at a frame boundary with nothing buffered:
    its innermost generator is the reader's ``at_eof``, which the parser's loop asks
    before each frame (and which yields only while the buffer is empty)."""
    generator: Any = protocol.parser
    inner: Generator[Any, Any, Any] | None
    while (inner := generator.gi_yieldfrom) is not None:
        generator = inner
    return generator.gi_code is _AT_EOF and protocol.state is OPEN


def size_limit(protocol: Protocol) -> int | None:
    """The size limit websockets' parser applies to the next frame (as its
    ``parse`` works it out)."""
    limit = protocol.max_message_size
    if limit is not None and protocol.current_size is not None:
        limit -= protocol.current_size
    fragment = protocol.max_fragment_size
    if fragment is not None:
        limit = fragment if limit is None else min(limit, fragment)
    return limit


class DirectFrameConnection(ClientConnection):
    """``connect(..., create_connection=DirectFrameConnection)`` (or a subclass)."""

    _direct = False
    """Whether received bytes go through :func:`split` (else to websockets' parser)."""
    _ended = False
    """Direct reading ended for good (a close, a failure, a compressing upstream,
    the end of the stream)."""
    _carry: bytearray | None = None
    """Bytes of a frame not whole yet (direct reading only)."""

    def data_received(self, data: bytes) -> None:
        if not self._direct:
            super().data_received(data)
            self._direct = self._may_read_directly()
            return
        protocol = self.protocol
        carry = self._carry
        buf: bytes | bytearray
        if carry:
            carry += data
            buf = carry
        else:
            buf = data
        pos = 0
        while True:
            # Within a fragmented message websockets' parser takes every frame.
            direct = protocol.current_size is None
            frames, pos, stop, end = split(buf, pos, size_limit(protocol), direct)
            if frames:
                self._put(frames)
            if stop is Stop.PARTIAL:
                break
            if stop is Stop.OTHER and not buf[pos] & _RSV1:
                # A bytearray is as good: websockets' reader takes either.
                super().data_received(buf[pos:end])  # type: ignore[arg-type]
                pos = end
                if protocol.state is OPEN:
                    continue
            # A close, a frame the parser fails on, or a compressed frame: the
            # rest, and all that follows, is for websockets' parser.
            self._direct, self._ended, self._carry = False, True, None
            if pos < len(buf):
                super().data_received(buf[pos:])  # type: ignore[arg-type]
            return
        if buf is carry:
            del carry[:pos]
        elif pos < len(buf):
            self._carry = bytearray(buf[pos:])

    def _put(self, frames: list[Frame]) -> None:
        """``recv_messages.put`` of each frame, as websockets' ``process_event`` does,
        in one step: the same frames queued, the same waiter woken, the reading paused
        the same way (``maybe_pause`` pauses once, at the first frame over the mark)."""
        assembler = self.recv_messages
        if assembler.closed:
            raise EOFError("stream of frames ended")
        queue = assembler.frames
        queue.queue.extend(frames)
        waiter = queue.get_waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)
        assembler.maybe_pause()

    def eof_received(self) -> None:
        carry, self._carry = self._carry, None
        self._direct, self._ended = False, True
        if carry:
            super().data_received(bytes(carry))
        super().eof_received()

    @property
    def reads_directly(self) -> bool:
        """Whether the bytes received now go through :func:`split`."""
        return self._direct

    def _may_read_directly(self) -> bool:
        """Whether the next bytes may go through :func:`split`: websockets' parser
        waits for a frame, the connection is open, and nothing but permessage-deflate
        (which leaves an uncompressed message as it is) decodes frames."""
        protocol = self.protocol
        if self._ended or protocol.debug or not waits_for_a_frame(protocol):
            return False
        return all(isinstance(e, PerMessageDeflate) for e in protocol.extensions)
