"""When the reconciler lists the worker's own entries (worker/reconciler.py): every
OWN_CHECK_PASSES passes, and on the pass after a write with an unknown outcome."""

from __future__ import annotations

import random
from types import SimpleNamespace
from typing import Any, cast

import pytest

from worker.reconciler import Reconciler
from wsfleet.timing import OWN_CHECK_PASSES, LeaseTiming

pytestmark = pytest.mark.timeout(10)


class Owner:
    def __init__(self) -> None:
        self.doubt = False

    def take_doubt(self) -> bool:
        doubt, self.doubt = self.doubt, False
        return doubt


def reconciler(owner: Owner, seed: int = 1) -> Reconciler:
    store = SimpleNamespace(timing=LeaseTiming.from_lease(2.5))
    return Reconciler(
        store=cast(Any, store),
        sessions=cast(Any, None),
        owner=cast(Any, owner),
        capacity=cast(Any, None),
        balancer=cast(Any, SimpleNamespace(enabled=True)),
        metrics=cast(Any, None),
        wall_ms=lambda: 0,
        rng=random.Random(seed),
    )


def test_every_fourth_pass_lists_the_own_entries() -> None:
    for seed in range(20):  # whatever the random phase
        r = reconciler(Owner(), seed)
        due = [r._own_check_due() for _ in range(4 * OWN_CHECK_PASSES)]
        first = due.index(True)
        assert first < OWN_CHECK_PASSES
        assert [n for n, d in enumerate(due) if d] == list(
            range(first, 4 * OWN_CHECK_PASSES, OWN_CHECK_PASSES)
        )


def test_a_doubt_brings_the_check_to_the_next_pass_and_restarts_the_count() -> None:
    owner = Owner()
    r = reconciler(owner)
    while r._own_check_due():
        pass  # past a due pass
    owner.doubt = True
    assert r._own_check_due()
    assert [r._own_check_due() for _ in range(OWN_CHECK_PASSES)] == [False] * (
        OWN_CHECK_PASSES - 1
    ) + [True]


def test_the_bound_covers_the_passes_at_their_longest_jitter() -> None:
    timing = LeaseTiming.from_lease()  # the default: reconcile 0.594 s
    assert timing.own_check_bound() == pytest.approx(OWN_CHECK_PASSES * 1.2 * 0.594 + 1.0)
    assert timing.own_check_bound() == pytest.approx(3.8512)
