"""How a connection resumes and reads its upstream (``UPSTREAM_PROTOCOL``).

The default ``json-seq``: each message is a JSON object with an integer ``seq``
(starting at 1); on (re)connect the worker appends ``from_seq=<last_seq + 1>`` to
the URL. An object ``{"type": "ping", ...}`` is an application-level ping, answered
with the same object typed ``pong``. Other protocols plug in as ``module:factory``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from worker.plugins import PluginError, load_factory


@dataclass(frozen=True, slots=True)
class Message:
    seq: int
    payload: Any


@dataclass(frozen=True, slots=True)
class Reply:
    """Send ``data`` back upstream (an application-level pong); nothing to handle."""

    data: str


@dataclass(frozen=True, slots=True)
class Unreadable:
    """A frame that is not a message of this protocol; logged and counted, skipped."""

    reason: str


Frame = Message | Reply | Unreadable

Read = tuple[int, Any] | Message | Reply | Unreadable
"""What the runner takes from a protocol: :meth:`JsonSeqProtocol.read` gives a message
as ``(seq, payload)``, a plug-in's ``decode`` as a :class:`Message`."""


@runtime_checkable
class UpstreamProtocol(Protocol):
    def resume_url(self, ws_url: str, last_seq: int) -> str:
        """The URL to connect to so the stream resumes after ``last_seq``."""
        ...

    def decode(self, data: str | bytes) -> Frame:
        """Classify one received frame. Must not raise."""
        ...


class JsonSeqProtocol:
    def resume_url(self, ws_url: str, last_seq: int) -> str:
        parts = urlsplit(ws_url)
        pairs = parse_qsl(parts.query, keep_blank_values=True)
        query = [(k, v) for k, v in pairs if k != "from_seq"]
        query.append(("from_seq", str(last_seq + 1)))
        return urlunsplit(parts._replace(query=urlencode(query)))

    def decode(self, data: str | bytes) -> Frame:
        frame = self.read(data)
        return Message(*frame) if isinstance(frame, tuple) else frame

    def read(self, data: str | bytes) -> tuple[int, Any] | Reply | Unreadable:
        """:meth:`decode` with a message as ``(seq, payload)``: the runner's per-message
        path, one object less per message."""
        try:
            obj = json.loads(data)
        except (ValueError, UnicodeDecodeError):
            return Unreadable("not JSON")
        if type(obj) is not dict:
            return Unreadable("not a JSON object")
        if obj.get("type") == "ping":
            return Reply(json.dumps({**obj, "type": "pong"}, separators=(",", ":")))
        seq = obj.get("seq")
        # JSON numbers decode to int, float or bool, never to another int subclass.
        if type(seq) is not int or seq < 1:
            return Unreadable("no integer seq >= 1")
        return seq, obj


def reader(protocol: UpstreamProtocol) -> Callable[[str | bytes], Read]:
    """The protocol's ``read`` when it has one (the built-in protocol), else its
    ``decode``."""
    read = getattr(protocol, "read", None)
    return read if callable(read) else protocol.decode


def load_protocol(spec: str) -> UpstreamProtocol:
    if spec == "json-seq":
        return JsonSeqProtocol()
    protocol = load_factory(spec, setting="UPSTREAM_PROTOCOL")
    if not isinstance(protocol, UpstreamProtocol):
        raise PluginError(f"UPSTREAM_PROTOCOL: {spec} made {protocol!r}, not a protocol")
    return protocol
