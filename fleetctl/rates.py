"""The one messages/s rule of the fleet views (``fleetctl watch`` and the local live view).

A connection's rate is how far its checkpoint (``last_seq``) advanced between two
checkpoint pages of its owner, over the time between the writes of those pages::

    rate = (seq_now - seq_before) / (checkpoint_time_now - checkpoint_time_before)

Both times are read from the connection's view itself (:func:`checkpoint_time_ms`: the
owner page's ``checkpoint_at``), never from when a viewer happened to poll: the owner
writes its page every ``CHECKPOINT_SECONDS``, so checkpoints move in steps, a delta
over poll intervals would alternate between 0 and a burst, and two viewers polling at
different moments would disagree. With the pages' own times every viewer computes the
same number, however often or irregularly it polls.

Per connection, from one poll to the next (:func:`advance`):

- first sight: no rate yet, one checkpoint is a point, not a slope;
- the checkpoint time moved forward: the rate of that interval;
- the checkpoint time did not move: the previous rate stays. The latest interval is
  still the latest, and a viewer polling faster than pages are written shows a steady
  number instead of a rate that blinks on every new page;
- another run began (a new owner: another lease ``epoch``; a restart: another
  ``start_gen``; or ``last_seq`` or the time went back): no rate until the run's
  second checkpoint. Progress across two owners or two streams would mix a takeover
  gap or a reset into the number.

A rate is shown only while the owner's session is alive with time left
(:func:`owner_live`): without a live owner nothing advances the checkpoint, and the
rate kept from its last interval would be stale. An owner writes its page only when
something in it changed, so a page not rewritten for more than twice the interval the
rate was measured over means nothing moved since: the rate shown is then 0
(:func:`shown_rate`). ``-`` stands for "no rate" in every view.

Pure: no I/O, no clock. The views are the router API's connection views (see
``lambdas/router/views.py``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Final

RATE_LEGEND: Final = (
    "msg/s = last_seq advance over the write times of the owner's latest two checkpoint "
    "pages, 0 once they stop changing; '-' until there are two, or while the owner's "
    "session is not live"
)
"""One line that says what the MSG/S column means, for the views and their help."""

STALE_AFTER_INTERVALS: Final = 2
"""A page older than this many of the rate's own intervals was not rewritten because
nothing changed: the connection is idle and its rate is shown as 0."""

_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)
_ONE_MS: Final = timedelta(milliseconds=1)


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """A connection's checkpoint as one poll saw it."""

    seq: int
    at_ms: int
    """When the checkpoint was written (epoch milliseconds): :func:`checkpoint_time_ms`."""
    epoch: int
    """The lease epoch: a new owner writes under a new one."""
    start_gen: int
    """The start generation: a restart by the router writes a new one."""

    def same_run(self, other: Checkpoint) -> bool:
        """Written by the same owner's tenure of the same start of the connection."""
        return self.epoch == other.epoch and self.start_gen == other.start_gen


@dataclass(frozen=True, slots=True)
class Progress:
    """What the rule remembers of a connection between polls."""

    checkpoint: Checkpoint
    """The latest checkpoint seen."""
    rate: float | None = None
    """Messages per second over the interval that ended at ``checkpoint``; None until
    two checkpoints of the current run were seen."""
    interval_ms: int | None = None
    """The length of that interval (None with ``rate``)."""


def parse_time_ms(text: Any) -> int | None:
    """An ISO 8601 timestamp as the API writes it, in epoch milliseconds (exact, no
    float rounding); None when absent or not a timestamp. Naive times count as UTC."""
    if not isinstance(text, str) or not text:
        return None
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return (moment - _EPOCH) // _ONE_MS


def checkpoint_time_ms(view: Mapping[str, Any]) -> int | None:
    """When the checkpoint in ``view`` was written, in epoch milliseconds: the write
    time of the owner's checkpoint page (``checkpoint_at``); None when ``last_seq`` is
    the item's own (no live page entry: no owner, or a new owner that has not
    written one yet).

    Not the entry's ``last_advanced_at``: that stops moving while a connection is
    idle, whereas the page time moves on whenever the owner writes its page, so an
    idle connection among busy ones shows 0. Not ``updated_at``: workers write the
    item only when ownership changes. This is the only place that decides which time
    is the checkpoint's.
    """
    return parse_time_ms(view.get("checkpoint_at"))


def _int(value: Any) -> int:
    return int(value) if isinstance(value, int | float) else 0


def checkpoint_of(view: Mapping[str, Any]) -> Checkpoint | None:
    """The checkpoint of one connection view; None without a checkpoint time."""
    at_ms = checkpoint_time_ms(view)
    if at_ms is None:
        return None
    return Checkpoint(
        seq=_int(view.get("last_seq")),
        at_ms=at_ms,
        epoch=_int(view.get("epoch")),
        start_gen=_int(view.get("start_gen")),
    )


def advance(before: Progress | None, now: Checkpoint) -> Progress:
    """The rule for one connection: what is remembered after a poll saw ``now``, given
    what was remembered before (None at first sight). See the module docstring."""
    if before is None:
        return Progress(now)
    then = before.checkpoint
    if now.at_ms == then.at_ms and now.same_run(then):
        # Nothing was written since: keep the rate of the latest interval.
        return before
    if not now.same_run(then) or now.at_ms < then.at_ms or now.seq < then.seq:
        return Progress(now)
    interval_ms = now.at_ms - then.at_ms
    return Progress(now, (now.seq - then.seq) * 1000 / interval_ms, interval_ms)


def track(
    progress: Mapping[str, Progress], views: Iterable[Mapping[str, Any]]
) -> dict[str, Progress]:
    """``progress`` advanced by one poll's views; connections no longer listed, or
    without a checkpoint time, are forgotten."""
    tracked: dict[str, Progress] = {}
    for view in views:
        checkpoint = checkpoint_of(view)
        if checkpoint is not None:
            connection_id = str(view.get("connection_id"))
            tracked[connection_id] = advance(progress.get(connection_id), checkpoint)
    return tracked


def owner_live(view: Mapping[str, Any]) -> bool:
    """An owner's session is ALIVE and has time left (not free, lapsed, DEAD or gone)."""
    left = view.get("session_seconds_left")
    return (
        bool(view.get("owner"))
        and view.get("owner_session_state") == "ALIVE"
        and isinstance(left, int | float)
        and left > 0
    )


def idle(view: Mapping[str, Any], progress: Progress) -> bool:
    """The owner's page has not been rewritten for :data:`STALE_AFTER_INTERVALS` of
    the interval the rate was measured over: nothing of the connection moved since."""
    age = view.get("checkpoint_age_seconds")
    if progress.interval_ms is None or not isinstance(age, int | float):
        return False
    return age * 1000 > STALE_AFTER_INTERVALS * progress.interval_ms


def shown_rate(view: Mapping[str, Any], progress: Progress | None) -> float | None:
    """The rate a view shows for ``view``: the remembered one while the owner's
    session is live, 0 once its page has gone unchanged for a while."""
    if progress is None or progress.rate is None or not owner_live(view):
        return None
    return 0.0 if idle(view, progress) else progress.rate


def shown_rates(
    views: Iterable[Mapping[str, Any]], progress: Mapping[str, Progress]
) -> dict[str, float | None]:
    """:func:`shown_rate` for each view, by connection id."""
    return {
        str(view.get("connection_id")): shown_rate(
            view, progress.get(str(view.get("connection_id")))
        )
        for view in views
    }
