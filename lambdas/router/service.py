"""What a start or a stop does, whichever way it arrives (HTTP API or EventBridge)."""

from __future__ import annotations

import logging
import secrets
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from lambdas.router.listing import Page, list_connections
from lambdas.router.models import to_dynamodb_value
from lambdas.router.owners import OwnerReader
from lambdas.router.settings import RouterSettings
from lambdas.router.url_policy import check_upstream_url
from lambdas.router.views import connection_view
from wsfleet.desired_state import DesiredStateStore, StartOutcome, StopOutcome
from wsfleet.item import ConnectionItem
from wsfleet.item_io import get_connection
from wsfleet.protocol_specs import parse_spec
from wsfleet.secret_refs import check_secret_ref
from wsfleet.start_messages import START, StartMessage

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient
    from mypy_boto3_sqs import SQSClient

log = logging.getLogger(__name__)

View = dict[str, Any]
Views = list[View]
"""(Named here: inside the class, ``list`` is the listing method.)"""


class ConnectionNotFoundError(LookupError):
    pass


class ConnectionConflictError(ValueError):
    """Started with another URL, protocol or auth: stop it first, or use another id."""


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


def new_connection_id() -> str:
    return uuid.uuid4().hex


@dataclass(frozen=True, slots=True)
class Started:
    outcome: StartOutcome
    item: ConnectionItem


class ConnectionService:
    def __init__(
        self,
        *,
        dynamodb: DynamoDBClient,
        sqs: SQSClient,
        settings: RouterSettings,
        wall_ms: Callable[[], int] = wall_clock_ms,
        new_id: Callable[[], str] = new_connection_id,
        tokens: Callable[[int], str] = secrets.token_hex,
    ) -> None:
        """``tokens(n)``: ``n`` random bytes as hex (the notices' nonces)."""
        self._dynamodb = dynamodb
        self._sqs = sqs
        self._settings = settings
        self._store = DesiredStateStore(dynamodb, settings.table_name, tokens=tokens)
        self._wall_ms = wall_ms
        self._new_id = new_id

    def now_ms(self) -> int:
        return self._wall_ms()

    def start(
        self,
        connection_id: str | None,
        ws_url: str,
        metadata: Mapping[str, Any] | None = None,
        *,
        protocol: Mapping[str, Any] | None = None,
        auth_secret: object | None = None,
    ) -> Started:
        """Validate, write the desired state, then send one start hint.

        ``protocol`` is the spec as the start carries it (``{"name", "options"}``),
        validated by :func:`wsfleet.protocol_specs.parse_spec` (a built-in, or a
        plug-in of ``UPSTREAM_PROTOCOLS``, whose options are checked for shape and
        size only: the router runs no plug-in code) and stored in its compact form;
        ``auth_secret`` the secret reference, validated by
        :func:`wsfleet.secret_refs.check_secret_ref` against ``ALLOWED_SECRET_PREFIX``.
        The router never reads the secret. Raises UrlRefusedError,
        InvalidProtocolError, InvalidSecretRefError (before anything is written),
        ConnectionConflictError."""
        check_upstream_url(ws_url, self._settings.url_policy)
        stored_protocol = (
            parse_spec(dict(protocol), plugins=self._settings.plugin_protocols).to_item()
            if protocol is not None
            else None
        )
        reference = (
            check_secret_ref(auth_secret, self._settings.secret_prefix)
            if auth_secret is not None
            else None
        )
        connection_id = connection_id or self._new_id()
        result = self._store.start(
            connection_id,
            ws_url,
            self._wall_ms(),
            protocol=stored_protocol,
            auth_secret=reference,
            metadata=to_dynamodb_value(dict(metadata)) if metadata is not None else None,
        )
        if result.outcome is StartOutcome.CONFLICT:
            running = result.item
            differing = [
                name
                for name, differs in (
                    ("ws_url", running is not None and running.ws_url != ws_url),
                    ("protocol", running is not None and running.protocol != stored_protocol),
                    ("auth", running is not None and running.auth_secret != reference),
                )
                if differs
            ]
            raise ConnectionConflictError(
                f"connection {connection_id} is running with another "
                f"{' and '.join(differing) or 'ws_url, protocol or auth'}; stop it first"
            )
        if result.outcome.sends_start_message:
            self._send_start(connection_id)
        item = self.get(connection_id)
        log.info(
            "start",
            extra={"connection_id": connection_id, "outcome": result.outcome.value},
        )
        return Started(result.outcome, item)

    def stop(self, connection_id: str) -> ConnectionItem:
        if self._store.stop(connection_id, self._wall_ms()) is StopOutcome.NOT_FOUND:
            raise ConnectionNotFoundError(connection_id)
        log.info("stop", extra={"connection_id": connection_id})
        return self.get(connection_id)

    def get(self, connection_id: str) -> ConnectionItem:
        item = get_connection(self._dynamodb, self._settings.table_name, connection_id)
        if item is None:
            raise ConnectionNotFoundError(connection_id)
        return item

    def list(self, *, state: str | None, limit: int, next_token: str | None) -> Page:
        return list_connections(
            self._dynamodb,
            self._settings.table_name,
            state=state,
            limit=limit,
            next_token=next_token,
        )

    def views(self, items: Sequence[ConnectionItem]) -> Views:
        """The API's views of ``items``, with their owners' sessions and checkpoint
        pages: one session read and one page read per distinct owning session."""
        reader = OwnerReader(self._dynamodb, self._settings.table_name)
        now = self._wall_ms()
        return [connection_view(item, now, reader.records_of(item)) for item in items]

    def view(self, item: ConnectionItem) -> View:
        return self.views([item])[0]

    def _send_start(self, connection_id: str) -> None:
        try:
            self._sqs.send_message(
                QueueUrl=self._settings.queue_url,
                MessageBody=StartMessage(START, connection_id).to_body(),
            )
        except Exception:
            # The table is the truth: without the hint, the next reconcile of any
            # worker still finds the connection (its lease is free).
            log.exception("start hint not sent", extra={"connection_id": connection_id})
