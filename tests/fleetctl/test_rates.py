"""The messages/s rule: checkpoint advance over the owner pages' own write times."""

from __future__ import annotations

from typing import Any

import pytest

from fleetctl.rates import (
    STALE_AFTER_INTERVALS,
    Checkpoint,
    Progress,
    advance,
    checkpoint_of,
    checkpoint_time_ms,
    owner_live,
    parse_time_ms,
    shown_rate,
    shown_rates,
    track,
)
from lambdas.router.views import OwnerRecords, connection_view
from wsfleet.checkpoint_page import CheckpointPage, PageEntry
from wsfleet.item import ConnectionItem
from wsfleet.session_rules import SessionItem

T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z


def cp(seq: int, at_s: float, *, epoch: int = 1, start_gen: int = 1) -> Checkpoint:
    return Checkpoint(seq=seq, at_ms=T0 + round(at_s * 1000), epoch=epoch, start_gen=start_gen)


def view(
    connection_id: str = "c",
    *,
    seq: int = 0,
    at_ms: int | None = T0,
    owner: str | None = "w-1",
    left: float | None = 10.0,
    session_state: str = "ALIVE",
    epoch: int = 1,
    start_gen: int = 1,
    now_ms: int | None = None,
) -> dict[str, Any]:
    """An API view of a connection, built the way the router builds it: ``seq`` is
    in the owner's page written at ``at_ms`` (None: no page), ``left`` seconds are
    left of the owner's session (None: its item is gone), seen at ``now_ms`` (by
    default when the page was written)."""
    now = now_ms if now_ms is not None else (T0 if at_ms is None else at_ms)
    item = ConnectionItem(
        connection_id=connection_id,
        desired_state="STARTED",
        ws_url="ws://127.0.0.1:8765/x",
        lease_owner=owner,
        owner_session_gen=None if owner is None else 1,
        lease_epoch=epoch,
        start_gen=start_gen,
    )
    session = (
        None
        if owner is None or left is None
        else SessionItem(owner, 1, session_state, expires_at_ms=now + round(left * 1000))
    )
    page = (
        None
        if at_ms is None
        else CheckpointPage(at_ms, {connection_id: PageEntry(epoch, 0, seq, at_ms - 10)})
    )
    return connection_view(item, now, OwnerRecords(session, page))


# --- which time is the checkpoint's --------------------------------------------------


@pytest.mark.parametrize(
    ("text", "ms"),
    [
        ("2026-01-01T00:00:00.000+00:00", T0),
        ("2026-01-01T00:00:05.123+00:00", T0 + 5_123),
        ("2026-01-01T01:00:05.123+01:00", T0 + 5_123),
        ("2026-01-01T00:00:05.123Z", T0 + 5_123),
        ("2026-01-01T00:00:05.123", T0 + 5_123),  # naive: UTC
        (None, None),
        ("", None),
        ("yesterday", None),
        (1_767_225_600, None),
    ],
)
def test_parse_time_ms(text: Any, ms: int | None) -> None:
    assert parse_time_ms(text) == ms


@pytest.mark.parametrize("at_ms", [T0, T0 + 1, T0 + 123, T0 + 999, T0 + 86_399_999, 1])
def test_the_checkpoint_time_is_the_pages_write_time_to_the_millisecond(at_ms: int) -> None:
    # The API shows the page's written_at_ms as an ISO string; reading it back must be
    # exact, or a 1 ms error on a 1 s interval would show in the rate.
    assert checkpoint_time_ms(view(at_ms=at_ms)) == at_ms


def test_without_a_page_entry_of_its_hold_there_is_no_checkpoint_time() -> None:
    # The item's own checkpoint (written at the last change of owner) has no time.
    assert checkpoint_time_ms(view(at_ms=None)) is None
    assert checkpoint_time_ms(view(owner=None)) is None  # free: its page is nobody's


def test_checkpoint_of_a_view() -> None:
    assert checkpoint_of(view(seq=7, at_ms=T0 + 5, epoch=3, start_gen=2)) == Checkpoint(
        seq=7, at_ms=T0 + 5, epoch=3, start_gen=2
    )
    assert checkpoint_of(view(at_ms=None)) is None


# --- the rule ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("before", "now", "rate"),
    [
        pytest.param(None, cp(40, 0), None, id="first sight: one point, no slope"),
        pytest.param(Progress(cp(100, 0)), cp(125, 5), 5.0, id="advance"),
        pytest.param(Progress(cp(100, 0), 4.0), cp(100, 5), 0.0, id="written, no advance"),
        pytest.param(Progress(cp(100, 0)), cp(112, 2.5), 4.8, id="any interval, to the ms"),
        pytest.param(Progress(cp(100, 0), 5.0), cp(100, 0), 5.0, id="not written since: rate kept"),
        pytest.param(Progress(cp(100, 0)), cp(100, 0), None, id="not written since: still none"),
        pytest.param(
            Progress(cp(500, 0, start_gen=1), 5.0),
            cp(3, 5, start_gen=2),
            None,
            id="restart with a new URL: last_seq reset",
        ),
        pytest.param(
            Progress(cp(500, 0, start_gen=1), 5.0),
            cp(525, 5, start_gen=2),
            None,
            id="restart with the same URL: another run",
        ),
        pytest.param(
            Progress(cp(500, 0), 5.0), cp(3, 5), None, id="last_seq went back: another run"
        ),
        pytest.param(
            Progress(cp(500, 0, epoch=1), 5.0),
            cp(500, 30, epoch=2),
            None,
            id="new owner (acquire after a lapse): another run",
        ),
        pytest.param(
            Progress(cp(500, 0, epoch=1), 5.0),
            cp(500, 0, epoch=2),
            None,
            id="new owner in the same millisecond",
        ),
        pytest.param(
            Progress(cp(500, 10), 5.0), cp(510, 9), None, id="time went back: another writer"
        ),
    ],
)
def test_advance(before: Progress | None, now: Checkpoint, rate: float | None) -> None:
    after = advance(before, now)
    assert after.rate == (None if rate is None else pytest.approx(rate))
    assert after.checkpoint == now  # the baseline of the next interval


def test_a_new_owner_is_measured_from_its_first_checkpoint() -> None:
    progress = advance(None, cp(500, 0, epoch=1))
    progress = advance(progress, cp(525, 5, epoch=1))
    assert progress.rate == 5.0
    # The owner dies; 20 s later another one acquires (epoch 2), resuming at 525.
    progress = advance(progress, cp(525, 25, epoch=2))
    assert progress.rate is None
    progress = advance(progress, cp(550, 30, epoch=2))
    assert progress.rate == 5.0  # not 25 / 25 s across the takeover gap


def test_a_restart_that_resets_last_seq_is_measured_from_zero() -> None:
    progress = advance(None, cp(480, 0, start_gen=1))
    progress = advance(progress, cp(500, 5, start_gen=1))
    progress = advance(progress, cp(0, 7, start_gen=2))  # the router's restart write
    assert progress.rate is None
    progress = advance(progress, cp(30, 10, start_gen=2))
    assert progress.rate == 10.0


def test_track_forgets_connections_that_are_gone_or_have_no_time() -> None:
    progress = track({}, [view("a", seq=0), view("b", seq=0), view("c", at_ms=None)])
    assert set(progress) == {"a", "b"}
    progress = track(progress, [view("a", seq=50, at_ms=T0 + 10_000)])
    assert progress == {"a": Progress(cp(50, 10), 5.0, 10_000)}


def checkpoints_written(at_s: float) -> tuple[int, int]:
    """A connection at 5 msg/s checkpointed every 5 s (seq, write time) as of ``at_s``."""
    written_s = int(at_s // 5) * 5
    return written_s * 5, T0 + written_s * 1000


@pytest.mark.parametrize("poll_every_s", [0.3, 1.0, 3.7, 5.0, 12.5])
def test_viewers_polling_at_any_pace_show_the_same_rate(poll_every_s: float) -> None:
    progress: dict[str, Progress] = {}
    shown: list[float | None] = []
    at_s = 0.1
    while at_s < 60:
        seq, at_ms = checkpoints_written(at_s)
        polled = [view("c", seq=seq, at_ms=at_ms, now_ms=T0 + round(at_s * 1000))]
        progress = track(progress, polled)
        shown.append(shown_rates(polled, progress)["c"])
        at_s += poll_every_s
    # "-" until a second checkpoint was seen, then exactly the feed's rate, every poll.
    measured = [rate for rate in shown if rate is not None]
    assert measured
    assert set(measured) == {5.0}
    assert shown == [None] * (len(shown) - len(measured)) + measured


# --- what is shown --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("owner", "left", "state", "live"),
    [
        ("w-1", 10.0, "ALIVE", True),
        ("w-1", 0.001, "ALIVE", True),
        ("w-1", -3.0, "ALIVE", False),  # lapsed: the API shows 0 seconds left
        ("w-1", 10.0, "DEAD", False),  # reaped: shown with 0 seconds left
        ("w-1", None, "ALIVE", False),  # the session item is gone
        (None, None, "ALIVE", False),  # free (released, or never taken)
    ],
)
def test_owner_live(owner: str | None, left: float | None, state: str, live: bool) -> None:
    assert owner_live(view(owner=owner, left=left, session_state=state)) is live


@pytest.mark.parametrize(
    ("changes", "shown"),
    [
        ({}, 5.0),
        ({"owner": None, "left": None}, None),  # released: nothing advances the checkpoint
        ({"left": -1.0}, None),  # lapsed: the owner is gone, the rate would be stale
        ({"session_state": "DEAD"}, None),  # reaped: a takeover comes next
    ],
)
def test_a_rate_is_shown_only_while_the_owners_session_is_live(
    changes: dict[str, Any], shown: float | None
) -> None:
    progress = Progress(cp(125, 5), 5.0, 5_000)
    assert shown_rate(view(seq=125, at_ms=T0 + 5_000, **changes), progress) == shown
    assert shown_rate(view(), None) is None


@pytest.mark.parametrize(
    ("age_ms", "shown"),
    [
        (0, 5.0),
        (9_000, 5.0),
        (STALE_AFTER_INTERVALS * 5_000, 5.0),
        (STALE_AFTER_INTERVALS * 5_000 + 1, 0.0),  # no page since: nothing moved
        (60_000, 0.0),
    ],
)
def test_an_idle_connection_falls_to_zero_once_its_page_stops_changing(
    age_ms: int, shown: float
) -> None:
    # Measured over 5 s between two pages; the owner writes its page only when
    # something in it changed, so a page this old means the connection was idle.
    progress = advance(Progress(cp(100, 0)), cp(125, 5))
    seen = view(seq=125, at_ms=T0 + 5_000, now_ms=T0 + 5_000 + age_ms)
    assert shown_rate(seen, progress) == shown
