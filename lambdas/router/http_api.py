"""HTTP API (payload v2) routes of docs/DESIGN.md §5.1, on Powertools' resolver.

Every refusal is a 4xx JSON body ``{"error": <code>, "message": <text>}``; bad input
never produces a 5xx or a stack trace.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import threading
from collections.abc import Callable
from typing import Annotated, Any

from aws_lambda_powertools.event_handler import APIGatewayHttpResolver, Response, content_types
from aws_lambda_powertools.event_handler.api_gateway import Router
from aws_lambda_powertools.event_handler.openapi.exceptions import (
    RequestUnsupportedContentType,
    RequestValidationError,
)
from aws_lambda_powertools.event_handler.openapi.params import Query
from aws_lambda_powertools.event_handler.openapi.types import OpenAPIResponse
from aws_lambda_powertools.utilities.typing import LambdaContext

from lambdas.router.listing import InvalidTokenError
from lambdas.router.models import (
    ConnectionPage,
    ConnectionView,
    ErrorBody,
    StartedConnection,
    StartRequest,
)
from lambdas.router.service import (
    ConnectionConflictError,
    ConnectionNotFoundError,
    ConnectionService,
)
from lambdas.router.url_policy import UrlRefusedError
from wsfleet.desired_state import StartContendedError, StartOutcome
from wsfleet.protocol_specs import InvalidProtocolError
from wsfleet.schema import DESIRED_STATES, is_valid_connection_id
from wsfleet.secret_refs import InvalidSecretRefError

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 16 * 1024
MAX_JSON_DEPTH = 32
"""Levels of objects and arrays in a request body (metadata itself allows 16)."""
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
    # Not the router's Powertools context: that follows whichever resolver included
    # the router last (building another one, for the OpenAPI document, would strand it).
    service = _serving.get("service")
    if service is None:
        raise RuntimeError("routes run only inside handle_http")
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


def _answer(description: str, model: type[Any]) -> OpenAPIResponse:
    return {
        "description": description,
        "content": {content_types.APPLICATION_JSON: {"model": model}},
    }


_REFUSED = _answer("refused: invalid input", ErrorBody)
_NOT_FOUND = _answer("no such connection", ErrorBody)


@connections.post(
    "/connections",
    summary="Start a connection (idempotent)",
    responses={
        201: _answer("created, or restarted from STOPPED, or re-armed", StartedConnection),
        200: _answer("already STARTED with this ws_url, protocol and auth", StartedConnection),
        400: _answer(
            "refused: invalid input, nothing written (invalid_auth: the secret reference;"
            " invalid_protocol: the protocol spec)",
            ErrorBody,
        ),
        409: _answer("STARTED with another ws_url, protocol or auth: stop it first", ErrorBody),
        413: _answer("body over 16 KB", ErrorBody),
    },
)
def start_connection(request: StartRequest) -> Response[str]:
    service = _service()
    started = service.start(
        request.connection_id,
        request.ws_url,
        request.metadata,
        protocol=request.protocol.as_raw() if request.protocol is not None else None,
        auth_secret=request.auth.secret if request.auth is not None else None,
    )
    status = 200 if started.outcome is StartOutcome.ALREADY_STARTED else 201
    return _json(status, {**service.view(started.item), "outcome": started.outcome.value})


@connections.get(
    "/connections/<connection_id>",
    summary="Show one connection",
    responses={200: _answer("the connection", ConnectionView), 400: _REFUSED, 404: _NOT_FOUND},
)
def get_connection(connection_id: str) -> Response[str]:
    service = _service()
    return _json(200, service.view(service.get(_checked_id(connection_id))))


@connections.delete(
    "/connections/<connection_id>",
    summary="Stop a connection (idempotent)",
    responses={
        202: _answer("STOPPED; the owner closes it within one heartbeat", ConnectionView),
        400: _REFUSED,
        404: _NOT_FOUND,
    },
)
def stop_connection(connection_id: str) -> Response[str]:
    service = _service()
    return _json(202, service.view(service.stop(_checked_id(connection_id))))


@connections.get(
    "/connections",
    summary="List connections, a page at a time",
    responses={200: _answer("one page", ConnectionPage), 400: _REFUSED},
)
def list_connections(
    state: Annotated[str | None, Query(description="STARTED or STOPPED")] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = DEFAULT_PAGE,
    next_token: Annotated[str | None, Query(max_length=2048)] = None,
) -> Response[str]:
    if state is not None and state not in DESIRED_STATES:
        raise _BadRequestError("invalid_state", "state must be STARTED or STOPPED")
    service = _service()
    page = service.list(state=state, limit=limit, next_token=next_token)
    return _json(200, {"connections": service.views(page.items), "next_token": page.next_token})


def build_resolver() -> APIGatewayHttpResolver:
    app = APIGatewayHttpResolver(enable_validation=True)
    app.include_router(connections)

    @app.exception_handler(RequestUnsupportedContentType)
    def unsupported_type(exc: RequestUnsupportedContentType) -> Response[str]:
        return error(415, "unsupported_media_type", "bodies are JSON")

    @app.exception_handler(RequestValidationError)
    def invalid_request(exc: RequestValidationError) -> Response[str]:
        return error(400, _refusal_code(exc.errors()), _describe(exc.errors()))

    @app.exception_handler(_BadRequestError)
    def bad_request(exc: _BadRequestError) -> Response[str]:
        return error(400, exc.code, str(exc))

    @app.exception_handler(InvalidTokenError)
    def bad_token(exc: InvalidTokenError) -> Response[str]:
        return error(400, "invalid_next_token", str(exc))

    @app.exception_handler(UrlRefusedError)
    def refused_url(exc: UrlRefusedError) -> Response[str]:
        return error(400, exc.code, str(exc))

    @app.exception_handler(InvalidSecretRefError)
    def refused_auth(exc: InvalidSecretRefError) -> Response[str]:
        return error(400, INVALID_AUTH, str(exc))

    @app.exception_handler(InvalidProtocolError)
    def refused_protocol(exc: InvalidProtocolError) -> Response[str]:
        return error(400, INVALID_PROTOCOL, str(exc))

    @app.exception_handler(ConnectionNotFoundError)
    def not_found(exc: ConnectionNotFoundError) -> Response[str]:
        return error(404, "not_found", f"no connection {exc.args[0]}")

    @app.exception_handler(ConnectionConflictError)
    def conflict(exc: ConnectionConflictError) -> Response[str]:
        return error(409, "conflict", str(exc))

    @app.exception_handler(StartContendedError)
    def contended(exc: StartContendedError) -> Response[str]:
        return error(409, "concurrent_change", f"{exc}; nothing was changed, retry")

    @app.not_found
    def no_route(exc: Exception) -> Response[str]:
        return error(404, "no_such_route", "no such route")

    return app


OPENAPI_TITLE = "websocket-fleet router"
_POWERTOOLS_ONLY_SCHEMAS = ("HTTPValidationError", "ValidationError", "ResponseValidationError")


def openapi_document(version: str) -> dict[str, Any]:
    """The OpenAPI document of these routes, generated by Powertools from the code.

    Powertools lists its own 422 answer on every validated route; this API refuses
    invalid input with 400 and an ``ErrorBody`` instead, so those entries (and the
    schemas only they use) are left out.
    """
    document: dict[str, Any] = json.loads(
        build_resolver().get_openapi_json_schema(title=OPENAPI_TITLE, version=version)
    )
    for operations in document.get("paths", {}).values():
        for operation in operations.values():
            operation.get("responses", {}).pop("422", None)
    schemas = document.get("components", {}).get("schemas", {})
    for name in _POWERTOOLS_ONLY_SCHEMAS:
        schemas.pop(name, None)
    return document


INVALID_AUTH = "invalid_auth"
INVALID_PROTOCOL = "invalid_protocol"
_FIELD_CODES = {"auth": INVALID_AUTH, "protocol": INVALID_PROTOCOL}
"""A body refused only for the shape of one of these fields gets that field's code, as
a reference or a spec refused by its validator does."""


def _refusal_code(errors: Any) -> str:
    fields = set()
    for item in list(errors):
        where = [str(p) for p in item.get("loc", ()) if p != "body"]
        fields.add(where[0] if where else "")
    if len(fields) == 1:
        return _FIELD_CODES.get(fields.pop(), "validation_error")
    return "validation_error"


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
    """Refusals decided before routing: oversized or undecodable bodies, and JSON the
    resolver's own parsing would fail on with an error of its own (nesting past the
    recursion limit, integers past Python's digit limit)."""
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
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return error(400, "invalid_body", "body is not UTF-8")
    if _method(event) == "POST" and text.strip():
        try:
            parsed = json.loads(text)
        except (ValueError, RecursionError):
            return error(400, "invalid_json", "body is not valid JSON")
        if _depth(parsed) > MAX_JSON_DEPTH:
            return error(400, "invalid_json", f"body nests deeper than {MAX_JSON_DEPTH} levels")
    return None


def _method(event: dict[str, Any]) -> str:
    http = event.get("requestContext", {}).get("http", {})
    method = http.get("method") if isinstance(http, dict) else None
    return method.upper() if isinstance(method, str) else ""


def _depth(value: Any) -> int:
    """Levels of objects and arrays in a parsed JSON value (iterative: no recursion)."""
    deepest = 0
    pending = [(value, 1)]
    while pending:
        node, depth = pending.pop()
        if isinstance(node, dict | list):
            deepest = max(deepest, depth)
            children = node.values() if isinstance(node, dict) else node
            pending.extend((child, depth + 1) for child in children)
    return deepest


def _as_json_request(event: dict[str, Any]) -> dict[str, Any]:
    """The event with its body declared as JSON, whatever the client said: the API
    speaks only JSON, and ``curl -d`` sends ``application/x-www-form-urlencoded``."""
    headers = event.get("headers")
    kept = (
        {k: v for k, v in headers.items() if str(k).lower() != "content-type"}
        if isinstance(headers, dict)
        else {}
    )
    return {**event, "headers": {**kept, "content-type": content_types.APPLICATION_JSON}}


def handle_http(
    event: dict[str, Any], context: LambdaContext, service_factory: Callable[[], ConnectionService]
) -> dict[str, Any]:
    refused = precheck(event)
    if refused is not None:
        return _render(refused)
    service = service_factory()
    # Powertools keeps the request being resolved in class attributes (shared by every
    # resolver), so two threads must never resolve at once. Lambda sends one request
    # at a time; the local HTTP adapter serves several threads.
    with _resolving:
        _serving["service"] = service
        try:
            return _resolver().resolve(_as_json_request(event), context)
        finally:
            _serving.clear()


def _render(response: Response[str]) -> dict[str, Any]:
    return {
        "statusCode": response.status_code,
        "headers": {"Content-Type": content_types.APPLICATION_JSON},
        "body": response.body,
        "isBase64Encoded": False,
    }


_app: APIGatewayHttpResolver | None = None
_resolving = threading.Lock()
_serving: dict[str, ConnectionService] = {}
"""The service of the request being resolved (one at a time, under ``_resolving``)."""


def _resolver() -> APIGatewayHttpResolver:
    global _app
    if _app is None:
        _app = build_resolver()
    return _app
