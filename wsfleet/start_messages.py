"""Bodies of the start-queue messages: hints that a connection needs an owner.

``{"type": "start" | "reassign", "connection_id": "<id>"}``. The table is the truth;
a message only says where to look sooner than the next reconcile.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Final, Literal

from wsfleet.schema import is_valid_connection_id

START: Final = "start"
REASSIGN: Final = "reassign"
MAX_BODY_CHARS: Final = 1024

MessageType = Literal["start", "reassign"]


class InvalidStartMessageError(ValueError):
    """A body that is not a start message (a poison message)."""


@dataclass(frozen=True, slots=True)
class StartMessage:
    type: MessageType
    connection_id: str

    def to_body(self) -> str:
        return json.dumps({"type": self.type, "connection_id": self.connection_id})


def parse_body(body: str) -> StartMessage:
    if len(body) > MAX_BODY_CHARS:
        raise InvalidStartMessageError(f"body longer than {MAX_BODY_CHARS} chars")
    try:
        obj = json.loads(body)
    except ValueError as error:
        raise InvalidStartMessageError(f"not JSON: {error}") from None
    if not isinstance(obj, dict) or set(obj) != {"type", "connection_id"}:
        raise InvalidStartMessageError("expected exactly the keys 'type' and 'connection_id'")
    kind = obj["type"]
    if kind not in (START, REASSIGN):
        raise InvalidStartMessageError(f"unknown type {kind!r}")
    if not is_valid_connection_id(obj["connection_id"]):
        raise InvalidStartMessageError("connection_id outside [A-Za-z0-9._:-]{1,128}")
    return StartMessage(kind, obj["connection_id"])
