"""What a start or a stop does, whichever way it arrives (HTTP API or EventBridge)."""

from __future__ import annotations

import logging
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
    """Started with another URL: stop it first, or use another id."""


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
    ) -> None:
        self._dynamodb = dynamodb
        self._sqs = sqs
        self._settings = settings
        self._store = DesiredStateStore(dynamodb, settings.table_name)
        self._wall_ms = wall_ms
        self._new_id = new_id

    def now_ms(self) -> int:
        return self._wall_ms()

    def start(
        self, connection_id: str | None, ws_url: str, metadata: Mapping[str, Any] | None = None
    ) -> Started:
        """Write the desired state, then send one start hint. Raises UrlRefusedError,
        ConnectionConflictError."""
        check_upstream_url(ws_url, self._settings.url_policy)
        connection_id = connection_id or self._new_id()
        result = self._store.start(
            connection_id,
            ws_url,
            self._wall_ms(),
            metadata=to_dynamodb_value(dict(metadata)) if metadata is not None else None,
        )
        if result.outcome is StartOutcome.CONFLICT:
            raise ConnectionConflictError(
                f"connection {connection_id} is running with another ws_url; stop it first"
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
