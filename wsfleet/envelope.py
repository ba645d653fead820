"""The record the built-in sinks write for each message, and how a consumer reads it.

One envelope is one message of one connection, as compact JSON in UTF-8::

    {"connection_id":"btc-eth","epoch":3,"seq_gen":0,"seq":42,"prev_seq":41,"received_at":1767225604100,"payload":{...}}

The keys are always the six of :data:`KEYS`, in this order, plus ``prev_seq`` right
after ``seq`` in every envelope the sinks write but the first of a connection in a
sink call. ``(connection_id, seq_gen, seq)`` names the message: the
sinks are at-least-once, so a consumer drops an envelope whose name it has already
seen. ``epoch`` is the lease epoch of the worker that sent it (a higher one means a
later owner); ``received_at`` is the sending worker's wall clock, epoch milliseconds,
when it handed the batch to the sink (informational: it differs between two copies of
one message).

``prev_seq`` is the seq of the message the sending worker put just before this one in
the same sink call (same connection and ``seq_gen``). The sinks send a partly refused
request's records again in order from a connection's first refused one, so a message
whose ``prev_seq`` a consumer has not applied yet came early and will come again after
it (:mod:`wsfleet.deduper`, EARLY). Absent: the first message of a connection in a
call, and those of a worker older than the key.

``set_aside``, last, replaces the payload (then ``null``) of a message the sink could
never send: its payload is not JSON (NaN, an infinity), its record is over the
service's limit, or the service refused it for good. It is an object: ``reason``
(``not_json``, ``too_large`` or ``refused``), ``detail`` (what was wrong, for people),
``bytes`` (the size of the record that could not be sent) and, when it fits,
``text``: the payload as Python's JSON writer gives it (``NaN`` and ``Infinity`` as
such), so nothing of a message that is only not JSON is lost. The message keeps its
place in the stream, so a consumer applies it like any other (and shows it as set
aside) and nothing after it waits; the worker logs it, with its seqs and an excerpt,
and counts it (``SinkMessagesSetAside``).

This module is shared by the worker's sinks and by consumers, so it imports nothing
of the worker.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Final

from wsfleet.schema import is_valid_connection_id

KEYS: Final = ("connection_id", "epoch", "seq_gen", "seq", "received_at", "payload")
"""The keys every envelope has, in the order :meth:`Envelope.to_bytes` writes them."""
PREV_SEQ: Final = "prev_seq"
"""The key of :attr:`Envelope.prev_seq`, written after ``seq`` when there is one."""
SET_ASIDE: Final = "set_aside"
"""The key of :attr:`Envelope.set_aside`, written last when there is one."""
SET_ASIDE_REASONS: Final = ("not_json", "too_large", "refused")

_NUMBERS: Final = ("epoch", "seq_gen", "seq", "received_at")
MAX_NUMBER: Final = 10**38 - 1
"""The largest number an envelope may hold: DynamoDB numbers hold 38 digits, so a
consumer's dedup table could not store a larger one."""


class EnvelopeError(ValueError):
    """Bytes that are not an envelope, or an envelope that cannot be written; the
    message says what is wrong."""


@dataclass(frozen=True, slots=True)
class Envelope:
    connection_id: str
    epoch: int
    seq_gen: int
    seq: int
    received_at_ms: int
    payload: Any
    """Any JSON value: the message as the connection's protocol decoded it."""
    prev_seq: int | None = None
    """The seq of the message sent just before this one in the same sink call, of the
    same connection and ``seq_gen`` (below ``seq``); None for the first of a call.
    Last, with a default, so envelopes made without it are made as before."""
    set_aside: SetAside | None = None
    """Set when the message could not be sent; then ``payload`` is None."""

    @property
    def key(self) -> tuple[str, int, int]:
        """What names the message: equal for every copy of it, whoever sent it."""
        return (self.connection_id, self.seq_gen, self.seq)

    def to_bytes(self, *, ascii_only: bool = False) -> bytes:
        """Compact JSON in UTF-8. Characters outside ASCII are written as themselves
        (a third to half the size of ``\\u`` escapes for most scripts), unless
        ``ascii_only`` or the payload holds a lone surrogate, which UTF-8 cannot
        carry: then as escapes, which read back the same. NaN and the infinities are
        refused (not JSON): :class:`EnvelopeError`, as for any value JSON cannot
        hold."""
        fields: dict[str, Any] = {
            "connection_id": self.connection_id,
            "epoch": self.epoch,
            "seq_gen": self.seq_gen,
            "seq": self.seq,
        }
        if self.prev_seq is not None:
            fields[PREV_SEQ] = self.prev_seq
        fields["received_at"] = self.received_at_ms
        fields["payload"] = self.payload
        if self.set_aside is not None:
            fields[SET_ASIDE] = self.set_aside.fields()
        try:
            if not ascii_only:
                try:
                    return _dumps(fields, ascii_only=False).encode()
                except UnicodeEncodeError:
                    pass
            return _dumps(fields, ascii_only=True).encode("ascii")
        except (TypeError, ValueError) as error:
            raise EnvelopeError(
                f"the payload of {self.connection_id} seq_gen {self.seq_gen} seq {self.seq} "
                f"cannot be written as JSON: {error}"
            ) from error

    @classmethod
    def from_bytes(cls, data: bytes | bytearray | memoryview) -> Envelope:
        """The envelope ``data`` holds (surrounding whitespace, such as the newline
        that ends each record of a Firehose object, is allowed). Raises
        :class:`EnvelopeError` naming what is wrong."""
        try:
            text = bytes(data).decode("utf-8")
        except TypeError:
            raise EnvelopeError(f"an envelope is bytes, got {type(data).__name__}") from None
        except UnicodeDecodeError as error:
            raise EnvelopeError(f"an envelope is UTF-8: {error}") from None
        try:
            fields = json.loads(text, parse_constant=_no_constant)
        except (json.JSONDecodeError, _NotJsonError) as error:
            raise EnvelopeError(f"not JSON: {error}") from None
        if not isinstance(fields, dict):
            raise EnvelopeError(f"an envelope is a JSON object, got {type(fields).__name__}")
        missing = [key for key in KEYS if key not in fields]
        extra = sorted(set(fields) - set(KEYS) - {PREV_SEQ, SET_ASIDE})
        if missing or extra:
            raise EnvelopeError(
                "envelope keys are "
                + ", ".join(KEYS)
                + f", optionally {PREV_SEQ} and {SET_ASIDE}"
                + (f"; missing: {', '.join(missing)}" if missing else "")
                + (f"; unexpected: {', '.join(extra)}" if extra else "")
            )
        connection_id = fields["connection_id"]
        if not is_valid_connection_id(connection_id):
            raise EnvelopeError(
                f"connection_id must be 1-128 characters of [A-Za-z0-9._:-], got {connection_id!r}"
            )
        for name in _NUMBERS:
            value = fields[name]
            # bool is an int in Python but true/false in JSON: not a number here.
            if type(value) is not int or not 0 <= value <= MAX_NUMBER:
                raise EnvelopeError(
                    f"{name} must be an integer from 0 to 10**38 - 1, got {value!r}"
                )
        prev_seq = fields.get(PREV_SEQ)
        # Present means a seq: null is not how an envelope says there is none.
        if PREV_SEQ in fields and (type(prev_seq) is not int or not 0 <= prev_seq < fields["seq"]):
            raise EnvelopeError(
                f"{PREV_SEQ} must be an integer >= 0 and below seq ({fields['seq']}), "
                f"got {prev_seq!r}"
            )
        return cls(
            connection_id=connection_id,
            epoch=fields["epoch"],
            seq_gen=fields["seq_gen"],
            seq=fields["seq"],
            received_at_ms=fields["received_at"],
            payload=fields["payload"],
            prev_seq=prev_seq,
            set_aside=SetAside.from_fields(fields[SET_ASIDE]) if SET_ASIDE in fields else None,
        )


@dataclass(frozen=True, slots=True)
class SetAside:
    """Why a message was not sent, in place of its payload (module docstring)."""

    reason: str
    """One of :data:`SET_ASIDE_REASONS`."""
    detail: str
    bytes: int
    """The size of what could not be sent (the record, or the payload as text)."""
    text: str | None = None
    """The payload as text, when it fits in the record."""

    def fields(self) -> dict[str, Any]:
        fields: dict[str, Any] = {"reason": self.reason, "detail": self.detail}
        fields["bytes"] = self.bytes
        if self.text is not None:
            fields["text"] = self.text
        return fields

    @classmethod
    def from_fields(cls, fields: Any) -> SetAside:
        if not isinstance(fields, dict):
            raise EnvelopeError(f"{SET_ASIDE} must be an object, got {fields!r}")
        reason, detail = fields.get("reason"), fields.get("detail")
        size, text = fields.get("bytes"), fields.get("text")
        extra = sorted(set(fields) - {"reason", "detail", "bytes", "text"})
        if (
            reason not in SET_ASIDE_REASONS
            or not isinstance(detail, str)
            or type(size) is not int
            or size < 0
            or not (text is None or isinstance(text, str))
            or extra
        ):
            raise EnvelopeError(
                f"{SET_ASIDE} must be an object with reason (one of "
                f"{', '.join(SET_ASIDE_REASONS)}), detail (text), bytes (an integer "
                f">= 0) and optionally text, got {fields!r}"
            )
        return cls(reason, detail, size, text)


class _NotJsonError(ValueError):
    pass


def _no_constant(name: str) -> Any:
    # Python's json reads NaN and Infinity; JSON has neither.
    raise _NotJsonError(f"{name} is not a JSON value")


def _dumps(fields: dict[str, Any], *, ascii_only: bool) -> str:
    return json.dumps(fields, separators=(",", ":"), ensure_ascii=ascii_only, allow_nan=False)
