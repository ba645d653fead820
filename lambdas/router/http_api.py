"""HTTP API (payload v2) routes of DESIGN section 5, on Powertools' resolver.

Every refusal is a 4xx JSON body ``{"error": <code>, "message": <text>}``; bad input
never produces a 5xx or a stack trace.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
from collections.abc import Callable
from typing import Annotated, Any

from aws_lambda_powertools.event_handler import APIGatewayHttpResolver, Response, content_types
from aws_lambda_powertools.event_handler.api_gateway import Router
from aws_lambda_powertools.event_handler.openapi.exceptions import RequestValidationError
from aws_lambda_powertools.event_handler.openapi.params import Query
from aws_lambda_powertools.utilities.typing import LambdaContext

from lambdas.router.listing import InvalidTokenError
from lambdas.router.models import StartRequest
from lambdas.router.service import (
    ConnectionConflictError,
    ConnectionNotFoundError,
    ConnectionService,
)
from lambdas.router.url_policy import UrlRefusedError
from lambdas.router.views import connection_view
from wsfleet.desired_state import StartOutcome
from wsfleet.schema import DESIRED_STATES, is_valid_connection_id

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 16 * 1024
DEFAULT_PAGE = 50
MAX_PAGE = 100

connections = Router()


def error(status: int, code: str, message: str) -> Response[str]:
    return Response(
        status_code=status,
        content_type=content_types.APPLICATION_JSON,
        body=json.dumps({"error": code, "message": message}),
    )


def _json(status: int, body: dict[str, Any]) -> Response[str]:
    return Response(
        status_code=status, content_type=content_types.APPLICATION_JSON, body=json.dumps(body)
    )


def _service() -> ConnectionService:
    service: ConnectionService = connections.context["service"]
    return service


def _checked_id(connection_id: str) -> str:
    if not is_valid_connection_id(connection_id):
        raise _BadRequestError(
            "invalid_connection_id", "connection ids are 1-128 chars of [A-Za-z0-9._:-]"
        )
    return connection_id


class _BadRequestError(ValueError):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


@connections.post("/connections")
def start_connection(request: StartRequest) -> Response[str]:
    service = _service()
    started = service.start(request.connection_id, request.ws_url, request.metadata)
    status = 200 if started.outcome is StartOutcome.ALREADY_STARTED else 201
    view = connection_view(started.item, service.now_ms())
    return _json(status, {**view, "outcome": started.outcome.value})


@connections.get("/connections/<connection_id>")
def get_connection(connection_id: str) -> Response[str]:
    service = _service()
    item = service.get(_checked_id(connection_id))
    return _json(200, connection_view(item, service.now_ms()))


@connections.delete("/connections/<connection_id>")
def stop_connection(connection_id: str) -> Response[str]:
    service = _service()
    item = service.stop(_checked_id(connection_id))
    return _json(202, connection_view(item, service.now_ms()))


@connections.get("/connections")
def list_connections(
    state: Annotated[str | None, Query(description="STARTED or STOPPED")] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = DEFAULT_PAGE,
    next_token: Annotated[str | None, Query(max_length=2048)] = None,
) -> Response[str]:
    if state is not None and state not in DESIRED_STATES:
        raise _BadRequestError("invalid_state", "state must be STARTED or STOPPED")
    service = _service()
    page = service.list(state=state, limit=limit, next_token=next_token)
    now = service.now_ms()
    return _json(
        200,
        {
            "connections": [connection_view(item, now) for item in page.items],
            "next_token": page.next_token,
        },
    )


def build_resolver() -> APIGatewayHttpResolver:
    app = APIGatewayHttpResolver(enable_validation=True)
    app.include_router(connections)

    @app.exception_handler(RequestValidationError)
    def invalid_request(exc: RequestValidationError) -> Response[str]:
        return error(400, "validation_error", _describe(exc.errors()))

    @app.exception_handler(_BadRequestError)
    def bad_request(exc: _BadRequestError) -> Response[str]:
        return error(400, exc.code, str(exc))

    @app.exception_handler(InvalidTokenError)
    def bad_token(exc: InvalidTokenError) -> Response[str]:
        return error(400, "invalid_next_token", str(exc))

    @app.exception_handler(UrlRefusedError)
    def refused_url(exc: UrlRefusedError) -> Response[str]:
        return error(400, exc.code, str(exc))

    @app.exception_handler(ConnectionNotFoundError)
    def not_found(exc: ConnectionNotFoundError) -> Response[str]:
        return error(404, "not_found", f"no connection {exc.args[0]}")

    @app.exception_handler(ConnectionConflictError)
    def conflict(exc: ConnectionConflictError) -> Response[str]:
        return error(409, "conflict", str(exc))

    @app.not_found
    def no_route(exc: Exception) -> Response[str]:
        return error(404, "no_such_route", "no such route")

    return app


def _describe(errors: Any) -> str:
    parts = []
    for item in list(errors)[:5]:
        if item.get("type") == "json_invalid":
            parts.append("body is not valid JSON")
            continue
        where = ".".join(str(p) for p in item.get("loc", ()) if p != "body")
        parts.append(f"{where or 'body'}: {item.get('msg', 'invalid')}")
    return "; ".join(parts) or "invalid request"


def precheck(event: dict[str, Any]) -> Response[str] | None:
    """Refusals decided before routing: oversized or undecodable bodies."""
    body = event.get("body")
    if body is None:
        return None
    if not isinstance(body, str):
        return error(400, "invalid_body", "body must be text")
    raw: bytes
    if event.get("isBase64Encoded"):
        if len(body) > MAX_BODY_BYTES * 4 // 3 + 4:
            return error(413, "body_too_large", f"bodies are limited to {MAX_BODY_BYTES} bytes")
        try:
            raw = base64.b64decode(body, validate=True)
        except (binascii.Error, ValueError):
            return error(400, "invalid_body", "body is not valid base64")
    else:
        raw = body.encode("utf-8", errors="surrogatepass")
    if len(raw) > MAX_BODY_BYTES:
        return error(413, "body_too_large", f"bodies are limited to {MAX_BODY_BYTES} bytes")
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return error(400, "invalid_body", "body is not UTF-8")
    return None


def handle_http(
    event: dict[str, Any], context: LambdaContext, service_factory: Callable[[], ConnectionService]
) -> dict[str, Any]:
    refused = precheck(event)
    if refused is not None:
        return _render(refused)
    app = _resolver()
    app.append_context(service=service_factory())
    try:
        return app.resolve(event, context)
    finally:
        app.clear_context()


def _render(response: Response[str]) -> dict[str, Any]:
    return {
        "statusCode": response.status_code,
        "headers": {"Content-Type": content_types.APPLICATION_JSON},
        "body": response.body,
        "isBase64Encoded": False,
    }


_app: APIGatewayHttpResolver | None = None


def _resolver() -> APIGatewayHttpResolver:
    global _app
    if _app is None:
        _app = build_resolver()
    return _app
