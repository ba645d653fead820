"""Clients of moto's Kinesis, Firehose and SQS that refuse chosen records of a request
the way the real services do (and moto never does): the request goes to moto without
them, and the answer names them as failed, in place.

``refuse(request_number, envelope) -> str | None``: an error code to refuse that record
with, or None to let it through. Request numbers count from 1 per client.

``cut_next()`` makes the next request a cut call: it raises :class:`CutCallError` to
the sink, as the worker's cancel at the fence does, while the request itself is kept
and lands later, when :meth:`land_held` is called (the thread that was sending it
finishes after the call was cut: a superseded owner's late request)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from wsfleet.envelope import Envelope

Refuse = Callable[[int, Envelope], "str | None"]


class CutCallError(Exception):
    """The sink call was cut while this request was in flight; it lands later."""


def never(request: int, envelope: Envelope) -> str | None:
    return None


class _Refusing:
    def __init__(self, client: Any, refuse: Refuse = never) -> None:
        self.client = client
        self.refuse = refuse
        self.requests = 0
        self.refused: list[Envelope] = []
        """Every record refused, in order."""
        self._cut = False
        self.held: list[tuple[str, dict[str, Any]]] = []
        """Requests of cut calls, not landed yet: (method, arguments)."""
        self.landed_late = 0

    def cut_next(self) -> None:
        self._cut = True

    def _held(self, method: str, kwargs: dict[str, Any]) -> None:
        """Keep the request of a cut call and cut the call."""
        if self._cut:
            self._cut = False
            self.held.append((method, kwargs))
            raise CutCallError(method)

    def land_held(self) -> None:
        """Every held request lands now, whole, as sent."""
        held, self.held = self.held, []
        for method, kwargs in held:
            getattr(self.client, method)(**kwargs)
            self.landed_late += 1

    def _codes(self, envelopes: list[Envelope]) -> list[str | None]:
        self.requests += 1
        codes = [self.refuse(self.requests, e) for e in envelopes]
        self.refused += [e for e, code in zip(envelopes, codes, strict=True) if code]
        return codes


class RefusingKinesis(_Refusing):
    def put_records(self, **kwargs: Any) -> Mapping[str, Any]:
        self._held("put_records", dict(kwargs))
        records = kwargs.pop("Records")
        codes = self._codes([Envelope.from_bytes(r["Data"]) for r in records])
        taken = [r for r, code in zip(records, codes, strict=True) if not code]
        answers = iter(self.client.put_records(Records=taken, **kwargs)["Records"] if taken else [])
        out = [
            {"ErrorCode": code, "ErrorMessage": "Rate exceeded for shard"}
            if code
            else next(answers)
            for code in codes
        ]
        return {"FailedRecordCount": sum(1 for c in codes if c), "Records": out}


class RefusingFirehose(_Refusing):
    def put_record_batch(self, **kwargs: Any) -> Mapping[str, Any]:
        self._held("put_record_batch", dict(kwargs))
        records = kwargs.pop("Records")
        codes = self._codes([Envelope.from_bytes(r["Data"]) for r in records])
        taken = [r for r, code in zip(records, codes, strict=True) if not code]
        answer = self.client.put_record_batch(Records=taken, **kwargs) if taken else {}
        answers = iter(answer.get("RequestResponses", []))
        out = [
            {"ErrorCode": code, "ErrorMessage": "Slow down"} if code else next(answers)
            for code in codes
        ]
        return {"FailedPutCount": sum(1 for c in codes if c), "RequestResponses": out}


class RefusingSqs(_Refusing):
    def send_message_batch(self, **kwargs: Any) -> Mapping[str, Any]:
        self._held("send_message_batch", dict(kwargs))
        entries = kwargs.pop("Entries")
        codes = self._codes([Envelope.from_bytes(e["MessageBody"].encode()) for e in entries])
        taken = [e for e, code in zip(entries, codes, strict=True) if not code]
        answer = self.client.send_message_batch(Entries=taken, **kwargs) if taken else {}
        failed = [
            {"Id": e["Id"], "Code": code, "Message": "throttled", "SenderFault": False}
            for e, code in zip(entries, codes, strict=True)
            if code
        ]
        return {"Successful": answer.get("Successful", []), "Failed": failed}
