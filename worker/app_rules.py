"""Application-level keepalives and answers, as a protocol spec states them
(``keepalive`` and ``answers``, :mod:`wsfleet.protocol_specs`): which received frames
are control frames (a server's ping to answer, the pong to a keepalive), and when to
send a keepalive or give the connection up. Pure: the clock is fed in, nothing is
sent here.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from worker import json_decoding
from wsfleet.protocol_specs import render_frame, resolve_pointer

_NOT_JSON: Final = object()
_UNREAD: Final = object()
"""Not decoded yet (``None`` is a JSON value: null)."""


class FrameView:
    """One received frame, decoded as JSON at most once, and only when a rule needs it."""

    __slots__ = ("_doc", "data")

    def __init__(self, data: str | bytes) -> None:
        self.data = data
        self._doc: Any = _UNREAD

    @property
    def doc(self) -> Any:
        """The JSON value, or :data:`_NOT_JSON`."""
        if self._doc is _UNREAD:
            try:
                self._doc = json_decoding.loads(self.data)
            except (ValueError, RecursionError):
                self._doc = _NOT_JSON
        return self._doc


_ANY: Final = object()


@dataclass(frozen=True, slots=True)
class Matcher:
    """Matches a text frame exactly, or a JSON frame with a value at a pointer (equal
    to ``equals`` when given)."""

    text: str | None = None
    pointer: str | None = None
    equals: Any = _ANY

    @classmethod
    def from_spec(cls, spec: Mapping[str, Any]) -> Matcher:
        if "text" in spec:
            return cls(text=spec["text"])
        return cls(pointer=spec["pointer"], equals=spec.get("equals", _ANY))

    def matches(self, frame: FrameView) -> bool:
        if self.text is not None:
            return frame.data == self.text
        assert self.pointer is not None
        # Cheap first: a frame that does not hold the pointer's last key as text
        # cannot hold it as JSON (the common data frame is never parsed twice).
        key = self.pointer.rsplit("/", 1)[-1].replace("~1", "/").replace("~0", "~")
        raw = frame.data
        if key and (key not in raw if isinstance(raw, str) else key.encode() not in raw):
            return False
        doc = frame.doc
        if doc is _NOT_JSON:
            return False
        try:
            value = resolve_pointer(doc, self.pointer)
        except LookupError:
            return False
        return self.equals is _ANY or (value == self.equals and type(value) is type(self.equals))


@dataclass(frozen=True, slots=True)
class Answer:
    match: Matcher
    reply: Any
    """The template of the frame sent back (``${frame:<pointer>}``, ``${now_ms}``)."""


class Control(enum.Enum):
    """A received frame that is not a message."""

    PONG = "pong"
    """The answer to our keepalive."""


@dataclass(frozen=True, slots=True)
class AppRules:
    answers: Sequence[Answer]
    pong: Matcher | None

    @classmethod
    def from_options(cls, options: Mapping[str, Any]) -> AppRules | None:
        """The rules an options mapping states (None: no answers and no pong)."""
        answers = [
            Answer(Matcher.from_spec(a["match"]), a["reply"]) for a in options.get("answers", ())
        ]
        keepalive = options.get("keepalive") or {}
        pong = Matcher.from_spec(keepalive["pong"]) if "pong" in keepalive else None
        if not answers and pong is None:
            return None
        return cls(answers, pong)

    def classify(self, data: str | bytes, now_ms: int) -> str | Control | None:
        """The text to send back (a frame an answer matches), PONG, or None: not a
        control frame (the protocol reads it)."""
        frame = FrameView(data)
        for answer in self.answers:
            if answer.match.matches(frame):
                doc = frame.doc
                return render_frame(
                    answer.reply, now_ms=now_ms, frame=None if doc is _NOT_JSON else doc
                )
        if self.pong is not None and self.pong.matches(frame):
            return Control.PONG
        return None


class Due(enum.Enum):
    SEND = "send"
    """Send the keepalive frame now."""
    RECYCLE = "recycle"
    """The last keepalive went unanswered past its timeout: leave this connection."""


class KeepaliveClock:
    """When to send a keepalive frame and when one went unanswered, in loop time.

    ``idle``: send once nothing was sent for that long (any frame the client sends
    counts: a subscribe, an answer, a keepalive); ``every``: send at that interval
    whatever else was sent. With ``timeout`` (a pong matcher is set), a keepalive with
    no pong within it recycles the connection."""

    def __init__(
        self, *, idle: float | None, every: float | None, timeout: float | None, now: float
    ) -> None:
        if idle is None and every is None:
            raise ValueError("idle or every is required")
        self._idle = idle
        self._every = every
        self._timeout = timeout
        self._last_sent = now
        self._next_every = None if every is None else now + every
        self._awaiting: float | None = None
        """When the unanswered keepalive was sent (None: none awaits a pong)."""

    @classmethod
    def from_options(cls, keepalive: Mapping[str, Any], now: float) -> KeepaliveClock:
        idle, every = keepalive.get("idle_seconds"), keepalive.get("every_seconds")
        timeout = None
        if "pong" in keepalive:
            timeout = keepalive.get("timeout_seconds") or min(x for x in (idle, every) if x)
        return cls(idle=idle, every=every, timeout=timeout, now=now)

    def sent(self, now: float) -> None:
        """The client sent a frame."""
        self._last_sent = max(self._last_sent, now)

    def keepalive_sent(self, now: float) -> None:
        self.sent(now)
        if self._every is not None:
            self._next_every = now + self._every
        if self._timeout is not None and self._awaiting is None:
            self._awaiting = now

    def pong(self) -> None:
        self._awaiting = None

    def due(self, now: float) -> Due | None:
        awaiting, timeout = self._awaiting, self._timeout
        if awaiting is not None and timeout is not None and now >= awaiting + timeout:
            return Due.RECYCLE
        if self._idle is not None and now >= self._last_sent + self._idle:
            return Due.SEND
        if self._next_every is not None and now >= self._next_every:
            return Due.SEND
        return None

    def next_check(self) -> float:
        """The loop time by which :meth:`due` may next say something."""
        times = []
        if self._idle is not None:
            times.append(self._last_sent + self._idle)
        if self._next_every is not None:
            times.append(self._next_every)
        if self._awaiting is not None and self._timeout is not None:
            times.append(self._awaiting + self._timeout)
        return min(times)


def keepalive_frame(keepalive: Mapping[str, Any], now_ms: int) -> str:
    return render_frame(keepalive["frame"], now_ms=now_ms, frame=None)
