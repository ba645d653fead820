"""What the worker remembers of its releases."""

from __future__ import annotations

from worker.holdings import RELEASED_RECENTLY_SECONDS, Holdings
from wsfleet.checkpoint_page import PageEntry


def test_a_release_is_recent_for_a_while():
    holdings = Holdings()
    holdings.released["c1"] = 100.0
    assert holdings.recently_released("c1", 100.0 + RELEASED_RECENTLY_SECONDS - 0.1)
    assert not holdings.recently_released("c1", 100.0 + RELEASED_RECENTLY_SECONDS)
    assert not holdings.recently_released("c2", 100.0)


def test_a_release_given_up_without_an_answer_is_not_recent():
    """It may still be this session's: the own-check must be free to release it at
    once (a restart meanwhile can run only here)."""
    holdings = Holdings()
    holdings.released["c1"] = 100.0
    holdings.unanswered["c1"] = PageEntry(epoch=3, seq_gen=0, seq=7, advanced_at_ms=None)
    assert not holdings.recently_released("c1", 100.5)
