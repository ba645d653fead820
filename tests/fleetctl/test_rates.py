"""The messages/s rule: checkpoint advance over the checkpoints' own write times."""

from __future__ import annotations

from typing import Any

import pytest

from fleetctl.rates import (
    Checkpoint,
    Progress,
    advance,
    checkpoint_of,
    checkpoint_time_ms,
    lease_held,
    parse_time_ms,
    shown_rate,
    shown_rates,
    track,
)
from lambdas.router.views import connection_view
from wsfleet.item import ConnectionItem

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
    epoch: int = 1,
    start_gen: int = 1,
) -> dict[str, Any]:
    """An API view of a connection, built the way the router builds it."""
    item = ConnectionItem(
        connection_id=connection_id,
        desired_state="STARTED",
        ws_url="ws://127.0.0.1:8765/x",
        lease_owner=owner,
        lease_expires_at_ms=0 if left is None else T0 + round(left * 1000),
        lease_epoch=epoch,
        last_seq=seq,
        start_gen=start_gen,
        updated_at_ms=at_ms,
    )
    return connection_view(item, T0)


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
def test_the_checkpoint_time_is_the_items_update_time_to_the_millisecond(at_ms: int) -> None:
    # The API shows updated_at_ms as an ISO string; reading it back must be exact, or a
    # 1 ms error on a 1 s interval would show in the rate.
    assert checkpoint_time_ms(view(at_ms=at_ms)) == at_ms


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
    assert progress == {"a": Progress(cp(50, 10), 5.0)}


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
        polled = [view("c", seq=seq, at_ms=at_ms)]
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
    ("owner", "left", "held"),
    [
        ("w-1", 10.0, True),
        ("w-1", 0.001, True),
        ("w-1", None, False),  # inconsistent, but not a live lease
        (None, None, False),  # free (released, or never taken)
    ],
)
def test_lease_held(owner: str | None, left: float | None, held: bool) -> None:
    assert lease_held(view(owner=owner, left=left)) is held


def test_lease_held_not_when_lapsed() -> None:
    assert not lease_held(view(left=-3.0))  # the API shows 0 seconds left


@pytest.mark.parametrize(
    ("changes", "shown"),
    [
        ({}, 5.0),
        ({"owner": None, "left": None}, None),  # released: nothing advances the checkpoint
        ({"left": -1.0}, None),  # lapsed: the owner is gone, the rate would be stale
    ],
)
def test_a_rate_is_shown_only_while_the_lease_is_held(
    changes: dict[str, Any], shown: float | None
) -> None:
    progress = Progress(cp(125, 5), 5.0)
    assert shown_rate(view(**changes), progress) == shown
    assert shown_rate(view(), None) is None
