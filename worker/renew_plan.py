"""When the session's renews go out, which answers count, and when the session is given
up (docs/DESIGN.md §3.1, §3.6). Pure: fed the monotonic ``now``, no thread, no clock.

- A renew is sent every heartbeat, counted from the previous send, whether or not the
  earlier ones have answered (at most :data:`~wsfleet.timing.RENEWS_IN_FLIGHT` are
  awaited at once); an error answer brings the next one forward to a quarter heartbeat.
- A renew sent at ``sent_at`` is awaited until ``sent_at + fence_after``: landing any
  time before, it moves the fence deadline to exactly that (only forward); an answer
  after it proves nothing for now and moves nothing.
- Once the deadline has passed and one heartbeat more has gone by without a renew that
  moves it, the session is given up: nothing more is sent, no answer counts any more.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from wsfleet.timing import RENEWS_IN_FLIGHT, LeaseTiming


class Step(enum.Enum):
    SEND = "send"
    """Send a renew now (then report it with :meth:`RenewPlan.sent`)."""
    WAIT = "wait"
    """Nothing to do before :meth:`RenewPlan.wake_at`, or an answer."""
    GIVE_UP = "give_up"
    """The session could not be proven for its fence window and a heartbeat: give its
    connections up. Answered once; :attr:`RenewPlan.over` from then on."""


@dataclass(slots=True)
class RenewPlan:
    heartbeat: float
    fence_after: float
    deadline: float
    """The fence deadline: the send of the latest renew that landed, plus the window."""
    next_at: float
    """When the next renew is due."""
    in_flight: list[float] = field(default_factory=list)
    """The sends of the renews not answered yet (their requests may still be running
    after their window: each holds a thread until its client gives up)."""
    cap: int = RENEWS_IN_FLIGHT
    over: bool = False
    """Given up: nothing is sent and no answer counts any more."""

    @classmethod
    def opened(cls, timing: LeaseTiming, sent_at: float, first_at: float) -> RenewPlan:
        """For a session whose open was sent at ``sent_at``; the first renew at
        ``first_at``."""
        return cls(
            heartbeat=timing.heartbeat,
            fence_after=timing.fence_after,
            deadline=sent_at + timing.fence_after,
            next_at=first_at,
        )

    @property
    def give_up_at(self) -> float:
        return self.deadline + self.heartbeat

    def step(self, now: float) -> Step:
        if self.over:
            return Step.WAIT
        if now >= self.give_up_at:
            self.over = True
            return Step.GIVE_UP
        if now >= self.next_at and len(self.in_flight) < self.cap:
            return Step.SEND
        return Step.WAIT

    def wake_at(self) -> float:
        """The next instant at which :meth:`step` may say something new without an
        answer arriving first (infinite once given up)."""
        if self.over:
            return float("inf")
        if len(self.in_flight) < self.cap:
            return min(self.next_at, self.give_up_at)
        return self.give_up_at

    def sent(self, now: float) -> float:
        """A renew goes out now; returns how late it is against its schedule."""
        lateness = now - self.next_at
        self.in_flight.append(now)
        self.next_at = now + self.heartbeat
        return lateness

    def landed(self, sent_at: float, now: float) -> bool:
        """The renew sent at ``sent_at`` landed; True when it moved the deadline (its
        window is still open and reaches past the deadline)."""
        self._answered(sent_at)
        deadline = sent_at + self.fence_after
        if self.over or deadline <= now or deadline <= self.deadline:
            return False
        self.deadline = deadline
        return True

    def failed(self, sent_at: float, now: float) -> None:
        """An error (or the client's timeout): the outcome is unknown. The next renew
        goes out a quarter heartbeat from now unless it is due sooner."""
        self._answered(sent_at)
        self.next_at = min(self.next_at, now + self.heartbeat / 4)

    def _answered(self, sent_at: float) -> None:
        if sent_at in self.in_flight:
            self.in_flight.remove(sent_at)
