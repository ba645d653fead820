"""Executes the session rules against DynamoDB: open, renew, reap, retire, list and
forget sessions; write and read checkpoint pages; notify an owner."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from botocore.exceptions import ClientError

from wsfleet import schema, session_rules
from wsfleet.checkpoint_page import (
    CheckpointPage,
    PageEntry,
    page_from_dynamodb,
    page_item,
    page_put_condition,
)
from wsfleet.item import MalformedItemError, from_attributes, key_text, to_attribute
from wsfleet.lease_rules import ConditionalUpdate
from wsfleet.session_rules import RenewRefusal, SessionItem
from wsfleet.timing import LeaseTiming

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class SessionRenewed:
    """A renew that landed, with the notices the router has left for the owner."""

    notices: frozenset[str]


def _key(worker_id: str, session_gen: int) -> dict[str, Any]:
    return {k: to_attribute(v) for k, v in schema.session_key(worker_id, session_gen).items()}


Report = Callable[[MalformedItemError], None]
"""Told of each item that cannot be decoded (a worker logs and counts it)."""


def log_malformed(error: MalformedItemError) -> None:
    log.warning("malformed item left out", extra={"key": error.key, "problem": error.problem})


def _decoded(raw: Mapping[str, Any]) -> SessionItem | None:
    try:
        return SessionItem.from_dynamodb(raw)
    except MalformedItemError:
        return None


def _condition_failed(error: ClientError) -> bool:
    return error.response.get("Error", {}).get("Code") == "ConditionalCheckFailedException"


class SessionStore:
    """Every method takes the caller's ``now_ms``. Errors other than a failed condition
    propagate: the outcome is then unknown."""

    def __init__(self, client: DynamoDBClient, table_name: str, timing: LeaseTiming) -> None:
        self._client = client
        self._table = table_name
        self._timing = timing

    @property
    def timing(self) -> LeaseTiming:
        return self._timing

    def open(self, worker_id: str, session_gen: int, now_ms: int, capacity: int) -> bool:
        """Open a new session; False when one of that id and generation exists (a
        retry of a put that had landed counts: the caller then renews it)."""
        try:
            self._client.put_item(
                TableName=self._table,
                Item=session_rules.new_session_item(
                    worker_id, session_gen, now_ms, self._timing, capacity
                ),
                ConditionExpression="attribute_not_exists(#pk)",
                ExpressionAttributeNames={"#pk": schema.PARTITION_KEY},
            )
        except ClientError as error:
            if _condition_failed(error):
                return False
            raise
        return True

    def renew(
        self,
        worker_id: str,
        session_gen: int,
        now_ms: int,
        *,
        connections: int,
        acted_on: Iterable[str] = (),
        capacity: int | None = None,
    ) -> SessionRenewed | RenewRefusal:
        update = session_rules.renew_update(
            now_ms, self._timing, connections=connections, acted_on=acted_on, capacity=capacity
        )
        try:
            response = self._client.update_item(
                TableName=self._table,
                Key=_key(worker_id, session_gen),
                ReturnValues="ALL_NEW",
                ReturnValuesOnConditionCheckFailure="ALL_OLD",
                **update.as_kwargs(),
            )
        except ClientError as error:
            if not _condition_failed(error):
                raise
            raw: Mapping[str, Any] | None = error.response.get("Item")  # type: ignore[assignment]
            return session_rules.renew_failure(_decoded(raw) if raw else None)
        # Only the notices are read: an attribute of the wrong type elsewhere on the
        # item must not turn a renew that landed into an error.
        return SessionRenewed(session_rules.notices_of(from_attributes(response["Attributes"])))

    def reap(
        self,
        session: SessionItem,
        reaper: str,
        now_ms: int,
        takers: session_rules.Takers | None = None,
    ) -> bool:
        """Mark a session DEAD, on condition that its beat is still ``session.beat``
        (the one the reaper saw unchanged for ``expire_after``: the caller decides
        that), recording ``takers`` (who takes which of its connections) when given;
        True for exactly one of any number of reapers."""
        return self._conditional(
            session.worker_id,
            session.session_gen,
            session_rules.reap_update(
                reaper,
                now_ms,
                session.beat,
                takers,
                state_absent=session.state is None,
                stored_state=session.stored_state,
                stored_beat=session.stored_beat,
            ),
        )

    def retire(self, worker_id: str, session_gen: int, now_ms: int) -> bool:
        """End one's own session (after the last release of a graceful shutdown)."""
        return self._conditional(
            worker_id, session_gen, session_rules.retire_update(worker_id, now_ms)
        )

    def notify(self, worker_id: str, session_gen: int, token: str) -> bool:
        """Leave a notice for a session's owner; False when the session is gone."""
        return self._conditional(worker_id, session_gen, session_rules.notice_update(token))

    def offer(self, worker_id: str, session_gen: int, tokens: Iterable[str]) -> bool:
        """Offer released connections to a live session (one write for all of them);
        False when the session is not ALIVE."""
        return self._conditional(worker_id, session_gen, session_rules.offer_update(tokens))

    def list_sessions(self, report: Report = log_malformed) -> list[SessionItem]:
        """Every session, from the session item collections (no index). An item that is
        not a session (:class:`MalformedItemError`: no generation in its key) is left
        out and ``report``-ed; a damaged session (an attribute of the wrong type) is
        ``report``-ed and listed, with its :attr:`~SessionItem.problem`, so that it is
        watched and reaped like any other."""
        sessions: list[SessionItem] = []
        for partition in schema.session_partitions():
            start_key: dict[str, Any] | None = None
            while True:
                args: dict[str, Any] = {
                    "TableName": self._table,
                    "KeyConditionExpression": "#pk = :pk",
                    "ExpressionAttributeNames": {"#pk": schema.PARTITION_KEY},
                    "ExpressionAttributeValues": {":pk": {"S": partition}},
                }
                if start_key:
                    args["ExclusiveStartKey"] = start_key
                page = self._client.query(**args)
                for raw in page.get("Items", []):
                    try:
                        session = SessionItem.from_dynamodb(raw, damaged=True)
                    except MalformedItemError as error:
                        report(error)
                        continue
                    if session.problem is not None:
                        report(MalformedItemError(key_text(raw), session.problem))
                    sessions.append(session)
                start_key = page.get("LastEvaluatedKey")
                if not start_key:
                    break
        return sessions

    def get_session(self, worker_id: str, session_gen: int) -> SessionItem | None:
        raw = self._client.get_item(
            TableName=self._table, Key=_key(worker_id, session_gen), ConsistentRead=True
        ).get("Item")
        return SessionItem.from_dynamodb(raw, damaged=True) if raw else None

    def forget(self, session: SessionItem) -> bool:
        """Delete a DEAD session and its page; False when the session is not DEAD."""
        try:
            self._client.delete_item(
                TableName=self._table,
                Key=_key(session.worker_id, session.session_gen),
                **session_rules.forget_condition(),
            )
        except ClientError as error:
            if _condition_failed(error):
                return False
            raise
        self._client.delete_item(
            TableName=self._table,
            Key={
                k: to_attribute(v)
                for k, v in schema.page_key(session.worker_id, session.session_gen).items()
            },
        )
        return True

    # --- checkpoint pages ------------------------------------------------------------

    def write_page(
        self,
        worker_id: str,
        session_gen: int,
        entries: Mapping[str, PageEntry],
        now_ms: int,
        number: int,
    ) -> bool:
        """Put the page numbered ``number`` (each write of the session's pages takes a
        higher one); False when a newer one is already there."""
        try:
            self._client.put_item(
                TableName=self._table,
                Item=page_item(worker_id, session_gen, entries, now_ms, number),
                **page_put_condition(number),
            )
        except ClientError as error:
            if _condition_failed(error):
                return False
            raise
        return True

    def read_page(
        self,
        worker_id: str,
        session_gen: int,
        *,
        consistent: bool = True,
        report: Report = log_malformed,
    ) -> CheckpointPage | None:
        """The session's page; None when there is none, or when it cannot be read
        (``report``-ed): a takeover then resumes from each item's own checkpoint."""
        key = {k: to_attribute(v) for k, v in schema.page_key(worker_id, session_gen).items()}
        raw = self._client.get_item(TableName=self._table, Key=key, ConsistentRead=consistent).get(
            "Item"
        )
        if not raw:
            return None
        try:
            return page_from_dynamodb(raw)
        except MalformedItemError as error:
            report(error)
            return None

    # --- plumbing ----------------------------------------------------------------------

    def _conditional(self, worker_id: str, session_gen: int, update: ConditionalUpdate) -> bool:
        try:
            self._client.update_item(
                TableName=self._table, Key=_key(worker_id, session_gen), **update.as_kwargs()
            )
        except ClientError as error:
            if _condition_failed(error):
                return False
            raise
        return True
