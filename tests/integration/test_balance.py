"""The fleet balances itself: real worker processes against DynamoDB Local, moto SQS
and the demo feed (lease 2 s), with balance rounds every second."""

from __future__ import annotations

import json
import signal
import time
from collections import Counter

import pytest

from local_stack.audit import duplicate_count
from tests.support.fleet import TIMING, Fleet, WorkerProcess, wait_until
from tests.support.timing import scaled
from wsfleet import metric_names as m

pytestmark = [pytest.mark.fleet, pytest.mark.timeout(scaled(240))]

BALANCE = {"BALANCE_ROUND_SECONDS": "1", "BALANCE_MOVE_FRACTION": "0.25"}
CRASH_BOUND = TIMING.crash_failover_bound()


def loads(fleet: Fleet, ids: list[str], workers: list[WorkerProcess]) -> dict[str, int]:
    owners = Counter(fleet.owners(ids).values())
    return {w.worker_id: owners.get(w.worker_id, 0) for w in workers}


def balanced(fleet: Fleet, ids: list[str], workers: list[WorkerProcess]) -> bool:
    counts = loads(fleet, ids, workers)
    mean = len(ids) / len(workers)
    return sum(counts.values()) == len(ids) and max(counts.values()) <= 1.10 * mean


def moved(worker: WorkerProcess) -> int:
    total = 0
    for line in worker.log().splitlines():
        if line.startswith('{"_aws"'):
            total += sum(json.loads(line).get(m.CONNECTIONS_MOVED, []))
    return round(total)


def test_a_scale_out_spreads_the_connections_without_a_loss_or_duplicate(fleet: Fleet):
    first = fleet.start_worker("w", **BALANCE)
    ids = [f"bal-{i}" for i in range(30)]
    for cid in ids:
        fleet.start_connection(cid)
    fleet.wait_handling(ids, scaled(20))
    assert fleet.owners(ids) == dict.fromkeys(ids, first.worker_id)

    workers = [first, fleet.start_worker("w", **BALANCE), fleet.start_worker("w", **BALANCE)]
    # Round cap 25% of 30 = 7 moves a round, rounds a second apart: 20 moves take three
    # rounds, after the newcomers are listed.
    wait_until(lambda: balanced(fleet, ids, workers), scaled(30), "max/mean <= 1.10")
    counts = loads(fleet, ids, workers)
    assert all(9 <= n <= 11 for n in counts.values()), counts

    # Still for five rounds: nothing more moves.
    owners = fleet.owners(ids)
    still_until = time.monotonic() + 5.0
    wait_until(lambda: time.monotonic() > still_until, scaled(10), "five balance rounds")
    assert fleet.owners(ids) == owners

    # Moved gracefully: every seq once, in order, by one owner at a time.
    fleet.keep_flowing(ids)
    fleet.assert_clean_audit()
    assert duplicate_count(fleet.records()) == {}
    # Only the first worker's excess moved, counted by the giver alone. (Each move is
    # counted once its offer landed; a connection whose offer was refused reaches its
    # new owner through a hint or the unowned index and is not counted.)
    left = 30 - counts[first.worker_id]
    wait_until(lambda: moved(first) >= 1, scaled(10), "ConnectionsMoved in the EMF lines")
    assert moved(first) <= left
    assert sum(moved(w) for w in workers[1:]) == 0
    assert "balance round" in first.log()


def test_a_receiver_that_dies_mid_rebalance_leaves_nothing_unowned(fleet: Fleet):
    first = fleet.start_worker("w", **BALANCE)
    ids = [f"die-{i}" for i in range(24)]
    for cid in ids:
        fleet.start_connection(cid)
    fleet.wait_handling(ids, scaled(20))
    doomed = fleet.start_worker("w", **BALANCE)
    survivor = fleet.start_worker("w", **BALANCE)
    # Kill a receiver as soon as it holds its first moved connection.
    wait_until(
        lambda: loads(fleet, ids, [doomed])[doomed.worker_id] > 0,
        scaled(20),
        "a first move to the doomed worker",
    )
    doomed.signal(signal.SIGKILL)
    killed_at = time.time()
    assert doomed.wait(timeout=scaled(10)) is not None

    def all_owned_by_the_living() -> bool:
        owners = fleet.owners(ids)
        return set(owners.values()) <= {first.worker_id, survivor.worker_id}

    wait_until(all_owned_by_the_living, scaled(2 * CRASH_BOUND + 10), "no connection left behind")
    print(f"everything owned by a live worker {time.time() - killed_at:.2f} s after the kill")
    workers = [first, survivor]
    wait_until(lambda: balanced(fleet, ids, workers), scaled(30), "balanced between the two")
    fleet.keep_flowing(ids)
    fleet.assert_clean_audit()
