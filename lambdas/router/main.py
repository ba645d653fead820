"""The router's Lambda entry point: HTTP API (payload v2) and EventBridge events."""

from __future__ import annotations

import logging
from functools import cache
from typing import Any

import boto3
from aws_lambda_powertools import Logger
from aws_lambda_powertools.utilities.typing import LambdaContext

from lambdas.router.events import handle_event
from lambdas.router.http_api import error, handle_http
from lambdas.router.service import ConnectionService
from lambdas.router.settings import RouterSettings

logger = Logger()
# Module loggers (logging.getLogger(__name__)) share the structured JSON output.
logging.getLogger("lambdas").handlers[:] = logger.handlers
logging.getLogger("lambdas").setLevel(logger.log_level)


@cache
def service() -> ConnectionService:
    """One service per Lambda container: clients are made on first use, not at import."""
    settings = RouterSettings.from_env()
    return ConnectionService(
        dynamodb=boto3.client("dynamodb"), sqs=boto3.client("sqs"), settings=settings
    )


def is_http_event(event: Any) -> bool:
    return (
        isinstance(event, dict)
        and isinstance(event.get("requestContext"), dict)
        and ("http" in event["requestContext"])
    )


@logger.inject_lambda_context(clear_state=True)
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    if is_http_event(event):
        return handle_http(event, context, service)
    if isinstance(event, dict) and "detail-type" in event:
        return handle_event(event, service())
    logger.error(
        "unsupported event", extra={"keys": sorted(event)[:20] if isinstance(event, dict) else None}
    )
    response = error(400, "unsupported_event", "neither an HTTP API v2 nor an EventBridge event")
    return {"statusCode": response.status_code, "body": response.body}
