"""Reading what a view shows of a connection's owner: its session item and its
checkpoint page, each read at most once per answer."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from lambdas.router.views import NO_RECORDS, OwnerRecords, owning_session
from wsfleet import schema
from wsfleet.checkpoint_page import page_from_dynamodb
from wsfleet.item import ConnectionItem, MalformedItemError, to_attribute
from wsfleet.session_rules import SessionItem

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient


def _key(plain: dict[str, str]) -> dict[str, Any]:
    return {name: to_attribute(value) for name, value in plain.items()}


class OwnerReader:
    """One per answer: a page of a listing reads each owning session's records once
    (a session read, then a page read), however many of its rows that session owns."""

    def __init__(self, client: DynamoDBClient, table_name: str) -> None:
        self._client = client
        self._table = table_name
        self._read: dict[tuple[str, int], OwnerRecords] = {}

    def records_of(self, item: ConnectionItem) -> OwnerRecords:
        """The records of the session ``item`` names as its owner; none when unowned."""
        key = owning_session(item)
        if key is None:
            return NO_RECORDS
        records = self._read.get(key)
        if records is None:
            records = self._read[key] = self._records(*key)
        return records

    def _records(self, worker_id: str, session_gen: int) -> OwnerRecords:
        raw_session = self._client.get_item(
            TableName=self._table,
            Key=_key(schema.session_key(worker_id, session_gen)),
            ConsistentRead=True,
        ).get("Item")
        if not raw_session:
            # A session is forgotten together with its page (session first): nothing
            # of the page is shown for an owner whose session is gone.
            return NO_RECORDS
        # The page is up to ~15 KB: an eventually consistent read costs half, and a
        # page at most a second older changes only the freshness the view reports.
        raw_page = self._client.get_item(
            TableName=self._table,
            Key=_key(schema.page_key(worker_id, session_gen)),
            ConsistentRead=False,
        ).get("Item")
        # A record that cannot be read is that session's connections' error only.
        try:
            session = SessionItem.from_dynamodb(raw_session)
        except MalformedItemError as error:
            return OwnerRecords(problem=error.problem)
        try:
            page = page_from_dynamodb(raw_page) if raw_page else None
        except MalformedItemError as error:
            return OwnerRecords(session=session, problem=error.problem)
        return OwnerRecords(session=session, page=page)
