"""Names of the connection table, its index and its attributes (docs/DESIGN.md §2).

The CDK stack, the router and the worker all read these constants, so the
infrastructure and the code that uses it cannot drift apart.
"""

from __future__ import annotations

import re
from typing import Final

PARTITION_KEY: Final = "Pk"
KEY_PREFIX: Final = "CONN#"

STATE_INDEX_NAME: Final = "by-desired-state"
STATE_INDEX_PARTITION_KEY: Final = "desired_state"
STATE_INDEX_SORT_KEY: Final = "lease_expires_at_ms"

DESIRED_STATE: Final = "desired_state"
WS_URL: Final = "ws_url"
LEASE_OWNER: Final = "lease_owner"
LEASE_EXPIRES_AT_MS: Final = "lease_expires_at_ms"
LEASE_EPOCH: Final = "lease_epoch"
LEASE_TOKEN: Final = "lease_token"
"""Random per acquire attempt: tells a retried acquire that landed from an older hold."""
LAST_SEQ: Final = "last_seq"
START_GEN: Final = "start_gen"
SEQ_GEN: Final = "seq_gen"
"""+1 whenever the router resets ``last_seq`` (a restart with a new URL): a final
checkpoint is written only while it is unchanged, so it survives a restart with the
same URL and never overwrites the reset of a new one."""
CREATED_AT_MS: Final = "created_at_ms"
UPDATED_AT_MS: Final = "updated_at_ms"
EXPIRES_AT: Final = "expires_at"
"""DynamoDB TTL attribute, in epoch seconds; set only while STOPPED."""
METADATA: Final = "metadata"
PARKED_REASON: Final = "parked_reason"
"""Set by the owner's park write (docs/DESIGN.md §3.3.1): why the upstream was given
up on, short and free of secrets; removed by the router's re-arming start."""
PARKED_AT_MS: Final = "parked_at_ms"
FAILING_SINCE_MS: Final = "failing_since_ms"
"""Epoch ms at which the current streak of upstream failures began (no message handled
since); written once per streak by the owner, removed when a message is handled again,
read by the next owner so a move does not restart the clock."""

PARKED_EXPIRY_MS: Final = 2**53 - 1
"""``lease_expires_at_ms`` of a parked connection: later than any cutoff, so the orphan
query (``lease_expires_at_ms < cutoff`` on the state index) never returns it, while the
attribute stays present and the item stays in the index (the listing by state reads it).
The largest integer a JSON number or a double holds exactly."""

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


def connection_id_of(key: str) -> str:
    """The connection id stored in a table key (inverse of :func:`partition_key`)."""
    if not key.startswith(KEY_PREFIX):
        raise InvalidConnectionIdError(f"not a connection key: {key!r}")
    return key[len(KEY_PREFIX) :]
