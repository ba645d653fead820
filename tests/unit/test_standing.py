"""What a worker publishes of its room, and names itself for in a reap, as its path to
DynamoDB is fast, slow but alive, or it is closing (docs/DESIGN.md §3.11)."""

from __future__ import annotations

import pytest

from worker.standing import Standing
from wsfleet.timing import LeaseTiming


@pytest.mark.parametrize(
    ("closing", "slow", "running", "published", "takes_over"),
    [
        (False, False, 3, 10, 7),  # its whole capacity; a reap names it for its free slots
        (False, True, 3, 3, 0),  # slow: full where it stands, named for nothing
        (False, True, 12, 10, 0),  # never more than its capacity
        (True, False, 3, 0, 7),  # closing: 0, which the others read as a drain
        (True, True, 3, 0, 0),
    ],
)
def test_the_room_a_worker_publishes(
    closing: bool, slow: bool, running: int, published: int, takes_over: int
) -> None:
    standing = Standing(LeaseTiming.from_lease(), 10, slow_path=lambda: slow)
    standing.closing = closing
    assert standing.published_capacity(running) == published
    assert standing.takeover_room(7) == takes_over
