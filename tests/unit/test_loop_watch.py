"""The event-loop lag probe and the collector's freezer: the rule that follows a
full collection, and the freezer on a real collector."""

from __future__ import annotations

import asyncio
import gc
import io
import time

import pytest

from worker.loop_watch import YOUNG_THRESHOLD, AfterFull, GcFreezer, after_full, probe_lag
from worker.metrics import FleetMetrics

pytestmark = pytest.mark.timeout(30)


def new_metrics() -> FleetMetrics:
    return FleetMetrics(
        namespace="T", service="s", task_id="t", active_connections=lambda: 0, out=io.StringIO()
    )


@pytest.mark.parametrize(
    ("now", "unfrozen_at", "rule"),
    [
        (100.0, 0.0, AfterFull.FREEZE),
        (599.9, 0.0, AfterFull.FREEZE),
        (600.0, 0.0, AfterFull.UNFREEZE),  # every 10 minutes the whole heap once
        (1300.0, 600.0, AfterFull.UNFREEZE),
        (1199.0, 600.0, AfterFull.FREEZE),
    ],
)
def test_after_a_full_collection(now, unfrozen_at, rule):
    assert after_full(now, unfrozen_at) is rule


async def wait_for(predicate, within: float) -> None:
    async with asyncio.timeout(within):
        while not predicate():  # noqa: ASYNC110 - the collector has no event to wait on
            await asyncio.sleep(0.01)


async def test_the_freezer_times_collections_and_freezes_after_a_full_one():
    metrics = new_metrics()
    freezer = GcFreezer(metrics, asyncio.get_running_loop(), unfreeze_every=3600)
    freezer.install()
    try:
        assert gc.get_freeze_count() > 0
        kept = [[] for _ in range(1000)]  # tracked objects that outlive the collection
        gc.collect()
        await wait_for(lambda: freezer.freezes >= 1, 5)
        assert gc.get_freeze_count() >= len(kept)
        summary = metrics.loop_summary()
        assert summary["gc2"] >= 1
        assert summary["gc2_max_ms"] >= 0
    finally:
        freezer.uninstall()
        gc.unfreeze()
    assert freezer._collected not in gc.callbacks


async def test_the_freezer_collects_the_young_generation_less_often_while_installed():
    before = gc.get_threshold()
    freezer = GcFreezer(new_metrics(), asyncio.get_running_loop())
    freezer.install()
    try:
        assert gc.get_threshold() == (YOUNG_THRESHOLD, *before[1:])
    finally:
        freezer.uninstall()
        gc.unfreeze()
    assert gc.get_threshold() == before


async def test_the_freezer_unfreezes_when_its_time_has_come():
    freezer = GcFreezer(new_metrics(), asyncio.get_running_loop(), unfreeze_every=0)
    freezer.install()
    try:
        gc.collect()
        await wait_for(lambda: freezer.unfreezes >= 1, 5)
        assert gc.get_freeze_count() == 0
    finally:
        freezer.uninstall()
        gc.unfreeze()


async def test_the_probe_records_how_late_the_loop_wakes_it():
    metrics = new_metrics()
    probe = asyncio.create_task(probe_lag(metrics, interval=0.01))
    try:
        await wait_for(lambda: metrics.loop_summary()["lag_samples"] >= 3, 5)
        time.sleep(0.1)  # noqa: ASYNC251 - a stalled loop is the point
        await wait_for(lambda: metrics.loop_summary().get("lag_max_ms", 0) >= 50, 5)
    finally:
        probe.cancel()
