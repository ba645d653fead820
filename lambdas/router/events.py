"""EventBridge ``Start Connection`` / ``Stop Connection`` events: same validation and
effects as the HTTP API. An invalid event is logged and dropped (returning normally,
so it is never retried); a failure of DynamoDB raises, so the event is retried and
then lands in the rule's dead-letter queue."""

from __future__ import annotations

import logging
from typing import Any, Final

from pydantic import ValidationError

from lambdas.router.models import StartDetail, StopDetail
from lambdas.router.service import (
    ConnectionConflictError,
    ConnectionNotFoundError,
    ConnectionService,
)
from lambdas.router.url_policy import UrlRefusedError
from wsfleet.protocol_specs import InvalidProtocolError
from wsfleet.secret_refs import InvalidSecretRefError

log = logging.getLogger(__name__)

START_CONNECTION: Final = "Start Connection"
STOP_CONNECTION: Final = "Stop Connection"


def handle_event(event: dict[str, Any], service: ConnectionService) -> dict[str, Any]:
    kind = event.get("detail-type")
    detail = event.get("detail")
    event_id = event.get("id")
    try:
        if kind == START_CONNECTION:
            start = StartDetail.model_validate(detail)
            started = service.start(
                start.connection_id,
                start.ws_url,
                start.metadata,
                protocol=start.protocol.as_raw() if start.protocol is not None else None,
                auth_secret=start.auth.secret if start.auth is not None else None,
            )
            return {
                "ok": True,
                "connection_id": start.connection_id,
                "outcome": started.outcome.value,
            }
        if kind == STOP_CONNECTION:
            stop = StopDetail.model_validate(detail)
            service.stop(stop.connection_id)
            return {"ok": True, "connection_id": stop.connection_id, "outcome": "stopped"}
        reason = f"unknown detail-type {kind!r}"
    except ValidationError as error:
        reason = "; ".join(
            f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in error.errors()[:5]
        )
    except (
        UrlRefusedError,
        InvalidProtocolError,
        InvalidSecretRefError,
        ConnectionConflictError,
        ConnectionNotFoundError,
    ) as error:
        reason = f"{type(error).__name__}: {error}"
    log.error("event rejected", extra={"event_id": event_id, "detail_type": kind, "reason": reason})
    return {"ok": False, "error": reason}
