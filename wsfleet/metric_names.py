"""Metric names, namespace and dimensions published by the worker (docs/DESIGN.md §6).

The stacks build the scaling policy, dashboard and alarms from these constants.
"""

from __future__ import annotations

from typing import Final

DEFAULT_NAMESPACE: Final = "WebSocketFleet"
DEFAULT_SERVICE_NAME: Final = "websocket-fleet"
SERVICE_DIMENSION: Final = "Service"
TASK_DIMENSION: Final = "TaskId"

ACTIVE_CONNECTIONS: Final = "ActiveConnections"
LEASES_ACQUIRED: Final = "LeasesAcquired"
LEASES_LOST: Final = "LeasesLost"
LEASES_RELEASED: Final = "LeasesReleased"
RENEW_FAILURES: Final = "RenewFailures"
"""Failed session renews (an error, a timeout or a refusal)."""
SESSIONS_REAPED: Final = "SessionsReaped"
"""Lapsed sessions of other workers this worker marked DEAD."""
ORPHANS_FOUND: Final = "OrphansFound"
TAKEOVER_LATENCY_MS: Final = "TakeoverLatencyMs"
MESSAGES_PROCESSED: Final = "MessagesProcessed"
UPSTREAM_RECONNECTS: Final = "UpstreamReconnects"
HANDLER_ERRORS: Final = "HandlerErrors"
CONNECTIONS_FAILED: Final = "ConnectionsFailed"
CONNECTIONS_MOVED: Final = "ConnectionsMoved"
"""Connections this worker handed to another in a balance round (not at shutdown)."""
UPSTREAM_GAP_MS: Final = "UpstreamGapMs"
"""Values: for a stream that cannot resume, the time from the previous delivery to the
first one after a move or a reconnect (what was sent meanwhile is lost)."""
UPSTREAM_GAPS: Final = "UpstreamGaps"
"""How many such gaps were measured."""
MALFORMED_ITEMS: Final = "MalformedItems"
"""Items this worker met that cannot be decoded or run (each counted once)."""
FOREIGN_SESSIONS: Final = "ForeignSessions"
"""Live sessions of another session protocol, counted each time this worker was about
to open a session and refused to (docs/DEPLOY.md, "Changing the session protocol")."""

SINK_MESSAGES_SET_ASIDE: Final = "SinkMessagesSetAside"
"""Messages a built-in sink could never send (not JSON, over the service's limit,
refused for good) and sent as a set-aside envelope in their place; published by the
sink when it happens, not every period."""
UNREADABLE_FRAMES: Final = "UnreadableFrames"
"""Upstream frames that are no message of the connection's protocol (not JSON, no
seq, a compressed frame that does not inflate or inflates past the limit): logged and
skipped, each costing only itself."""
MESSAGES_SKIPPED: Final = "MessagesSkipped"
"""Messages of handler calls that failed and were skipped (``HANDLER_ERRORS=skip``):
lost by choice, counted so the loss shows."""
SEQUENCE_RESETS: Final = "SequenceResets"
"""Times an upstream started its sequence over and a connection began a new sequence
generation (nothing of either numbering dropped)."""
SEQUENCE_COPIES: Final = "SequenceCopies"
"""Messages at or below the checkpoint taken for copies and dropped (the spec's
``restarts`` says when such a seq is a restart instead)."""
SEQUENCE_GAPS: Final = "SequenceGaps"
"""Messages that did not follow the one before (a jump, or a broken chain): resumed
from the checkpoint when the stream can resume, taken as they come when it cannot."""

COUNTERS: Final = (
    LEASES_ACQUIRED,
    LEASES_LOST,
    LEASES_RELEASED,
    RENEW_FAILURES,
    SESSIONS_REAPED,
    ORPHANS_FOUND,
    MESSAGES_PROCESSED,
    UPSTREAM_RECONNECTS,
    HANDLER_ERRORS,
    CONNECTIONS_FAILED,
    CONNECTIONS_MOVED,
    UPSTREAM_GAPS,
    MALFORMED_ITEMS,
    FOREIGN_SESSIONS,
    MESSAGES_SKIPPED,
    UNREADABLE_FRAMES,
    SEQUENCE_RESETS,
    SEQUENCE_COPIES,
    SEQUENCE_GAPS,
)
"""Published every period, zeros included."""
