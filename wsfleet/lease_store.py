"""Executes the lease rules against DynamoDB with an injected boto3 client."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from wsfleet import lease_rules, schema
from wsfleet.item import ConnectionItem
from wsfleet.item_io import ConditionFailedError, update_connection
from wsfleet.lease_rules import (
    AcquireRefusal,
    ConditionalUpdate,
    Lease,
    ParkOutcome,
    ReleaseOutcome,
    RenewRefusal,
)
from wsfleet.timing import LeaseTiming

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient


@dataclass(frozen=True, slots=True)
class Renewed:
    """A renew that landed: the lease now runs until ``expires_at_ms``."""

    expires_at_ms: int


@dataclass(frozen=True, slots=True)
class Released:
    """What a release did."""

    released: bool
    """The lease was still ours and is now free."""
    restarted: bool
    """The item was STARTED under a newer ``start_gen`` when released."""
    checkpointed: bool
    """The final checkpoint was written (``seq_gen`` unchanged)."""
    parked: bool = False
    """The connection was parked with the release (§3.3.1)."""

    @classmethod
    def of(cls, old: ConnectionItem | None, lease: Lease, *, checkpointed: bool) -> Released:
        restarted = old is not None and lease_rules.restarted_since(old, lease)
        return cls(released=True, restarted=restarted, checkpointed=checkpointed)


class LeaseStore:
    """acquire / renew / release / find orphans, exactly per docs/DESIGN.md §3.

    Every method takes the caller's ``now_ms``. Errors other than a failed condition
    (throttling, timeouts) propagate as botocore exceptions: the outcome is unknown.
    """

    def __init__(self, client: DynamoDBClient, table_name: str, timing: LeaseTiming) -> None:
        self._client = client
        self._table = table_name
        self._timing = timing

    @property
    def timing(self) -> LeaseTiming:
        return self._timing

    def acquire(
        self, connection_id: str, owner: str, now_ms: int, *, token: str | None = None
    ) -> Lease | AcquireRefusal:
        """Take the lease if it is free or lapsed. Exactly one concurrent caller wins.
        ``token`` identifies this attempt (random by default; tests pass their own)."""
        token = token or secrets.token_hex(8)
        try:
            old = self._update(
                connection_id,
                lease_rules.acquire_update(owner, now_ms, self._timing, token),
                return_values="ALL_OLD",
            )
        except ConditionFailedError as failed:
            return lease_rules.acquire_failure(failed.old, owner, token)
        if old is None:  # pragma: no cover - the condition requires an existing item
            return AcquireRefusal.UNKNOWN_ID
        return lease_rules.lease_won(old, owner, now_ms, self._timing)

    def renew(self, lease: Lease, last_seq: int, now_ms: int) -> Renewed | RenewRefusal:
        """Extend the lease and checkpoint ``last_seq`` in one write."""
        update = lease_rules.renew_update(lease, last_seq, now_ms, self._timing)
        try:
            self._update(lease.connection_id, update, return_values="NONE")
        except ConditionFailedError as failed:
            return lease_rules.renew_failure(failed.old, lease)
        return Renewed(expires_at_ms=now_ms + self._timing.lease_ms)

    def release(self, lease: Lease, last_seq: int, now_ms: int) -> Released:
        """Give the lease back with the final checkpoint (kept only while ``seq_gen``
        is unchanged). Errors other than a failed condition propagate: the outcome is
        then unknown and the caller may try again (the write is conditional on owner
        and epoch, so a retry can never free a newer hold)."""
        try:
            old = self._update(
                lease.connection_id,
                lease_rules.release_update(lease, last_seq, now_ms),
                return_values="ALL_OLD",
            )
            return Released.of(old, lease, checkpointed=True)
        except ConditionFailedError as failed:
            outcome = lease_rules.release_failure(failed.old, lease)
        if outcome is ReleaseOutcome.NOT_HELD:
            return Released(released=False, restarted=False, checkpointed=False)
        try:
            old = self._update(
                lease.connection_id,
                lease_rules.release_update(lease, None, now_ms),
                return_values="ALL_OLD",
            )
        except ConditionFailedError:
            return Released(released=False, restarted=False, checkpointed=False)
        return Released.of(old, lease, checkpointed=False)

    def park(self, lease: Lease, last_seq: int, reason: str, now_ms: int) -> Released:
        """Release the lease with the final checkpoint and park the connection, so no
        worker takes it again until the router re-arms it. When the router stopped
        or started it again since this lease was taken, an ordinary release is made
        instead (the router's newer word wins). Errors propagate, as for a release."""
        try:
            self._update(
                lease.connection_id,
                lease_rules.park_update(lease, last_seq, reason, now_ms),
                return_values="NONE",
            )
            return Released(released=True, restarted=False, checkpointed=True, parked=True)
        except ConditionFailedError as failed:
            outcome = lease_rules.park_failure(failed.old, lease)
        if outcome is ParkOutcome.NOT_HELD:
            return Released(released=False, restarted=False, checkpointed=False)
        return self.release(lease, last_seq, now_ms)

    def record_failing_since(self, lease: Lease, since_ms: int, now_ms: int) -> bool:
        """Write when the upstream began failing; False when the lease is no longer
        ours (the renewer will find out)."""
        return self._try(lease, lease_rules.failing_since_update(lease, since_ms, now_ms))

    def clear_failing_since(self, lease: Lease, now_ms: int) -> bool:
        """Remove the failing mark once a message is handled again."""
        return self._try(lease, lease_rules.failing_cleared_update(lease, now_ms))

    def find_orphans(self, now_ms: int, limit: int) -> list[str]:
        """Ids of STARTED connections whose lease is free or lapsed, from the GSI
        (eventually consistent: a stale entry costs one failed acquire)."""
        found: list[str] = []
        for key in self._query_keys(lease_rules.orphan_query(now_ms, self._timing), limit):
            found.append(schema.connection_id_of(key))
        return found

    # --- plumbing ----------------------------------------------------------------------

    def _try(self, lease: Lease, update: ConditionalUpdate) -> bool:
        try:
            self._update(lease.connection_id, update, return_values="NONE")
        except ConditionFailedError:
            return False
        return True

    def _update(
        self,
        connection_id: str,
        update: ConditionalUpdate,
        *,
        return_values: Literal["NONE", "ALL_OLD"],
    ) -> ConnectionItem | None:
        return update_connection(
            self._client,
            self._table,
            connection_id,
            update.as_kwargs(),
            return_values=return_values,
        )

    def _query_keys(self, query: dict[str, Any], limit: int) -> Iterator[str]:
        remaining = limit
        start_key: dict[str, Any] | None = None
        while remaining > 0:
            page_args: dict[str, Any] = {"TableName": self._table, "Limit": remaining, **query}
            if start_key:
                page_args["ExclusiveStartKey"] = start_key
            page = self._client.query(**page_args)
            for raw in page.get("Items", []):
                remaining -= 1
                yield str(raw[schema.PARTITION_KEY]["S"])
            start_key = page.get("LastEvaluatedKey")
            if not start_key:
                return
