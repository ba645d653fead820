"""Names of the connection table, its index and its attributes (docs/DESIGN.md §2).

The CDK stack, the router and the worker all read these constants, so the
infrastructure and the code that uses it cannot drift apart.
"""

from __future__ import annotations

import re
import zlib
from typing import Final

PARTITION_KEY: Final = "Pk"
SORT_KEY: Final = "Sk"
KEY_PREFIX: Final = "CONN#"
CONNECTION_SORT_KEY: Final = "CONN"
"""The sort key of every connection item (one item per partition)."""

STATE_INDEX_NAME: Final = "by-desired-state"
"""Lists connections by desired state (the router's listing); written only by starts
and stops, never by a worker."""
STATE_INDEX_PARTITION_KEY: Final = "desired_state"
STATE_INDEX_SORT_KEY: Final = PARTITION_KEY

OWNER_INDEX_NAME: Final = "by-owner"
"""A session's connections: ``owner_key`` moves only when ownership does."""
OWNER_KEY: Final = "owner_key"
"""``<worker_id>#<session_gen>#<shard>`` while owned; absent when free."""
OWNER_INDEX_PROJECTION: Final = (
    "lease_owner",
    "owner_session_gen",
    "desired_state",
    "start_gen",
    "lease_epoch",
    "seq_gen",
    "last_seq",
    "parked_reason",
)
"""What a takeover decides on; all of it changes only with ownership or the router."""
OWNER_SHARDS: Final = 4
"""A session's connections spread over this many index partitions, so a takeover of
a large session does not write one index partition at a thousand writes a second."""

UNOWNED_INDEX_NAME: Final = "unowned"
"""Sparse: a connection is in it exactly while STARTED, unowned and not parked."""
FREE_SHARD: Final = "free_shard"
"""``FREE#<n>``, present exactly while the connection is STARTED, unowned and not
parked; set by the write that frees it (create, restart, release), removed by the
write that takes it (acquire) or parks or stops it."""
UNOWNED_SHARDS: Final = 8

# --- sessions and checkpoint pages (docs/DESIGN.md §3) ---------------------------------

SESSION_KEY_PREFIX: Final = "SESSIONS#"
"""Sessions live in ``SESSION_SHARDS`` item collections (``SESSIONS#0``...), listed
by a Query on the table itself: the renew writes one small item and no index."""
SESSION_SHARDS: Final = 4
PAGE_KEY_PREFIX: Final = "PAGE#"
PAGE_SORT_KEY: Final = "PAGE"

SESSION_STATE: Final = "state"
SESSION_EXPIRES_AT_MS: Final = "expires_at_ms"
"""N: the writer's wall clock at its last renew plus the lease: for people (when the
session would lapse), never decided on."""
SESSION_STARTED_AT_MS: Final = "started_at_ms"
SESSION_REAPED_AT_MS: Final = "reaped_at_ms"
SESSION_REAPED_BY: Final = "reaped_by"
SESSION_TAKERS: Final = "takers"
"""List on a DEAD session, written by its reap: who takes which of its connections,
``[[worker_id, last connection id of that part, or NULL for the last part], ...]``
(docs/DESIGN.md §3.2)."""
SESSION_NOTICES: Final = "notices"
"""String set on a session: ``<connection_id> <start|stop> <now_ms> <nonce>`` tokens
the router adds when it starts or stops a connection the session owns."""
SESSION_CAPACITY: Final = "capacity"
SESSION_CONNECTIONS: Final = "connections"
SESSION_BEAT: Final = "beat"
"""N: how many renews the session has had (0 when opened; every renew adds 1). A
reaper reaps only a session whose beat it has seen unchanged for longer than the
lease on its own monotonic clock, and only with that beat as its condition
(docs/DESIGN.md §3.6)."""
SESSION_PROTOCOL: Final = "proto"
"""N: the session protocol of the worker that opened it (:data:`SESSION_PROTOCOL_NOW`)."""
SESSION_PROTOCOL_NOW: Final = 2
"""The session protocol: what the session items mean and how they are renewed and
reaped. 2: expiry by observation (a beat); 1, or no ``protocol``: expiry by the
writer's wall clock. Workers of different protocols must not share a table
(docs/DEPLOY.md)."""
SESSION_VERSION: Final = "version"
"""S: the project version of the worker that opened the session (:mod:`wsfleet.version`),
written once by the open; shown for a connection's owner. Read leniently: a session
item is never malformed for it."""
ALIVE: Final = "ALIVE"
DEAD: Final = "DEAD"

PAGE_ENTRIES: Final = "entries"
"""Binary: zlib-compressed JSON rows ``[connection_id, epoch, seq_gen, seq, ms before the
write when seq last moved, or -1]``."""
PAGE_WRITTEN_AT_MS: Final = "written_at_ms"
"""N: the writer's wall clock at the write: shown (a checkpoint's age), never compared."""
PAGE_NUMBER: Final = "page_no"
"""N: the page's number in its session, counted by the writer: a page never replaces one
of a higher number (docs/DESIGN.md §3.5)."""
PAGE_HEALTH: Final = "health"
"""Binary, optional: zlib-compressed JSON ``{"r": [messages/s of each row of entries, in
order], "t": {connection_id: [status, reconnects, last upstream error]}}``, ``t`` only
for connections not streaming or reconnected during the hold."""

DESIRED_STATE: Final = "desired_state"
WS_URL: Final = "ws_url"
LEASE_OWNER: Final = "lease_owner"
OWNER_SESSION_GEN: Final = "owner_session_gen"
"""The owner's ``session_gen``: the lease lives exactly as long as that session."""
LEASE_EPOCH: Final = "lease_epoch"
LEASE_TOKEN: Final = "lease_token"
"""Random per acquire attempt: tells a retried acquire that landed from an older hold."""
LAST_SEQ: Final = "last_seq"
START_GEN: Final = "start_gen"
SEQ_GEN: Final = "seq_gen"
"""+1 whenever the router resets ``last_seq`` (a restart with a new URL or a new
protocol): a final checkpoint is written only while it is unchanged, so it survives a
restart of the same stream and never overwrites the reset of a new one."""
CREATED_AT_MS: Final = "created_at_ms"
UPDATED_AT_MS: Final = "updated_at_ms"
EXPIRES_AT: Final = "expires_at"
"""DynamoDB TTL attribute, in epoch seconds; set only while STOPPED."""
METADATA: Final = "metadata"
PROTOCOL: Final = "protocol"
"""S, optional: the connection's protocol spec as compact JSON
(:mod:`wsfleet.protocol_specs`); absent: the worker's default protocol."""
AUTH_SECRET: Final = "auth_secret"
"""S, optional: the Secrets Manager secret (name or ARN) the worker reads credentials
from at connect time (:mod:`wsfleet.secret_refs`); never the secret's value."""
ADVANCED_AT_MS: Final = "advanced_at_ms"
"""N, optional: epoch ms of the last checkpoint advance, as a release left it (with the
final checkpoint), so the next owner of a stream that cannot resume can tell how long
nobody delivered (docs/DESIGN.md §4.6, "Gaps"). Meaningful only under the start it was
written in: ``ADVANCED_START_GEN``."""
ADVANCED_START_GEN: Final = "advanced_start_gen"
"""N, optional: the ``start_gen`` the releasing holder ran under when it wrote
``ADVANCED_AT_MS``; a start since (a stop and a start, a re-arm) makes it stale."""
PARKED_REASON: Final = "parked_reason"
"""Set by the owner's park write (docs/DESIGN.md §3.7): why the upstream was given
up on, short and free of secrets; removed by the router's re-arming start."""
PARKED_AT_MS: Final = "parked_at_ms"
FAILING_SINCE_MS: Final = "failing_since_ms"
"""Epoch ms at which the current streak of upstream failures began (no message handled
since); written once per streak by the owner, removed when a message is handled again,
read by the next owner so a move does not restart the clock."""

SEQ_RESET_AT_MS: Final = "seq_reset_at_ms"
"""Epoch ms at which the owner last saw the upstream start its sequence over and began
generation ``seq_gen``; written by that owner, removed by a start of a new stream."""
SEQ_RESET_FROM: Final = "seq_reset_from"
"""The checkpoint of the generation before: where the old numbering ended."""

STARTED: Final = "STARTED"
STOPPED: Final = "STOPPED"
DESIRED_STATES: Final = (STARTED, STOPPED)

CONNECTION_ID_PATTERN: Final = r"^[A-Za-z0-9._:-]{1,128}$"
_CONNECTION_ID_RE: Final = re.compile(CONNECTION_ID_PATTERN)


class InvalidConnectionIdError(ValueError):
    """A connection id outside ``CONNECTION_ID_PATTERN``."""


def is_valid_connection_id(connection_id: object) -> bool:
    """True when ``connection_id`` is a string of 1-128 chars of ``[A-Za-z0-9._:-]``."""
    return isinstance(connection_id, str) and _CONNECTION_ID_RE.fullmatch(connection_id) is not None


def partition_key(connection_id: str) -> str:
    """The table key of a connection; refuses ids outside the pattern."""
    if not is_valid_connection_id(connection_id):
        raise InvalidConnectionIdError(f"invalid connection id: {connection_id!r}")
    return KEY_PREFIX + connection_id


def connection_key(connection_id: str) -> dict[str, str]:
    """The full table key of a connection item, as plain strings."""
    return {PARTITION_KEY: partition_key(connection_id), SORT_KEY: CONNECTION_SORT_KEY}


def shard_of(connection_id: str, shards: int) -> int:
    """A stable shard of a connection id (the same in every process)."""
    return zlib.crc32(connection_id.encode()) % shards


def owner_key(worker_id: str, session_gen: int, connection_id: str) -> str:
    return f"{worker_id}#{session_gen}#{shard_of(connection_id, OWNER_SHARDS)}"


def owner_keys(worker_id: str, session_gen: int) -> list[str]:
    """Every ``owner_key`` of one session (one per owner shard)."""
    return [f"{worker_id}#{session_gen}#{n}" for n in range(OWNER_SHARDS)]


def free_shard(connection_id: str) -> str:
    return f"FREE#{shard_of(connection_id, UNOWNED_SHARDS)}"


def free_shards() -> list[str]:
    return [f"FREE#{n}" for n in range(UNOWNED_SHARDS)]


def session_partition(worker_id: str) -> str:
    return f"{SESSION_KEY_PREFIX}{zlib.crc32(worker_id.encode()) % SESSION_SHARDS}"


def session_partitions() -> list[str]:
    return [f"{SESSION_KEY_PREFIX}{n}" for n in range(SESSION_SHARDS)]


def session_sort_key(worker_id: str, session_gen: int) -> str:
    return f"{worker_id}#{session_gen}"


def session_key(worker_id: str, session_gen: int) -> dict[str, str]:
    return {
        PARTITION_KEY: session_partition(worker_id),
        SORT_KEY: session_sort_key(worker_id, session_gen),
    }


def page_key(worker_id: str, session_gen: int) -> dict[str, str]:
    return {PARTITION_KEY: f"{PAGE_KEY_PREFIX}{worker_id}#{session_gen}", SORT_KEY: PAGE_SORT_KEY}


def connection_id_of(key: str) -> str:
    """The connection id stored in a table key (inverse of :func:`partition_key`)."""
    if not key.startswith(KEY_PREFIX):
        raise InvalidConnectionIdError(f"not a connection key: {key!r}")
    return key[len(KEY_PREFIX) :]
