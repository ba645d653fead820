"""Which upstream protocol a connection speaks, and with which options: the spec a
start may carry (``"protocol": {"name": ..., "options": {...}}``), validated by the
router, stored on the connection item, read by the worker that runs it.

Pure and dependency-free (the worker image has no pydantic): the router validates
with :func:`parse_spec`, the worker reads the stored form with :func:`spec_from_item`
and fills subscribe templates with :func:`render_template`. A connection without a
spec speaks the worker's default protocol (``UPSTREAM_PROTOCOL``).

A spec may also name a plug-in the deployment registered (``UPSTREAM_PROTOCOLS``,
:mod:`wsfleet.protocol_registry`): both functions take the registered names as
``plugins``. A plug-in's options are its own, any JSON object within
:data:`MAX_SPEC_BYTES`; only the plug-in knows what they mean, so only their shape and
size are checked here (the worker hands them to the plug-in's ``configure``).

The built-in protocols (docs/DESIGN.md §4.6):

- ``json-seq``: JSON objects with an integer ``seq``; resumes with ``from_seq=<next>``
  in the URL. No options.
- ``json-field``: JSON objects whose sequence number is at a JSON pointer
  (``sequence``, e.g. ``"/sequence"``); the handler gets the whole object, or the value
  at ``payload`` when given. It resumes as ``resume`` says: ``"query"`` (the next seq in
  the URL parameter ``resume_param``), ``"subscribe"`` (the ``subscribe`` frame
  carries it, through a ``${from_seq}`` or ``${last_seq}`` placeholder) or ``"none"``
  (the stream cannot resume: a move loses what was sent in between).
- Both take ``restarts``: when a seq at or below the checkpoint is the upstream
  starting its sequence over rather than a copy: ``"on_connect"`` (the default: as
  the first message of an upstream connection), ``"anytime"`` or ``"never"``. A
  restart begins a new sequence generation of the connection (``seq_gen``); nothing
  is dropped. ``json-field`` also takes ``prev``: the JSON pointer of the seq the
  message says came before it, for a feed numbered by a chain (steps of any size).
- ``live``: no sequence at all. Each message gets a local number; nothing resumes, and
  the time between two owners' deliveries is measured as a gap.

Any protocol may take ``inflate`` (``"gzip"``, ``"zlib"``, ``"deflate"`` or ``"auto"``:
gzip or zlib by their header, anything else as it came): each binary frame is
inflated before it is read, to at most the worker's ``MAX_MESSAGE_BYTES`` (a frame
that inflates past it is refused as unreadable, counted, and the stream goes on).

Any protocol may send a ``subscribe`` frame right after the handshake: a JSON value
in which a string that is exactly a placeholder is replaced when the frame is sent:
``${from_seq}`` and ``${last_seq}`` (numbers: the next seq and the checkpoint), and
``${secret:<field>}`` (a string field of the connection's secret, resolved by the
worker; never stored, never logged).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

JSON_SEQ: Final = "json-seq"
JSON_FIELD: Final = "json-field"
LIVE: Final = "live"
PROTOCOL_NAMES: Final = (JSON_SEQ, JSON_FIELD, LIVE)

RESUME_QUERY: Final = "query"
RESUME_SUBSCRIBE: Final = "subscribe"
RESUME_NONE: Final = "none"
RESUME_MODES: Final = (RESUME_QUERY, RESUME_SUBSCRIBE, RESUME_NONE)

INFLATE: Final = "inflate"
INFLATE_MODES: Final = ("gzip", "zlib", "deflate", "auto")
RESTARTS: Final = "restarts"
RESTART_MODES: Final = ("on_connect", "anytime", "never")
PREV: Final = "prev"
KEEPALIVE: Final = "keepalive"
ANSWERS: Final = "answers"
COMMON_OPTIONS: Final = frozenset({"subscribe", INFLATE, KEEPALIVE, ANSWERS})
"""Options every built-in protocol takes."""

MAX_SPEC_BYTES: Final = 4096
"""The stored spec (compact JSON) at most: it rides on the connection item."""
MAX_POINTER_CHARS: Final = 256
MAX_PARAM_CHARS: Final = 64

FROM_SEQ: Final = "${from_seq}"
LAST_SEQ: Final = "${last_seq}"
_SECRET_FIELD = re.compile(r"^\$\{secret:([A-Za-z0-9_.-]{1,64})\}$")
NOW_MS: Final = "${now_ms}"
"""In a keepalive frame: the worker's wall clock, epoch milliseconds (a number)."""
_FRAME_VALUE = re.compile(r"^\$\{frame:(/[^}]*)\}$")
"""In an answer's reply: the value at that JSON pointer of the frame answered."""
MAX_ANSWERS: Final = 8
MIN_KEEPALIVE_SECONDS: Final = 0.1
MAX_KEEPALIVE_SECONDS: Final = 3600.0
_PLACEHOLDER = re.compile(r"^\$\{[^}]*\}$")
_PARAM = re.compile(r"^[A-Za-z0-9_.~-]+$")


class InvalidProtocolError(ValueError):
    """The spec cannot be used; the message says why, for a 400 answer."""


class UnknownProtocolError(InvalidProtocolError):
    """The spec names a protocol that is neither built in nor registered; the message
    lists those that are."""

    def __init__(self, name: Any, plugins: Collection[str]) -> None:
        self.name = name
        self.known = [*PROTOCOL_NAMES, *sorted(set(plugins) - set(PROTOCOL_NAMES))]
        super().__init__(
            f"protocol name must be one of {self.known}, got {name!r} (plug-in protocols are "
            "those the deployment registers in UPSTREAM_PROTOCOLS)"
        )


@dataclass(frozen=True, slots=True)
class ProtocolSpec:
    name: str
    options: Mapping[str, Any] = field(default_factory=dict)

    def to_item(self) -> str:
        """The stored form: compact JSON, keys sorted (two equal specs store alike).
        Strict JSON: NaN and the infinities raise :class:`ValueError`."""
        return json.dumps(
            {"name": self.name, "options": dict(self.options)},
            separators=(",", ":"),
            sort_keys=True,
            allow_nan=False,
        )

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "options": dict(self.options)}

    @property
    def resumable(self) -> bool:
        """Whether a new owner can ask the upstream for what came after the checkpoint."""
        if self.name == LIVE:
            return False
        if self.name == JSON_FIELD:
            return bool(self.options.get("resume", RESUME_NONE) != RESUME_NONE)
        return True

    @property
    def subscribe(self) -> Any | None:
        """The frame to send after the handshake (a template), if any."""
        return self.options.get("subscribe")


def spec_from_item(stored: str | None, *, plugins: Collection[str] = ()) -> ProtocolSpec | None:
    """The spec stored on an item (None: the worker's default). A stored spec that no
    longer validates (written by a newer router, or naming a plug-in that is not among
    ``plugins``: deployments out of step) raises :class:`InvalidProtocolError`."""
    if stored is None:
        return None
    if not isinstance(stored, str):
        raise InvalidProtocolError("stored protocol is not a string")
    try:
        raw = json.loads(stored)
    except ValueError as error:
        raise InvalidProtocolError(f"stored protocol is not JSON: {error}") from None
    return parse_spec(raw, plugins=plugins)


def parse_spec(raw: Any, *, plugins: Collection[str] = ()) -> ProtocolSpec:
    """Validate a spec as a start request carries it; ``plugins``: the names of the
    plug-in protocols the deployment registered."""
    if not isinstance(raw, dict):
        raise InvalidProtocolError('protocol must be an object {"name": ..., "options": {...}}')
    unknown = set(raw) - {"name", "options"}
    if unknown:
        raise InvalidProtocolError(f"protocol has unknown keys: {sorted(unknown)}")
    name = raw.get("name")
    if not isinstance(name, str) or (name not in PROTOCOL_NAMES and name not in plugins):
        raise UnknownProtocolError(name, plugins)
    check = _CHECKS.get(name)
    options = raw.get("options", {})
    if not isinstance(options, dict):
        raise InvalidProtocolError("protocol options must be an object")
    spec = ProtocolSpec(name, options)
    try:
        stored = spec.to_item()
    except ValueError:
        raise InvalidProtocolError(
            "protocol options must be plain JSON: numbers must be finite (no NaN or Infinity)"
        ) from None
    size = len(stored.encode())
    if size > MAX_SPEC_BYTES:
        raise InvalidProtocolError(
            f"protocol spec is {size} bytes as JSON, more than {MAX_SPEC_BYTES}"
        )
    if check is not None:  # a plug-in's options are the plug-in's to judge
        check(options)
    return spec


# --- options, protocol by protocol --------------------------------------------------------


def _only(options: Mapping[str, Any], allowed: set[str], name: str) -> None:
    unknown = set(options) - allowed
    if unknown:
        allowed_text = sorted(allowed) if allowed else "none"
        raise InvalidProtocolError(
            f"{name} options: unknown {sorted(unknown)} (allowed: {allowed_text})"
        )


def _check_common(options: Mapping[str, Any], name: str) -> None:
    mode = options.get(INFLATE)
    if mode is not None and mode not in INFLATE_MODES:
        raise InvalidProtocolError(
            f"{name} options: inflate must be one of {list(INFLATE_MODES)}, got {mode!r}"
        )
    if KEEPALIVE in options:
        check_keepalive(options[KEEPALIVE], f"{name} options: keepalive")
    if ANSWERS in options:
        check_answers(options[ANSWERS], f"{name} options: answers")


def check_match(match: Any, what: str) -> None:
    """A frame matcher: ``{"text": "<exact text frame>"}``, or ``{"pointer": "/p"}`` (a
    JSON frame with a value there) with an optional ``"equals"`` (that value, a
    string, number, boolean or null)."""
    if not isinstance(match, dict):
        raise InvalidProtocolError(f"{what} must be an object with text or pointer")
    if set(match) == {"text"}:
        if not isinstance(match["text"], str) or not match["text"]:
            raise InvalidProtocolError(f"{what}: text must be a non-empty string")
        return
    if "pointer" not in match or set(match) - {"pointer", "equals"}:
        raise InvalidProtocolError(
            f'{what} must be {{"text": ...}} or {{"pointer": ..., "equals"?: ...}}, '
            f"got keys {sorted(match)}"
        )
    check_pointer(match["pointer"], f"{what}: pointer")
    if "equals" in match and isinstance(match["equals"], (dict, list)):
        raise InvalidProtocolError(f"{what}: equals must be a string, number, boolean or null")


def _seconds(value: Any, what: str) -> None:
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not MIN_KEEPALIVE_SECONDS <= value <= MAX_KEEPALIVE_SECONDS
    ):
        raise InvalidProtocolError(
            f"{what} must be a number of seconds from {MIN_KEEPALIVE_SECONDS:g} to "
            f"{MAX_KEEPALIVE_SECONDS:g}, got {value!r}"
        )


def check_keepalive(keepalive: Any, what: str) -> None:
    """``{"frame": <template>, "idle_seconds"?, "every_seconds"?, "pong"?: <match>,
    "timeout_seconds"?}``: send ``frame`` once nothing was sent for ``idle_seconds``,
    and/or every ``every_seconds``; with ``pong``, a keepalive not answered by a frame
    it matches within ``timeout_seconds`` (default: the interval) recycles the
    connection."""
    if not isinstance(keepalive, dict):
        raise InvalidProtocolError(f"{what} must be an object")
    allowed = {"frame", "idle_seconds", "every_seconds", "pong", "timeout_seconds"}
    unknown = set(keepalive) - allowed
    if unknown:
        raise InvalidProtocolError(
            f"{what}: unknown {sorted(unknown)} (allowed: {sorted(allowed)})"
        )
    if "frame" not in keepalive:
        raise InvalidProtocolError(f"{what}: frame (the text or JSON value to send) is required")
    if "idle_seconds" not in keepalive and "every_seconds" not in keepalive:
        raise InvalidProtocolError(f"{what}: idle_seconds or every_seconds is required")
    for key in ("idle_seconds", "every_seconds", "timeout_seconds"):
        if key in keepalive:
            _seconds(keepalive[key], f"{what}: {key}")
    if "timeout_seconds" in keepalive and "pong" not in keepalive:
        raise InvalidProtocolError(f"{what}: timeout_seconds goes with pong")
    if "pong" in keepalive:
        check_match(keepalive["pong"], f"{what}: pong")
    _check_frame_template(keepalive["frame"], f"{what}: frame", allowed=(NOW_MS,))


def check_answers(answers: Any, what: str) -> None:
    """``[{"match": <match>, "reply": <template>}, ...]``: a frame a rule matches is
    not a message; it is answered with ``reply``, in which ``${frame:<pointer>}`` is the
    value at that pointer of the frame answered."""
    if not isinstance(answers, list) or not 1 <= len(answers) <= MAX_ANSWERS:
        raise InvalidProtocolError(f"{what} must be a list of 1 to {MAX_ANSWERS} rules")
    for number, rule in enumerate(answers):
        where = f"{what}[{number}]"
        if not isinstance(rule, dict) or set(rule) != {"match", "reply"}:
            raise InvalidProtocolError(f'{where} must be {{"match": ..., "reply": ...}}')
        check_match(rule["match"], f"{where}: match")
        _check_frame_template(rule["reply"], f"{where}: reply", allowed=(NOW_MS,), frame=True)


def _check_frame_template(
    template: Any, what: str, *, allowed: tuple[str, ...], frame: bool = False
) -> None:
    """A frame to send: a string is sent as that text, any other JSON value as JSON;
    whole-string placeholders only from ``allowed`` (and ``${frame:<pointer>}``)."""
    for text in _strings(template):
        if not _PLACEHOLDER.match(text) or text in allowed:
            continue
        found = _FRAME_VALUE.match(text)
        if frame and found:
            check_pointer(found.group(1), f"{what}: {text}")
            continue
        known = [*allowed, *(["${frame:<pointer>}"] if frame else [])]
        raise InvalidProtocolError(f"{what}: unknown placeholder {text!r} (known: {known})")


def _check_restarts(options: Mapping[str, Any], name: str) -> None:
    mode = options.get(RESTARTS)
    if mode is not None and mode not in RESTART_MODES:
        raise InvalidProtocolError(
            f"{name} options: restarts must be one of {list(RESTART_MODES)}, got {mode!r}"
        )


def _check_json_seq(options: Mapping[str, Any]) -> None:
    _only(options, {RESTARTS, *COMMON_OPTIONS}, JSON_SEQ)
    _check_common(options, JSON_SEQ)
    _check_restarts(options, JSON_SEQ)
    _check_template(options.get("subscribe"), seq_placeholders=True)


def _check_json_field(options: Mapping[str, Any]) -> None:
    _only(
        options,
        {"sequence", "payload", "resume", "resume_param", RESTARTS, PREV, *COMMON_OPTIONS},
        JSON_FIELD,
    )
    _check_common(options, JSON_FIELD)
    _check_restarts(options, JSON_FIELD)
    if "sequence" not in options:
        raise InvalidProtocolError('json-field options: "sequence" (a JSON pointer) is required')
    check_pointer(options["sequence"], "sequence")
    if PREV in options:
        check_pointer(options[PREV], PREV)
    if "payload" in options:
        check_pointer(options["payload"], "payload")
    resume = options.get("resume", RESUME_NONE)
    if resume not in RESUME_MODES:
        raise InvalidProtocolError(
            f"json-field options: resume must be one of {list(RESUME_MODES)}, got {resume!r}"
        )
    param = options.get("resume_param")
    if resume == RESUME_QUERY:
        if not isinstance(param, str) or not _PARAM.match(param) or len(param) > MAX_PARAM_CHARS:
            raise InvalidProtocolError(
                'json-field options: resume "query" needs "resume_param", a URL parameter '
                f"name of letters, digits and _.~- (at most {MAX_PARAM_CHARS})"
            )
    elif param is not None:
        raise InvalidProtocolError('json-field options: "resume_param" goes with resume "query"')
    template = options.get("subscribe")
    _check_template(template, seq_placeholders=True)
    if resume == RESUME_SUBSCRIBE and (template is None or not _uses_seq(template)):
        raise InvalidProtocolError(
            'json-field options: resume "subscribe" needs a "subscribe" frame with a '
            f"{FROM_SEQ} or {LAST_SEQ} placeholder"
        )


def _check_live(options: Mapping[str, Any]) -> None:
    _only(options, set(COMMON_OPTIONS), LIVE)
    _check_common(options, LIVE)
    _check_template(options.get("subscribe"), seq_placeholders=False)


_CHECKS: Final[dict[str, Callable[[Mapping[str, Any]], None]]] = {
    JSON_SEQ: _check_json_seq,
    JSON_FIELD: _check_json_field,
    LIVE: _check_live,
}


def check_pointer(pointer: Any, what: str) -> None:
    """An RFC 6901 JSON pointer such as ``/data/seq`` (``~0`` and ``~1`` escapes)."""
    if (
        not isinstance(pointer, str)
        or not pointer.startswith("/")
        or len(pointer) > MAX_POINTER_CHARS
        or re.search(r"~[^01]|~$", pointer)
    ):
        raise InvalidProtocolError(
            f"{what} must be a JSON pointer such as /sequence (at most {MAX_POINTER_CHARS} "
            f"characters), got {pointer!r}"
        )


def _strings(template: Any) -> list[str]:
    if isinstance(template, str):
        return [template]
    if isinstance(template, dict):
        return [s for value in template.values() for s in _strings(value)]
    if isinstance(template, list):
        return [s for value in template for s in _strings(value)]
    return []


def _uses_seq(template: Any) -> bool:
    return any(s in (FROM_SEQ, LAST_SEQ) for s in _strings(template))


def _check_template(template: Any, *, seq_placeholders: bool) -> None:
    if template is None:
        return
    for text in _strings(template):
        if not _PLACEHOLDER.match(text):
            continue
        if text in (FROM_SEQ, LAST_SEQ):
            if not seq_placeholders:
                raise InvalidProtocolError(
                    f"subscribe: {text} has no meaning for a protocol without sequence numbers"
                )
            continue
        if not _SECRET_FIELD.match(text):
            raise InvalidProtocolError(
                f"subscribe: unknown placeholder {text!r} (known: {FROM_SEQ}, {LAST_SEQ}, "
                "${secret:<field>})"
            )


def secret_fields(template: Any) -> set[str]:
    """The secret fields a subscribe template names."""
    fields = set()
    for text in _strings(template):
        match = _SECRET_FIELD.match(text)
        if match:
            fields.add(match.group(1))
    return fields


def render_template(template: Any, *, last_seq: int, secret: Mapping[str, Any]) -> Any:
    """``template`` with every placeholder string replaced. A secret field that is
    missing raises :class:`KeyError` naming the field (never its value)."""
    if isinstance(template, dict):
        return {
            k: render_template(v, last_seq=last_seq, secret=secret) for k, v in template.items()
        }
    if isinstance(template, list):
        return [render_template(v, last_seq=last_seq, secret=secret) for v in template]
    if isinstance(template, str):
        if template == FROM_SEQ:
            return last_seq + 1
        if template == LAST_SEQ:
            return last_seq
        match = _SECRET_FIELD.match(template)
        if match:
            name = match.group(1)
            if name not in secret:
                raise KeyError(f"secret field {name!r}")
            return secret[name]
    return template


def render_frame(template: Any, *, now_ms: int, frame: Any | None) -> str:
    """A keepalive or an answer as the text sent: a string template is sent as that
    text, any other JSON value as compact JSON; ``${now_ms}`` is the wall clock and
    ``${frame:<pointer>}`` the value there in ``frame`` (the frame answered; null when
    it has none)."""
    value = _fill(template, now_ms, frame)
    if isinstance(value, str):
        return value
    return json.dumps(value, separators=(",", ":"))


def _fill(template: Any, now_ms: int, frame: Any | None) -> Any:
    if isinstance(template, dict):
        return {k: _fill(v, now_ms, frame) for k, v in template.items()}
    if isinstance(template, list):
        return [_fill(v, now_ms, frame) for v in template]
    if isinstance(template, str):
        if template == NOW_MS:
            return now_ms
        found = _FRAME_VALUE.match(template)
        if found:
            try:
                return resolve_pointer(frame, found.group(1))
            except LookupError:
                return None
    return template


_MISSING = object()


def resolve_pointer(document: Any, pointer: str) -> Any:
    """The value at ``pointer`` in ``document``; :class:`LookupError` when absent."""
    value = document
    for token in pointer.split("/")[1:]:
        key = token.replace("~1", "/").replace("~0", "~")
        if isinstance(value, dict):
            value = value.get(key, _MISSING)
        elif isinstance(value, list) and key.isdigit() and int(key) < len(value):
            value = value[int(key)]
        else:
            value = _MISSING
        if value is _MISSING:
            raise LookupError(pointer)
    return value
