"""The decisions of one owned connection, with no I/O and no clock.

:class:`ConnectionState` is to :mod:`worker.connection` what python-websockets'
sans-I/O ``Protocol`` is to its asyncio connection: the runner feeds it what happened
(a frame's seq, a handler call that returned or failed, a session renew that landed,
a request to stop) with the loop time of the moment, and it answers with the
decision to act on (call the handler, wait, retry, skip, end). The runner keeps the
sockets, tasks, timers and logs; every rule that keeps the connection safe lives here
and is tested with tables of inputs.

The fence deadline is the session's (docs/DESIGN.md §3.6): ``sent_at(last
successful session renew) + lease - margin``. Past it the connection *pauses*:
no handler call starts, the one in flight is cut, and a later successful renew of the
same session (proof that no reap happened) moves the deadline and resumes it under
the same epoch. Only a reap ends it (``LOST``).

Times are monotonic seconds (the event loop's clock); ``timing`` supplies the lease,
heartbeat and margin.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

from wsfleet import lease_rules
from wsfleet.timing import LeaseTiming


class Ending(enum.Enum):
    """Why a connection stopped running on this worker."""

    SHUTDOWN = "shutdown"
    STOPPED = "stopped"
    RESTARTED = "restarted"
    GONE = "gone"
    LOST = "lost"
    """The session was reaped: another worker takes (or took) the connection over."""
    FENCED = "fenced"
    """A task of the runner ended unexpectedly: ownership is in doubt."""
    PARKED = "parked"
    """The upstream was given up on (worker.upstream_failures): release and park it."""
    HANDED_OFF = "handed_off"
    """Released for another worker to take (a balance move or a drain)."""

    @property
    def graceful(self) -> bool:
        """The lease is ours: finish the handler call in flight, then release."""
        return self in (
            Ending.SHUTDOWN,
            Ending.STOPPED,
            Ending.RESTARTED,
            Ending.PARKED,
            Ending.HANDED_OFF,
        )

    @property
    def releases(self) -> bool:
        # FENCED: the runner broke; the release is conditional on owner and epoch,
        # so trying costs nothing when another worker holds it and frees it at once
        # when not.
        return self.graceful or self is Ending.FENCED

    @property
    def loses_lease(self) -> bool:
        """Counted as ``LeasesLost``: the lease was (or may have been) taken away."""
        return self in (Ending.LOST, Ending.FENCED)


class Frame(enum.Enum):
    """What an upstream message's seq means against the checkpoint."""

    NEXT = "next"
    """``checkpoint + 1`` (in a chain: its ``prev`` is the checkpoint): hand it to the
    handler."""
    DUPLICATE = "duplicate"
    """At or below the checkpoint, a copy: already handled, drop it."""
    GAP = "gap"
    """Beyond ``checkpoint + 1`` (in a chain: its ``prev`` is not the checkpoint):
    something was skipped; reconnect to resume."""
    RESET = "reset"
    """At or below the checkpoint and not a copy (:class:`Restarts`): the upstream
    numbers from the start again. A new sequence generation begins with this message."""


class Restarts(enum.Enum):
    """When a seq at or below the checkpoint is the upstream starting its sequence over
    rather than a copy (the protocol spec's ``restarts``)."""

    ON_CONNECT = "on_connect"
    """As the first message of an upstream connection (the upstream was asked to go on
    after the checkpoint and starts over instead); a copy anywhere else."""
    ANYTIME = "anytime"
    """Always: the upstream sends no copies, and may start over mid-stream."""
    NEVER = "never"
    """Never: the upstream sends copies (an overlap on reconnect) and never starts over."""


class Call(enum.Enum):
    """Whether a handler call may start now."""

    GO = "go"
    STOP = "stop"
    """The connection is ending: no call starts any more."""
    PAUSE = "pause"
    """The session's fence deadline has passed: wait for a renew (or the end)."""


class Watch(enum.Enum):
    """What the connection's deadline watchdog does when its timer fires.

    One watchdog per connection bounds every handler call: armed at the call
    deadline when a call starts and no watchdog is armed, never moved by a renew (a
    renew only moves the state's deadline), and on firing it looks again at the state.
    """

    IDLE = "idle"
    """No call in flight: disarm; the next call arms it again."""
    LATER = "later"
    """The call deadline moved past now (renews landed): fire again at the new one."""
    CUT = "cut"
    """The call in flight has reached its deadline: cut it."""


class Failure(enum.Enum):
    """What a failed handler call means."""

    RETRY = "retry"
    """Not handled: call again with the same message after a backoff."""
    SKIP = "skip"
    """``HANDLER_ERRORS=skip``: counted, checkpointed past, not retried."""
    PAUSE = "pause"
    """The call ran into the fence deadline: not handled; call it again once the
    session is renewed (it is not the handler's failure)."""


@dataclass
class ConnectionState:
    """One connection's checkpoint, fence deadline and ending.

    ``deadline``: the session's fence deadline when the connection was taken.
    """

    timing: LeaseTiming
    checkpoint: int
    deadline: float
    """No handler call may start at or after this instant, and each is bounded by it."""
    skip_failed_messages: bool = False
    seq_gen: int = 0
    """The sequence generation the checkpoint counts in: ``(seq_gen, seq)`` names a
    message downstream. It goes up by one when the upstream starts over."""
    restarts: Restarts = Restarts.ON_CONNECT

    def __post_init__(self) -> None:
        self.ending: Ending | None = None
        self.drain_deadline = self.deadline
        """For a graceful ending: the fence deadline at the moment of the stop."""
        self.go_until = self.deadline
        """:meth:`before_call` says ``GO`` exactly when ``now < go_until``: the fence
        deadline while no ending is decided, minus infinity after. The reader's
        per-message check is this one comparison."""

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
        self.go_until = -math.inf
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

    def classify(
        self, seq: int, after: int | None = None, *, prev: int | None = None, first: bool = False
    ) -> Frame:
        """``seq`` against the checkpoint, or, while a batch is being gathered, against
        ``after``: the last seq already taken into it (nothing of it is handled yet).
        ``prev``: the seq the message says came before it, for a chain (whose steps
        need not be 1); ``first``: the first message of this upstream connection."""
        last = self.checkpoint if after is None else after
        if seq <= last:
            restarts = self.restarts
            if restarts is Restarts.ANYTIME or (first and restarts is Restarts.ON_CONNECT):
                return Frame.RESET
            return Frame.DUPLICATE
        if prev is not None:
            # A chain's first message, with nothing before it, starts it.
            return Frame.NEXT if prev == last or last == 0 else Frame.GAP
        if seq != last + 1:
            return Frame.GAP
        return Frame.NEXT

    def new_generation(self, seq_gen: int, first_seq: int) -> None:
        """The upstream started over at ``first_seq`` and generation ``seq_gen`` is
        recorded: the checkpoint counts in it from just before that message."""
        if seq_gen <= self.seq_gen or first_seq < 1:
            raise ValueError(
                f"generation {seq_gen} from seq {first_seq} does not follow {self.seq_gen}"
            )
        self.seq_gen = seq_gen
        self.checkpoint = first_seq - 1

    def before_call(self, now: float) -> Call:
        """Checked synchronously right before every handler call: after a process
        pause, buffered frames are read before any timer fires, and this stops them."""
        if self.ending is not None:
            return Call.STOP
        if not lease_rules.may_handle(now, self.deadline):
            return Call.PAUSE
        return Call.GO

    def watchdog(self, now: float, *, in_call: bool) -> Watch:
        """The watchdog's timer fired at ``now``: cut the call in flight once its
        deadline (:attr:`call_deadline`, the fence or the drain deadline) is reached."""
        if not in_call:
            return Watch.IDLE
        if now < self.call_deadline:
            return Watch.LATER
        return Watch.CUT

    def call_returned(self, seq: int) -> None:
        """The checkpoint passes a message only once its handler call returned; for a
        batch, ``seq`` is its last message's."""
        self.checkpoint = seq

    def call_failed(self, seq: int, *, hit_deadline: bool) -> Failure:
        """``hit_deadline``: the call was cut by its deadline (not a failure of the
        handler's own). For a batch, ``seq`` is its last message's: a batch is retried
        whole, or skipped whole."""
        if hit_deadline:
            return Failure.PAUSE
        if self.skip_failed_messages:
            self.checkpoint = seq
            return Failure.SKIP
        return Failure.RETRY

    # --- the session ------------------------------------------------------------------

    def renewed(self, sent_at: float) -> float | None:
        """A session renew sent at ``sent_at`` landed: handling is proven safe until
        ``sent_at + fence_after``. Returns the new deadline of the call in flight when
        it moved (never once the connection is ending), else None."""
        deadline = lease_rules.fence_deadline(sent_at, self.timing)
        if deadline <= self.deadline:
            return None
        self.deadline = deadline
        if self.stopping:
            return None
        self.go_until = deadline
        return deadline
