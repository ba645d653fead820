"""Executes the lease rules against DynamoDB with an injected boto3 client."""

from __future__ import annotations

import secrets
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from botocore.exceptions import BotoCoreError, ClientError

from wsfleet import lease_rules, schema
from wsfleet.checkpoint_page import CheckpointPage, page_advance_ms, resume_seq
from wsfleet.item import ConnectionItem
from wsfleet.item_io import ConditionFailedError, get_connection, item_key, update_connection
from wsfleet.lease_rules import (
    AcquireRefusal,
    ConditionalUpdate,
    Lease,
    ParkOutcome,
    ReleaseOutcome,
    ReleaseVariant,
    TakeoverStep,
)
from wsfleet.timing import LeaseTiming

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient

BATCH_READ = 100
"""Keys per BatchGetItem (DynamoDB's limit)."""

TAKEOVER_BATCH = 50
"""Takeover writes per transaction (DynamoDB allows 100): a refused transaction is
taken apart, so a smaller one costs less when one of its items changed."""


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
    """The connection was parked with the release (§3.7)."""
    started: bool = False
    """The item was STARTED when released (a holder that stopped on the router's
    notice alone finds a start that came since: docs/DESIGN.md §3.4)."""

    @classmethod
    def of(cls, old: ConnectionItem | None, lease: Lease, *, checkpointed: bool) -> Released:
        restarted = old is not None and lease_rules.restarted_since(old, lease)
        started = old is not None and old.started
        return cls(released=True, restarted=restarted, checkpointed=checkpointed, started=started)


class LeaseStore:
    """acquire / take over / release / park / find free connections, exactly per
    docs/DESIGN.md §3. Every write is conditional and changes ownership; nothing here
    renews anything.

    Every method takes the caller's ``now_ms``. Errors other than a failed condition
    (throttling, timeouts) propagate as botocore exceptions: the outcome is unknown.
    """

    _ATTEMPTS = 3
    """Rounds of a takeover or a release whose condition failed on a changed item."""

    def __init__(
        self,
        client: DynamoDBClient,
        table_name: str,
        timing: LeaseTiming,
        *,
        tokens: Callable[[int], str] = secrets.token_hex,
    ) -> None:
        """``tokens(n)``: ``n`` random bytes as hex, for the attempts' tokens."""
        self._client = client
        self.tokens = tokens
        self._table = table_name
        self._timing = timing
        self._lock = threading.Lock()
        self._takeover_conflicts = 0

    @property
    def timing(self) -> LeaseTiming:
        return self._timing

    @property
    def takeover_conflicts(self) -> int:
        """Takeover writes refused by their condition so far (each one billed as a
        write unit): the cost of racing other takers or the item changing."""
        return self._takeover_conflicts

    def acquire(
        self,
        connection_id: str,
        owner: str,
        session_gen: int,
        now_ms: int,
        *,
        token: str | None = None,
    ) -> Lease | AcquireRefusal:
        """Take the connection if nobody owns it. Exactly one concurrent caller wins.
        ``token`` identifies this attempt (random by default; tests pass their own)."""
        token = token or self.tokens(8)
        update = lease_rules.acquire_update(connection_id, owner, session_gen, now_ms, token)
        try:
            old = self._update(connection_id, update, return_values="ALL_OLD")
        except ConditionFailedError as failed:
            return lease_rules.acquire_failure(failed.old, owner, session_gen, token)
        except ClientError as error:
            # An epoch that is not a number cannot be added to: no acquire ever passes.
            if not _refused_as_invalid(error):
                raise
            seen = self.get(connection_id)
            if seen is None or seen.problem is None:
                raise
            self.park_seen(seen, seen.problem, now_ms)
            return AcquireRefusal.PARKED
        if old is None:  # pragma: no cover - the condition requires an existing item
            return AcquireRefusal.UNKNOWN_ID
        return lease_rules.lease_won(old, owner, session_gen)

    def take_over(
        self,
        seen: ConnectionItem,
        owner: str,
        session_gen: int,
        page: CheckpointPage | None,
        now_ms: int,
        *,
        latency_ms: int | None = None,
    ) -> Lease | TakeoverStep:
        """Take a STARTED connection of a DEAD session, resuming from the session's
        page entry when it belongs to the item's hold and stream. A condition that
        fails because the item changed since it was read (a final checkpoint, a
        restart) is tried again with the item it returned; a STOPPED one is cleared.
        Returns the lease, or why there is none (``CLEAR`` once cleared)."""
        for _ in range(self._ATTEMPTS):
            entry = None if page is None else page.entries.get(seen.connection_id)
            resume = resume_seq(seen.lease_epoch, seen.seq_gen, seen.last_seq, entry)
            token = self.tokens(8)
            update = lease_rules.takeover_update(seen, owner, session_gen, resume, now_ms, token)
            try:
                old = self._update(seen.connection_id, update, return_values="ALL_OLD")
            except ConditionFailedError as failed:
                with self._lock:
                    self._takeover_conflicts += 1
                if failed.old is not None and lease_rules.landed(
                    failed.old, owner, session_gen, token
                ):
                    # An SDK retry of this very takeover, which had landed.
                    return lease_rules.lease_won(
                        failed.old,
                        owner,
                        session_gen,
                        epoch=failed.old.lease_epoch,
                        last_seq=failed.old.last_seq,
                        takeover_latency_ms=latency_ms,
                    )
                step = lease_rules.takeover_failure(failed.old, seen)
                if step is TakeoverStep.RETRY and failed.old is not None:
                    seen = failed.old
                    continue
                if step is TakeoverStep.CLEAR and failed.old is not None:
                    self.clear_dead_owner(failed.old, page, now_ms)
                return step
            if old is None:  # pragma: no cover - the condition requires an existing item
                return TakeoverStep.GONE
            return lease_rules.lease_won(
                old,
                owner,
                session_gen,
                last_seq=resume,
                takeover_latency_ms=latency_ms,
                advanced_at_ms=page_advance_ms(old.lease_epoch, old.seq_gen, entry),
            )
        return TakeoverStep.GONE

    def take_over_many(
        self,
        seen: Sequence[ConnectionItem],
        owner: str,
        session_gen: int,
        page: CheckpointPage | None,
        now_ms: int,
        *,
        latency_ms: int | None = None,
    ) -> dict[str, Lease | TakeoverStep]:
        """:meth:`take_over` for many connections of one DEAD session, in transactions
        of up to :data:`TAKEOVER_BATCH` writes (each write exactly the one
        :meth:`take_over` would send, with its condition), then one strongly consistent
        batch read for what the leases need. A transaction that is refused as a whole
        (one condition failed: an item changed since it was read) is taken apart: each
        of its connections goes through :meth:`take_over`, which decides on its own
        item. A few requests take over hundreds of connections, so a takeover is not
        bound by one round trip per connection.

        A transaction whose answer never came (a timeout, a connection lost: its
        outcome is unknown) is read back: it landed whole or not at all, and its token
        on the items tells which. Landed, its connections are this session's as if it
        had answered; not landed, they are taken apart like a refused one. (Left in
        doubt, they would be owned by this session and run by nobody until the own
        check released them, seconds later.)"""
        results: dict[str, Lease | TakeoverStep] = {}
        for start in range(0, len(seen), TAKEOVER_BATCH):
            chunk = list(seen[start : start + TAKEOVER_BATCH])
            token = self.tokens(8)
            resumes = {
                item.connection_id: resume_seq(
                    item.lease_epoch,
                    item.seq_gen,
                    item.last_seq,
                    None if page is None else page.entries.get(item.connection_id),
                )
                for item in chunk
            }
            actions = [
                {
                    "Update": {
                        "TableName": self._table,
                        "Key": item_key(item.connection_id),
                        **lease_rules.takeover_update(
                            item, owner, session_gen, resumes[item.connection_id], now_ms, token
                        ).as_kwargs(),
                    }
                }
                for item in chunk
            ]
            ids = [item.connection_id for item in chunk]
            try:
                self._client.transact_write_items(
                    TransactItems=actions,  # type: ignore[arg-type]
                    ClientRequestToken=token,
                )
            except ClientError as error:
                if error.response.get("Error", {}).get("Code") != "TransactionCanceledException":
                    raise
                after = None
            except BotoCoreError:
                read_back = self._get_many(ids)
                landed = any(
                    lease_rules.landed(item, owner, session_gen, token) for item in read_back
                )
                after = read_back if landed else None
            else:
                after = self._get_many(ids)
            if after is None:
                for item in chunk:
                    results[item.connection_id] = self.take_over(
                        item, owner, session_gen, page, now_ms, latency_ms=latency_ms
                    )
                continue
            advances = {
                item.connection_id: page_advance_ms(
                    item.lease_epoch,
                    item.seq_gen,
                    None if page is None else page.entries.get(item.connection_id),
                )
                for item in chunk
            }
            conditioned = {item.connection_id: item for item in chunk}
            for item in after:
                cid = item.connection_id
                if item.lease_owner == owner and item.owner_session_gen == session_gen:
                    results[cid] = lease_rules.lease_after_takeover(
                        conditioned[cid],
                        item,
                        owner,
                        session_gen,
                        resume_seq=resumes[cid],
                        takeover_latency_ms=latency_ms,
                        advanced_at_ms=advances[cid],
                    )
        return results

    def clear_dead_owner(
        self, seen: ConnectionItem, page: CheckpointPage | None, now_ms: int
    ) -> bool:
        """Remove a DEAD session from a STOPPED connection, keeping the checkpoint of
        its page entry for a later start on the same stream; False when it changed."""
        entry = None if page is None else page.entries.get(seen.connection_id)
        resume = resume_seq(seen.lease_epoch, seen.seq_gen, seen.last_seq, entry)
        try:
            self._update(
                seen.connection_id,
                lease_rules.clear_owner_update(seen, now_ms, resume),
                return_values="NONE",
            )
        except ConditionFailedError:
            return False
        return True

    def release(
        self,
        lease: Lease,
        last_seq: int | None,
        now_ms: int,
        *,
        advanced_at_ms: int | None = None,
    ) -> Released:
        """Give the connection back with the final checkpoint (kept only while
        ``seq_gen`` is unchanged; None: no checkpoint, nothing was handled under this
        lease) and, when given, the time it last moved; a STARTED one goes into the
        unowned index in the same write. Errors other than a failed condition
        propagate: the outcome is then unknown and the caller may try again (the
        write is conditional on owner and epoch, so a retry can never free a newer
        hold)."""
        variant = ReleaseVariant(started=True, with_checkpoint=last_seq is not None)
        for _ in range(self._ATTEMPTS):
            update = lease_rules.release_update(
                lease,
                last_seq if variant.with_checkpoint else None,
                now_ms,
                started=variant.started,
                advanced_at_ms=advanced_at_ms,
            )
            try:
                old = self._update(lease.connection_id, update, return_values="ALL_OLD")
            except ConditionFailedError as failed:
                old = failed.old
                outcome = lease_rules.release_failure(old, lease)
                if old is None or outcome is ReleaseOutcome.NOT_HELD:
                    break
                if outcome is ReleaseOutcome.LANDED:
                    # An earlier try landed, its answer lost: released, with this
                    # release's checkpoint when the item holds it.
                    checkpointed = (
                        last_seq is not None
                        and lease_rules.same_stream(old, lease)
                        and old.last_seq == last_seq
                    )
                    return Released.of(old, lease, checkpointed=checkpointed)
                variant = lease_rules.release_retry(old, lease, variant.with_checkpoint)
                continue
            return Released.of(old, lease, checkpointed=variant.with_checkpoint)
        return Released(released=False, restarted=False, checkpointed=False)

    def park(self, lease: Lease, last_seq: int, reason: str, now_ms: int) -> Released:
        """Release the connection with the final checkpoint and park it, so no worker
        takes it again until the router re-arms it. When the router stopped or
        started it again since this lease was taken, an ordinary release is made
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

    def park_malformed(self, lease: Lease, reason: str, now_ms: int) -> Released:
        """Park the item a lease was just won on because it cannot be run (``reason``:
        ``lease.malformed``), without touching its malformed attributes."""
        try:
            self._update(
                lease.connection_id,
                lease_rules.park_malformed_update(lease, reason, now_ms),
                return_values="NONE",
            )
        except ConditionFailedError:
            return Released(released=False, restarted=False, checkpointed=False)
        return Released(released=True, restarted=False, checkpointed=False, parked=True)

    def park_seen(self, seen: ConnectionItem, reason: str, now_ms: int) -> bool:
        """Park a STARTED item that cannot be run, as read, without taking it (free, or a
        dead session's; ``reason``: its problem); False when it changed since read."""
        try:
            self._update(
                seen.connection_id,
                lease_rules.park_seen_update(seen, reason, now_ms),
                return_values="NONE",
            )
        except ConditionFailedError:
            return False
        return True

    def begin_generation(
        self, lease: Lease, seq_gen: int, first_seq: int, previous_last: int, now_ms: int
    ) -> bool:
        """Record that the upstream started its sequence over at ``first_seq``: the
        stream goes on as generation ``seq_gen`` (:func:`lease_rules.new_generation_update`).
        False when the lease or the start is no longer this holder's; errors propagate
        (the outcome is then unknown, and the same write may be made again)."""
        update = lease_rules.new_generation_update(lease, seq_gen, first_seq, previous_last, now_ms)
        return self._try(lease, update)

    def record_failing_since(self, lease: Lease, since_ms: int, now_ms: int) -> bool:
        """Write when the upstream began failing; False when the lease is no longer
        ours."""
        return self._try(lease, lease_rules.failing_since_update(lease, since_ms, now_ms))

    def clear_failing_since(self, lease: Lease, now_ms: int) -> bool:
        """Remove the failing mark once a message is handled again."""
        return self._try(lease, lease_rules.failing_cleared_update(lease, now_ms))

    def get(self, connection_id: str) -> ConnectionItem | None:
        """The item, read strongly consistently."""
        return get_connection(self._client, self._table, connection_id)

    def get_many(self, connection_ids: Sequence[str]) -> dict[str, ConnectionItem]:
        """The items that exist, by id, read strongly consistently in batches of
        :data:`BATCH_READ` (one round trip per batch, not per item)."""
        ids = list(dict.fromkeys(connection_ids))
        found: dict[str, ConnectionItem] = {}
        for start in range(0, len(ids), BATCH_READ):
            for item in self._get_many(ids[start : start + BATCH_READ]):
                found[item.connection_id] = item
        return found

    def find_unowned(self, shards: list[str], limit: int) -> list[str]:
        """Ids of STARTED, unowned, unparked connections from the given shards of the
        sparse ``unowned`` index (eventually consistent: a stale entry costs one failed
        acquire)."""
        found: list[str] = []
        for shard in shards:
            if len(found) >= limit:
                break
            query = {
                "IndexName": schema.UNOWNED_INDEX_NAME,
                "KeyConditionExpression": "#free = :shard",
                "ExpressionAttributeNames": {"#free": schema.FREE_SHARD},
                "ExpressionAttributeValues": {":shard": {"S": shard}},
            }
            for raw in self._query(query, limit - len(found)):
                found.append(schema.connection_id_of(str(raw[schema.PARTITION_KEY]["S"])))
        return found

    def owned_page(
        self, owner_key: str, start_key: dict[str, Any] | None, limit: int
    ) -> tuple[list[ConnectionItem], dict[str, Any] | None]:
        """One page of at most ``limit`` entries of one ``owner_key`` of the
        ``by-owner`` index, from ``start_key`` (None: the first page); the entries and
        where the next page starts (None: that was the last). Paging keeps each
        response small: parsing a thousand entries at once holds the GIL long enough
        to make the worker's event loop late (docs/DESIGN.md §4.2)."""
        query: dict[str, Any] = {
            "TableName": self._table,
            **_owner_query(owner_key),
            "Limit": limit,
        }
        if start_key:
            query["ExclusiveStartKey"] = start_key
        page = self._client.query(**query)
        items = [ConnectionItem.from_dynamodb(raw) for raw in page.get("Items", [])]
        return items, page.get("LastEvaluatedKey") or None

    def owned_by(self, worker_id: str, session_gen: int) -> list[ConnectionItem]:
        """The connections a session owns, from the ``by-owner`` index (its projection:
        owner, session, desired state, start_gen, epoch, seq_gen, last_seq)."""
        found: list[ConnectionItem] = []
        for key in schema.owner_keys(worker_id, session_gen):
            query = _owner_query(key)
            found += [ConnectionItem.from_dynamodb(raw) for raw in self._query(query, None)]
        return found

    # --- plumbing ----------------------------------------------------------------------

    def _get_many(self, connection_ids: list[str]) -> list[ConnectionItem]:
        """The items, read strongly consistently in one batch (retrying what DynamoDB
        leaves unprocessed)."""
        keys = [item_key(cid) for cid in connection_ids]
        found: list[ConnectionItem] = []
        while keys:
            response = self._client.batch_get_item(
                RequestItems={self._table: {"Keys": keys, "ConsistentRead": True}}
            )
            responses: dict[str, Any] = dict(response.get("Responses", {}))
            found += [ConnectionItem.from_dynamodb(raw) for raw in responses.get(self._table, [])]
            unprocessed: dict[str, Any] = dict(response.get("UnprocessedKeys", {}))
            keys = list(unprocessed.get(self._table, {}).get("Keys", []))
        return found

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

    def _query(self, query: dict[str, Any], limit: int | None) -> Iterator[dict[str, Any]]:
        remaining = limit
        start_key: dict[str, Any] | None = None
        while remaining is None or remaining > 0:
            page_args: dict[str, Any] = {"TableName": self._table, **query}
            if remaining is not None:
                page_args["Limit"] = remaining
            if start_key:
                page_args["ExclusiveStartKey"] = start_key
            page = self._client.query(**page_args)
            for raw in page.get("Items", []):
                if remaining is not None:
                    remaining -= 1
                yield raw
            start_key = page.get("LastEvaluatedKey")
            if not start_key:
                return


def _refused_as_invalid(error: ClientError) -> bool:
    """DynamoDB refused the request itself: an update that does not fit the item's
    types (``ADD`` to a string)."""
    return error.response.get("Error", {}).get("Code") == "ValidationException"


def _owner_query(owner_key: str) -> dict[str, Any]:
    """The ``by-owner`` index query of one ``owner_key``."""
    return {
        "IndexName": schema.OWNER_INDEX_NAME,
        "KeyConditionExpression": "#okey = :okey",
        "ExpressionAttributeNames": {"#okey": schema.OWNER_KEY},
        "ExpressionAttributeValues": {":okey": {"S": owner_key}},
    }
