"""How a connection resumes and reads its upstream (docs/DESIGN.md §4.6).

A connection speaks the protocol its item names (a spec of
:mod:`wsfleet.protocol_specs`: ``json-seq``, ``json-field`` or ``live`` with their
options, or a plug-in registered in ``UPSTREAM_PROTOCOLS``), or, without one, the
worker's default (``UPSTREAM_PROTOCOL``: ``json-seq``, a registered plug-in or a
``module:factory`` one). Each runner builds its own instance
(:func:`worker.protocol_plugins.connection_protocol`), so a protocol may keep
per-connection state.

The built-in ``json-seq``: each message is a JSON object with an integer ``seq``
(starting at 1); on (re)connect the worker appends ``from_seq=<last_seq + 1>`` to
the URL. An object ``{"type": "ping", ...}`` is an application-level ping, answered
with the same object typed ``pong``.

The runner calls, for every connection attempt and in this order:
:meth:`~UpstreamProtocol.resume_url` with the checkpoint, then :func:`open_frames`
(frames sent right after the handshake, before anything is read), then
:func:`resolve_url` (the URL to connect to, from a first call of the plug-in's own),
then, once connected, :meth:`~UpstreamProtocol.decode` for every frame received and
the ``attached(link)`` hook beside it. Plug-ins need only ``resume_url`` and
``decode``; without ``open_frames`` they send nothing, without ``resumable`` they count
as resumable, without ``resolve_url`` they connect to what ``resume_url`` gave. The
whole interface, versioned, is docs/PROTOCOLS.md.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, TypeGuard, runtime_checkable
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from worker import json_decoding
from worker.app_rules import AppRules, Control, Due, KeepaliveClock, keepalive_frame
from worker.inflating import Inflater, Refused
from worker.plugins import PluginError, load_factory
from wsfleet import protocol_specs
from wsfleet.protocol_specs import ProtocolSpec, render_template, resolve_pointer


@dataclass(frozen=True, slots=True)
class Message:
    seq: int
    payload: Any
    prev: int | None = None
    """For a feed numbered by a chain: the seq of the message before this one (steps
    of any size); None for a feed numbered 1, 2, 3..."""


@dataclass(frozen=True, slots=True)
class Reply:
    """Send ``data`` back upstream (an application-level pong); nothing to handle."""

    data: str


@dataclass(frozen=True, slots=True)
class Unreadable:
    """A frame that is not a message of this protocol; logged and counted, skipped."""

    reason: str


@dataclass(frozen=True, slots=True)
class Heard:
    """A control frame the protocol took (the pong to its keepalive): nothing to hand
    on, nothing to answer."""


Frame = Message | Reply | Unreadable | Heard

Read = tuple[int, Any] | Message | Reply | Unreadable | Heard
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


class LinkPort(Protocol):
    """What a protocol's optional ``attached(link)`` hook may do with one open upstream
    connection: it runs as a task of its own from just after the subscribe frames
    until the connection ends, and is cancelled then."""

    def now(self) -> float:
        """The loop's clock, in seconds."""
        ...

    def wall_ms(self) -> int:
        """The wall clock, epoch milliseconds."""
        ...

    async def send(self, data: str) -> bool:
        """Send a frame, only while the runner holds its fence (a superseded owner
        sends nothing); False when it was not sent."""
        ...

    async def recycle(self, reason: str) -> None:
        """Leave this upstream connection (the runner connects again, resuming from
        the checkpoint); ``reason`` shows as the attempt's end."""
        ...

    def keepalive_sent(self) -> None:
        """An application-level keepalive went out (shown in the connection's view)."""
        ...

    def keepalive_answered(self) -> None:
        """The upstream answered one (shown in the connection's view)."""
        ...


async def run_attached(protocol: UpstreamProtocol, link: LinkPort) -> None:
    """The protocol's ``attached`` hook, when it has one."""
    hook = getattr(protocol, "attached", None)
    if hook is not None:
        await hook(link)


class OpenFrameError(ValueError):
    """The frames to send after the handshake cannot be made (a subscribe template
    names a secret field the connection's secret does not have). The message names the
    field, never a value."""


def open_frames(protocol: UpstreamProtocol, last_seq: int, secret: Mapping[str, Any]) -> list[str]:
    """The frames ``protocol`` sends right after the handshake (none for a plug-in
    without ``open_frames``). ``secret``: the string fields of the connection's secret
    (empty without one)."""
    hook = getattr(protocol, "open_frames", None)
    if hook is None:
        return []
    frames: list[str] = hook(last_seq, secret)
    return frames


class ResolveUrlError(Exception):
    """The protocol's ``resolve_url`` failed: the attempt fails as a failed connect
    does. A plug-in may raise it itself with a reason of its own, which shows as the
    attempt's end (and as the parked reason, should the connection park): keep URLs
    and secret values out of it. Any other exception shows as its class only."""


async def resolve_url(
    protocol: UpstreamProtocol, url: str, last_seq: int, secret: Mapping[str, Any]
) -> str:
    """The URL to connect to: what the protocol's ``resolve_url`` makes of ``url``
    (what ``resume_url`` gave), or ``url`` for a protocol without one. Raises
    :class:`ResolveUrlError`."""
    hook = getattr(protocol, "resolve_url", None)
    if hook is None:
        return url
    try:
        resolved = await hook(url, last_seq, secret)
    except ResolveUrlError:
        raise
    except Exception as error:
        # Its text may quote a URL or a credential; the class says enough to start.
        raise ResolveUrlError(f"resolve_url failed: {type(error).__name__}") from error
    if not isinstance(resolved, str):
        raise ResolveUrlError(f"resolve_url gave a {type(resolved).__name__}, not a URL")
    return resolved


def is_resumable(protocol: UpstreamProtocol) -> bool:
    """Whether a new connection can ask the upstream for what came after the
    checkpoint (a plug-in without ``resumable`` is)."""
    return bool(getattr(protocol, "resumable", True))


def restart_rule(protocol: UpstreamProtocol) -> str:
    """When a seq at or below the checkpoint is the upstream starting over (the spec's
    ``restarts``; a plug-in may say with a ``restarts`` attribute): ``on_connect`` when
    it does not say."""
    rule = getattr(protocol, "restarts", protocol_specs.RESTART_MODES[0])
    return rule if rule in protocol_specs.RESTART_MODES else protocol_specs.RESTART_MODES[0]


def with_query(url: str, params: Mapping[str, str]) -> str:
    """``url`` with each of ``params`` set (replacing a parameter of that name)."""
    if not params:
        return url
    parts = urlsplit(url)
    pairs = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k not in params]
    pairs.extend(params.items())
    return urlunsplit(parts._replace(query=urlencode(pairs)))


def _subscribe_frames(template: Any, last_seq: int, secret: Mapping[str, Any]) -> list[str]:
    if template is None:
        return []
    try:
        frame = render_template(template, last_seq=last_seq, secret=secret)
    except KeyError as missing:
        raise OpenFrameError(
            f"the subscribe frame names {missing.args[0]}, which the connection's secret "
            "does not have"
        ) from None
    return [json.dumps(frame, separators=(",", ":"))]


def _json(data: str | bytes) -> Any:
    """The JSON value of a frame; raises ValueError when it is not JSON (or not UTF-8,
    or nested too deep to parse)."""
    try:
        return json_decoding.loads(data)
    except RecursionError:
        raise ValueError("nested too deep") from None


class JsonSeqProtocol:
    """``json-seq``: an integer ``seq`` in each JSON object, resumed with ``from_seq``."""

    resumable = True
    restarts = protocol_specs.RESTART_MODES[0]
    _subscribe: Any = None
    """Class-level too: a plug-in that subclasses this one without calling
    ``__init__`` still works."""

    def __init__(self, subscribe: Any = None, restarts: str | None = None) -> None:
        self._subscribe = subscribe
        if restarts is not None:
            self.restarts = restarts

    def resume_url(self, ws_url: str, last_seq: int) -> str:
        parts = urlsplit(ws_url)
        pairs = parse_qsl(parts.query, keep_blank_values=True)
        query = [(k, v) for k, v in pairs if k != "from_seq"]
        query.append(("from_seq", str(last_seq + 1)))
        return urlunsplit(parts._replace(query=urlencode(query)))

    def open_frames(self, last_seq: int, secret: Mapping[str, Any]) -> list[str]:
        return _subscribe_frames(self._subscribe, last_seq, secret)

    def decode(self, data: str | bytes) -> Frame:
        frame = self.read(data)
        return Message(*frame) if isinstance(frame, tuple) else frame

    def read(self, data: str | bytes) -> tuple[int, Any] | Reply | Unreadable:
        """:meth:`decode` with a message as ``(seq, payload)``: the runner's per-message
        path, one object less per message."""
        try:
            obj = json_decoding.loads(data)
        except (ValueError, RecursionError):  # not JSON, not UTF-8, or nested too deep
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


class JsonFieldProtocol:
    """``json-field``: the sequence number at a JSON pointer, the payload the whole
    object or the value at another; resumed through a URL parameter, the subscribe
    frame, or not at all."""

    def __init__(self, options: Mapping[str, Any]) -> None:
        self._sequence: str = options["sequence"]
        self._payload: str | None = options.get("payload")
        self._resume: str = options.get("resume", protocol_specs.RESUME_NONE)
        self._param: str | None = options.get("resume_param")
        self._subscribe = options.get("subscribe")
        self.resumable = self._resume != protocol_specs.RESUME_NONE
        self.restarts: str = options.get(protocol_specs.RESTARTS, protocol_specs.RESTART_MODES[0])
        self._prev: str | None = options.get(protocol_specs.PREV)
        self._no_seq = f"no integer >= 1 at {self._sequence}"

    def resume_url(self, ws_url: str, last_seq: int) -> str:
        if self._resume == protocol_specs.RESUME_QUERY and self._param is not None:
            return with_query(ws_url, {self._param: str(last_seq + 1)})
        return ws_url

    def open_frames(self, last_seq: int, secret: Mapping[str, Any]) -> list[str]:
        return _subscribe_frames(self._subscribe, last_seq, secret)

    def decode(self, data: str | bytes) -> Frame:
        try:
            doc = _json(data)
        except ValueError:
            return Unreadable("not JSON")
        try:
            seq = resolve_pointer(doc, self._sequence)
        except LookupError:
            return Unreadable(self._no_seq)
        if not _is_seq(seq):
            return Unreadable(self._no_seq)
        prev = None
        if self._prev is not None:
            # A chain's first message may name no predecessor (absent, null, 0 or -1).
            try:
                found = resolve_pointer(doc, self._prev)
            except LookupError:
                found = None
            prev = found if _is_seq(found) else 0
        if self._payload is None:
            return Message(seq, doc, prev)
        try:
            return Message(seq, resolve_pointer(doc, self._payload), prev)
        except LookupError:
            return Unreadable(f"nothing at {self._payload}")


class LiveProtocol:
    """``live``: no sequence. Each message is numbered locally, from the checkpoint on
    (set again at every connection attempt, by :meth:`resume_url`); nothing resumes."""

    resumable = False

    def __init__(self, subscribe: Any = None) -> None:
        self._subscribe = subscribe
        self._next = 1

    def resume_url(self, ws_url: str, last_seq: int) -> str:
        self._next = last_seq + 1
        return ws_url

    def open_frames(self, last_seq: int, secret: Mapping[str, Any]) -> list[str]:
        return _subscribe_frames(self._subscribe, last_seq, secret)

    def decode(self, data: str | bytes) -> Frame:
        try:
            payload = _json(data)
        except ValueError:
            return Unreadable("not JSON")
        seq = self._next
        self._next += 1
        return Message(seq, payload)


def _is_seq(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


class InflatingProtocol:
    """``protocol`` with every binary frame inflated (:class:`~worker.inflating.Inflater`)
    before it reads it; a frame that does not inflate is unreadable."""

    def __init__(self, protocol: UpstreamProtocol, inflater: Inflater) -> None:
        self._protocol = protocol
        self._inflate = inflater
        self._read = reader(protocol)
        self.resumable = is_resumable(protocol)
        self.restarts = restart_rule(protocol)

    def resume_url(self, ws_url: str, last_seq: int) -> str:
        return self._protocol.resume_url(ws_url, last_seq)

    def open_frames(self, last_seq: int, secret: Mapping[str, Any]) -> list[str]:
        return open_frames(self._protocol, last_seq, secret)

    async def attached(self, link: LinkPort) -> None:
        await run_attached(self._protocol, link)

    def read(self, data: str | bytes) -> Read:
        if not isinstance(data, str):
            inflated = self._inflate(bytes(data))
            if isinstance(inflated, Refused):
                return Unreadable(inflated.reason)
            data = inflated
        return self._read(data)

    def decode(self, data: str | bytes) -> Frame:
        frame = self.read(data)
        return Message(*frame) if isinstance(frame, tuple) else frame


class RulesProtocol:
    """``protocol`` with the spec's application-level rules: frames an ``answers``
    rule matches are answered (not messages), the pong to a keepalive is taken, and,
    while a connection is open, keepalive frames go out on time and one unanswered
    past its timeout recycles the connection (:mod:`worker.app_rules`)."""

    def __init__(self, protocol: UpstreamProtocol, options: Mapping[str, Any]) -> None:
        self._protocol = protocol
        self._read = reader(protocol)
        self._rules = AppRules.from_options(options)
        self._keepalive: Mapping[str, Any] | None = options.get(protocol_specs.KEEPALIVE)
        self._clock: KeepaliveClock | None = None
        self._link: LinkPort | None = None
        self.resumable = is_resumable(protocol)
        self.restarts = restart_rule(protocol)

    def resume_url(self, ws_url: str, last_seq: int) -> str:
        return self._protocol.resume_url(ws_url, last_seq)

    def open_frames(self, last_seq: int, secret: Mapping[str, Any]) -> list[str]:
        return open_frames(self._protocol, last_seq, secret)

    def read(self, data: str | bytes) -> Read:
        rules, link = self._rules, self._link
        if rules is not None:
            wall_ms = link.wall_ms() if link is not None else 0
            control = rules.classify(data, wall_ms)
            if isinstance(control, str):
                if self._clock is not None and link is not None:
                    self._clock.sent(link.now())  # the pump sends it right away
                return Reply(control)
            if control is Control.PONG:
                if self._clock is not None:
                    self._clock.pong()
                if link is not None:
                    link.keepalive_answered()
                return Heard()
        return self._read(data)

    def decode(self, data: str | bytes) -> Frame:
        frame = self.read(data)
        return Message(*frame) if isinstance(frame, tuple) else frame

    async def attached(self, link: LinkPort) -> None:
        self._link = link
        inner = asyncio.create_task(run_attached(self._protocol, link))
        try:
            if self._keepalive is not None:
                await self._keep_alive(link, self._keepalive)
            await inner
        finally:
            inner.cancel()
            self._link = None
            self._clock = None

    async def _keep_alive(self, link: LinkPort, keepalive: Mapping[str, Any]) -> None:
        clock = self._clock = KeepaliveClock.from_options(keepalive, link.now())
        while True:
            await asyncio.sleep(max(0.0, clock.next_check() - link.now()))
            now = link.now()
            due = clock.due(now)
            if due is Due.RECYCLE:
                await link.recycle("keepalive not answered")
                return
            if due is Due.SEND:
                if await link.send(keepalive_frame(keepalive, link.wall_ms())):
                    clock.keepalive_sent(now)
                    link.keepalive_sent()
                else:
                    clock.sent(now)  # fenced: try again an interval later, not at once


DEFAULT_MAX_MESSAGE_BYTES = 1 << 20
"""What a frame may inflate to when the caller names no limit (the worker passes its
``MAX_MESSAGE_BYTES``)."""


def from_spec(
    spec: ProtocolSpec, max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
) -> UpstreamProtocol:
    """A fresh instance of the built-in protocol ``spec`` names; with ``inflate``, its
    binary frames inflated, to ``max_message_bytes`` at most."""
    protocol: UpstreamProtocol
    if spec.name == protocol_specs.JSON_FIELD:
        protocol = JsonFieldProtocol(spec.options)
    elif spec.name == protocol_specs.LIVE:
        protocol = LiveProtocol(spec.subscribe)
    else:
        protocol = JsonSeqProtocol(spec.subscribe, spec.options.get(protocol_specs.RESTARTS))
    options = spec.options
    if protocol_specs.KEEPALIVE in options or protocol_specs.ANSWERS in options:
        protocol = RulesProtocol(protocol, options)
    mode = options.get(protocol_specs.INFLATE)
    if mode is None:
        return protocol
    # Outermost: the rules and the protocol read the inflated frame.
    return InflatingProtocol(protocol, Inflater(mode, max_message_bytes))


def protocol_for(
    stored: str | None,
    default: UpstreamProtocol,
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
) -> UpstreamProtocol:
    """The protocol of a connection whose item stores ``stored`` (its spec, or None:
    ``default``, the worker's ``UPSTREAM_PROTOCOL``), among the built-ins only; the
    runner's :func:`worker.protocol_plugins.connection_protocol` adds the registered
    plug-ins. Raises :class:`~wsfleet.protocol_specs.InvalidProtocolError` for a stored
    spec that does not validate."""
    spec = protocol_specs.spec_from_item(stored)
    return default if spec is None else from_spec(spec, max_message_bytes)


def load_protocol(spec: str) -> UpstreamProtocol:
    if spec == "json-seq":
        return JsonSeqProtocol()
    protocol = load_factory(spec, setting="UPSTREAM_PROTOCOL")
    if not isinstance(protocol, UpstreamProtocol):
        raise PluginError(f"UPSTREAM_PROTOCOL: {spec} made {protocol!r}, not a protocol")
    return protocol
