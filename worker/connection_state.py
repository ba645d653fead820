"""The decisions of one owned connection, with no I/O and no clock.

:class:`ConnectionState` is to :mod:`worker.connection` what python-websockets'
sans-I/O ``Protocol`` is to its asyncio connection: the runner feeds it what happened
(a frame's seq, a handler call that returned or failed, a renew that was sent,
answered or failed, a request to stop) with the loop time of the moment, and it
answers with the decision to act on (call the handler or not, reconnect, retry, skip,
fence, end). The runner keeps the sockets, tasks, timers and logs; every rule that
keeps the lease safe lives here and is tested with tables of inputs.

Times are monotonic seconds (the event loop's clock); ``timing`` supplies the lease,
heartbeat, skew and margin.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from wsfleet import lease_rules
from wsfleet.lease_rules import RenewRefusal
from wsfleet.timing import LeaseTiming


class Ending(enum.Enum):
    """Why a connection stopped running on this worker."""

    SHUTDOWN = "shutdown"
    STOPPED = "stopped"
    RESTARTED = "restarted"
    GONE = "gone"
    LOST = "lost"
    FENCED = "fenced"
    PARKED = "parked"
    """The upstream was given up on (worker.upstream_failures): release and park it."""

    @property
    def graceful(self) -> bool:
        """The lease is ours: finish the handler call in flight, then release."""
        return self in (Ending.SHUTDOWN, Ending.STOPPED, Ending.RESTARTED, Ending.PARKED)

    @property
    def releases(self) -> bool:
        # FENCED: ownership is unknown (DynamoDB unreachable or the process was
        # paused); the release is conditional on owner and epoch, so trying costs
        # nothing when another worker holds it and frees it at once when not.
        return self.graceful or self is Ending.FENCED

    @property
    def loses_lease(self) -> bool:
        """Counted as ``LeasesLost``: the lease was (or may have been) taken away."""
        return self in (Ending.LOST, Ending.FENCED)


REFUSAL_ENDINGS = {
    RenewRefusal.LOST: Ending.LOST,
    RenewRefusal.STOPPED: Ending.STOPPED,
    RenewRefusal.RESTARTED: Ending.RESTARTED,
    RenewRefusal.GONE: Ending.GONE,
}
"""How a refused renew ends the connection (``SUPERSEDED`` does not end it)."""


class Frame(enum.Enum):
    """What an upstream message's seq means against the checkpoint."""

    NEXT = "next"
    """``checkpoint + 1``: hand it to the handler."""
    DUPLICATE = "duplicate"
    """At or below the checkpoint: already handled, drop it."""
    GAP = "gap"
    """Beyond ``checkpoint + 1``: something was skipped; reconnect to resume."""


class Call(enum.Enum):
    """Whether a handler call may start now."""

    GO = "go"
    STOP = "stop"
    """The connection is ending: no call starts any more."""
    FENCE = "fence"
    """The fence deadline has passed: the connection is now fenced."""


class Failure(enum.Enum):
    """What a failed handler call means."""

    RETRY = "retry"
    """Not handled: call again with the same message after a backoff."""
    SKIP = "skip"
    """``HANDLER_ERRORS=skip``: counted, checkpointed past, not retried."""
    FENCE = "fence"
    """The call ran into the fence deadline: the connection is now fenced."""


class RenewStep(enum.Enum):
    """What to do after a renew was answered or failed."""

    CONTINUE = "continue"
    """Keep renewing at :attr:`ConnectionState.next_renew`."""
    FENCE = "fence"
    """The fence deadline passed without a successful renew: fenced."""
    END = "end"
    """A refusal decided the ending (:attr:`ConnectionState.ending`)."""


@dataclass
class ConnectionState:
    """One connection's checkpoint, fence deadline, renew schedule and ending.

    ``acquired_at``: loop time just before the acquire was sent (the acquire proves
    the lease like a renew does).
    """

    timing: LeaseTiming
    checkpoint: int
    acquired_at: float
    skip_failed_messages: bool = False

    def __post_init__(self) -> None:
        self.deadline = lease_rules.fence_deadline(self.acquired_at, self.timing)
        """No handler call may start at or after this instant, and each is bounded by it."""
        self.next_renew = self.acquired_at + self.timing.heartbeat
        self.ending: Ending | None = None
        self.drain_deadline = self.deadline
        """For a graceful ending: the fence deadline at the moment of the stop."""

    # --- ending --------------------------------------------------------------------------

    @property
    def stopping(self) -> bool:
        """An ending is decided: no handler call starts any more."""
        return self.ending is not None

    def end(self, ending: Ending, now: float) -> bool:
        """Decide the ending; the first decision wins (True when this one did).

        A graceful ending fixes the deadline of the call in flight at this moment: at
        most the current fence deadline and at most the drain budget away, so renews
        during the drain cannot stretch it.
        """
        if self.ending is not None:
            return False
        self.ending = ending
        if ending.graceful:
            self.drain_deadline = min(self.deadline, now + self.timing.drain_budget)
        return True

    @property
    def call_deadline(self) -> float:
        """What bounds the handler call in flight: the fence deadline, or the drain
        deadline once a graceful ending is decided."""
        if self.ending is not None and self.ending.graceful:
            return self.drain_deadline
        return self.deadline

    def may_handle(self, now: float) -> bool:
        return lease_rules.may_handle(now, self.deadline)

    # --- frames and handler calls ----------------------------------------------------

    def classify(self, seq: int) -> Frame:
        if seq <= self.checkpoint:
            return Frame.DUPLICATE
        if seq != self.checkpoint + 1:
            return Frame.GAP
        return Frame.NEXT

    def before_call(self, now: float) -> Call:
        """Checked synchronously right before every handler call: after a pause,
        buffered frames are read before any timer fires, and this stops them."""
        if self.stopping:
            return Call.STOP
        if not self.may_handle(now):
            self.end(Ending.FENCED, now)
            return Call.FENCE
        return Call.GO

    def call_returned(self, seq: int) -> None:
        """The checkpoint passes a message only once its handler call returned."""
        self.checkpoint = seq

    def call_failed(self, seq: int, now: float, *, hit_deadline: bool) -> Failure:
        """``hit_deadline``: the call was cut by its deadline (not a failure of the
        handler's own)."""
        if hit_deadline:
            self.end(Ending.FENCED, now)
            return Failure.FENCE
        if self.skip_failed_messages:
            self.checkpoint = seq
            return Failure.SKIP
        return Failure.RETRY

    # --- renewing ----------------------------------------------------------------------

    def renew_wake_at(self) -> float:
        """When the renewer must act next: the next renew, or the fence deadline if
        that comes first."""
        return min(self.next_renew, self.deadline)

    def before_renew(self, now: float) -> bool:
        """False (and fenced) when the deadline passed without a successful renew."""
        if self.may_handle(now):
            return True
        self.end(Ending.FENCED, now)
        return False

    def renew_failed(self, now: float) -> RenewStep:
        """An error or a timeout: the outcome is unknown. Retry after a quarter
        heartbeat while the fence deadline is ahead."""
        if not self.may_handle(now):
            self.end(Ending.FENCED, now)
            return RenewStep.FENCE
        self.next_renew = now + self.timing.heartbeat / 4
        return RenewStep.CONTINUE

    def renewed(self, sent_at: float) -> float | None:
        """A renew sent at ``sent_at`` landed: the lease is proven until
        ``sent_at + fence_after``. Returns the new deadline of the call in flight
        when it moved (never once the connection is ending), else None."""
        self.next_renew = sent_at + self.timing.heartbeat
        deadline = lease_rules.fence_deadline(sent_at, self.timing)
        if deadline <= self.deadline:
            return None
        self.deadline = deadline
        return None if self.stopping else deadline

    def renew_refused(self, refusal: RenewRefusal, sent_at: float, now: float) -> RenewStep:
        self.next_renew = sent_at + self.timing.heartbeat
        if refusal.keeps_lease:
            return RenewStep.CONTINUE
        self.end(REFUSAL_ENDINGS[refusal], now)
        return RenewStep.END
