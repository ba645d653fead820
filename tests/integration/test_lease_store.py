"""The lease store against DynamoDB Local (moto is not atomic for racing conditional
writes, so the lease protocol is only ever tested here)."""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import pytest

from wsfleet import schema
from wsfleet.desired_state import DesiredStateStore, StartOutcome, StopOutcome
from wsfleet.lease_rules import AcquireRefusal, Lease, RenewRefusal
from wsfleet.lease_store import LeaseStore, Released, Renewed
from wsfleet.timing import LeaseTiming

pytestmark = pytest.mark.timeout(120)

TIMING = LeaseTiming.from_lease(20)  # lease 20 000 ms, skew 1 000 ms
T0 = 1_800_000_000_000
URL = "wss://feed.example/a"


@pytest.fixture
def store(ddb, table) -> LeaseStore:
    return LeaseStore(ddb, table, TIMING)


@pytest.fixture
def control(ddb, table) -> DesiredStateStore:
    return DesiredStateStore(ddb, table)


def won(result) -> Lease:
    assert isinstance(result, Lease), result
    return result


def test_sixteen_racing_acquirers_have_exactly_one_winner_every_round(store, control, ddb, table):
    racers = 16
    rounds = 100
    control.start("race", URL, T0)
    barrier = threading.Barrier(racers)
    winners_per_round: list[int] = []
    holder: Lease | None = None
    with ThreadPoolExecutor(racers) as pool:
        for round_no in range(rounds):
            now = T0 + round_no * 100_000  # every previous lease has lapsed by now
            if holder is not None and round_no % 2:
                # Alternate a released lease and a lapsed one as the starting point.
                assert store.release(holder, 0, now).released

            def race(i: int, now: int = now) -> object:
                barrier.wait(timeout=30)
                return store.acquire("race", f"racer-{i}", now)

            results = list(pool.map(race, range(racers)))
            leases = [r for r in results if isinstance(r, Lease)]
            winners_per_round.append(len(leases))
            assert all(r is AcquireRefusal.HELD for r in results if not isinstance(r, Lease))
            holder = leases[0] if leases else None
    assert winners_per_round == [1] * rounds
    final = store.get("race")
    assert final is not None
    assert final.lease_epoch == rounds  # +1 per successful acquisition, never more


def test_acquire_returns_what_the_worker_needs(store, control):
    control.start("c", URL, T0)
    lease = won(store.acquire("c", "w1", T0))
    assert (lease.epoch, lease.last_seq, lease.start_gen, lease.ws_url) == (1, 0, 1, URL)
    assert lease.expires_at_ms == T0 + 20_000
    assert lease.takeover_latency_ms is None
    item = store.get("c")
    assert item is not None
    assert (item.lease_owner, item.lease_expires_at_ms, item.lease_epoch) == ("w1", T0 + 20_000, 1)


@pytest.mark.parametrize(
    ("offset_ms", "expected_winner"),
    [
        (20_000, False),  # exactly at expiry
        (21_000, False),  # at expiry + skew: cutoff == expiry, not <
        (21_001, True),  # one ms later
    ],
)
def test_takeover_boundaries(store, control, offset_ms, expected_winner):
    control.start("c", URL, T0)
    won(store.acquire("c", "w1", T0))
    result = store.acquire("c", "w2", T0 + offset_ms)
    if expected_winner:
        lease = won(result)
        assert lease.epoch == 2
        assert lease.takeover_latency_ms == offset_ms - 20_000
    else:
        assert result is AcquireRefusal.HELD


def test_renew_after_loss_fails_as_lost(store, control):
    control.start("c", URL, T0)
    old = won(store.acquire("c", "w1", T0))
    won(store.acquire("c", "w2", T0 + 21_001))
    assert store.renew(old, 5, T0 + 21_500) is RenewRefusal.LOST
    item = store.get("c")
    assert item is not None
    assert (item.lease_owner, item.last_seq) == ("w2", 0)  # the loser wrote nothing


def test_renew_retried_after_success_still_succeeds(store, control):
    control.start("c", URL, T0)
    lease = won(store.acquire("c", "w1", T0))
    assert store.renew(lease, 3, T0 + 5_000) == Renewed(T0 + 25_000)
    assert store.renew(lease, 3, T0 + 5_000) == Renewed(T0 + 25_000)
    item = store.get("c")
    assert item is not None
    assert (item.lease_expires_at_ms, item.last_seq) == (T0 + 25_000, 3)


def test_late_renew_cannot_move_the_expiry_backwards(store, control):
    control.start("c", URL, T0)
    lease = won(store.acquire("c", "w1", T0))
    assert isinstance(store.renew(lease, 9, T0 + 10_000), Renewed)
    assert store.renew(lease, 4, T0 + 5_000) is RenewRefusal.SUPERSEDED
    item = store.get("c")
    assert item is not None
    assert (item.lease_expires_at_ms, item.last_seq) == (T0 + 30_000, 9)


def test_release_then_acquire_by_another_resumes_from_the_checkpoint(store, control):
    control.start("c", URL, T0)
    lease = won(store.acquire("c", "w1", T0))
    assert store.release(lease, 77, T0 + 1_000).released
    released = store.get("c")
    assert released is not None
    assert (released.lease_owner, released.lease_expires_at_ms) == (None, 0)
    taken = won(store.acquire("c", "w2", T0 + 1_001))
    assert (taken.epoch, taken.last_seq) == (2, 77)
    assert taken.takeover_latency_ms is None  # a handoff, not a takeover
    assert not store.release(lease, 80, T0 + 2_000).released  # the old holder has nothing left


def test_acquire_of_stopped_or_unknown_fails(store, control):
    control.start("c", URL, T0)
    assert control.stop("c", T0 + 1) is StopOutcome.STOPPED
    assert store.acquire("c", "w1", T0 + 2) is AcquireRefusal.STOPPED
    assert store.acquire("nope", "w1", T0 + 2) is AcquireRefusal.UNKNOWN_ID
    assert control.stop("nope", T0) is StopOutcome.NOT_FOUND


def test_acquire_retried_after_success_adopts_the_lease(store, control):
    control.start("c", URL, T0)
    first = won(store.acquire("c", "w1", T0, token="attempt-1"))
    # What an SDK retry of the same attempt sees when its first try had in fact landed:
    adopted = won(store.acquire("c", "w1", T0, token="attempt-1"))
    assert adopted.epoch == first.epoch == 1
    assert isinstance(store.renew(adopted, 1, T0 + 5_000), Renewed)


def test_a_new_attempt_never_adopts_an_older_hold_whose_release_is_in_flight(store, control):
    """The race the chaos run found: a fenced runner's release was still on its way
    when the same worker tried the connection again. Adopting the old epoch let the
    late release free the lease under a runner that believed it held it."""
    control.start("c", URL, T0)
    old = won(store.acquire("c", "w1", T0, token="attempt-1"))
    again = store.acquire("c", "w1", T0 + 19_000, token="attempt-2")
    assert again is AcquireRefusal.HELD
    assert store.release(old, 7, T0 + 19_500).released  # the late release lands
    taken = won(store.acquire("c", "w2", T0 + 19_600))
    assert taken.epoch == 2
    item = store.get("c")
    assert item is not None
    assert (item.lease_owner, item.lease_epoch) == ("w2", 2)


def test_renew_sees_stop_and_restart(store, control):
    control.start("c", URL, T0)
    lease = won(store.acquire("c", "w1", T0))
    control.stop("c", T0 + 1_000)
    assert store.renew(lease, 2, T0 + 5_000) is RenewRefusal.STOPPED
    assert control.start("c", URL, T0 + 6_000).outcome is StartOutcome.RESTARTED
    assert store.renew(lease, 2, T0 + 7_000) is RenewRefusal.RESTARTED


def test_release_after_restart_with_new_url_keeps_the_reset_checkpoint(store, control):
    control.start("c", URL, T0)
    lease = won(store.acquire("c", "w1", T0))
    assert isinstance(store.renew(lease, 50, T0 + 1_000), Renewed)
    control.stop("c", T0 + 2_000)
    restarted = control.start("c", "wss://feed.example/b", T0 + 3_000)
    assert restarted.outcome is StartOutcome.RESTARTED
    released = store.release(lease, 60, T0 + 4_000)
    assert (released.released, released.checkpointed) == (True, False)  # not the stale seq
    assert released.restarted  # the release saw the new start: the holder takes it again
    item = store.get("c")
    assert item is not None
    assert (item.last_seq, item.ws_url, item.start_gen, item.lease_owner) == (
        0,
        "wss://feed.example/b",
        2,
        None,
    )
    again = won(store.acquire("c", "w2", T0 + 4_001))
    assert (again.ws_url, again.last_seq, again.start_gen) == ("wss://feed.example/b", 0, 2)


def test_restart_with_the_same_url_keeps_the_checkpoint(store, control):
    control.start("c", URL, T0)
    lease = won(store.acquire("c", "w1", T0))
    assert store.release(lease, 12, T0 + 1).released
    control.stop("c", T0 + 2)
    item = store.get("c")
    assert item is not None
    assert item.expires_at is not None
    assert control.start("c", URL, T0 + 3).outcome is StartOutcome.RESTARTED
    item = store.get("c")
    assert item is not None
    assert (item.last_seq, item.start_gen, item.expires_at, item.desired_state) == (
        12,
        2,
        None,
        schema.STARTED,
    )


def test_start_outcomes_are_decided_by_conditional_writes(control, store):
    assert control.start("c", URL, T0).outcome is StartOutcome.CREATED
    assert control.start("c", URL, T0 + 1).outcome is StartOutcome.ALREADY_STARTED
    assert control.start("c", URL + "x", T0 + 2).outcome is StartOutcome.CONFLICT
    item = store.get("c")
    assert item is not None
    assert (item.ws_url, item.start_gen, item.lease_expires_at_ms, item.lease_epoch) == (
        URL,
        1,
        0,
        0,
    )


def test_orphan_query_finds_free_and_lapsed_but_not_live_or_stopped(store, control):
    for cid in ("never", "lapsed", "live", "released", "stopped"):
        control.start(cid, URL, T0)
    won(store.acquire("lapsed", "w1", T0 - 30_000))
    won(store.acquire("live", "w1", T0))
    assert store.release(won(store.acquire("released", "w1", T0)), 0, T0).released
    control.stop("stopped", T0)
    orphans = set(store.find_orphans(T0 + 1, limit=100))
    assert orphans == {"never", "lapsed", "released"}
    assert len(store.find_orphans(T0 + 1, limit=2)) == 2


def test_release_after_restart_with_the_same_url_keeps_the_final_checkpoint(store, control):
    """Renewed at 10, stopped, started again with the same URL, released with 15: the
    stream is the same, so 15 must land, or the next owner delivers 11..15 again."""
    control.start("c", URL, T0)
    lease = won(store.acquire("c", "w1", T0))
    assert isinstance(store.renew(lease, 10, T0 + 1_000), Renewed)
    control.stop("c", T0 + 2_000)
    assert control.start("c", URL, T0 + 3_000).outcome is StartOutcome.RESTARTED
    released = store.release(lease, 15, T0 + 4_000)
    assert (released.released, released.checkpointed, released.restarted) == (True, True, True)
    again = won(store.acquire("c", "w2", T0 + 4_001))
    assert (again.last_seq, again.start_gen) == (15, 2)


def test_seq_gen_moves_only_when_the_router_resets_the_checkpoint(store, control):
    control.start("c", URL, T0)
    first = won(store.acquire("c", "w1", T0))
    assert first.seq_gen == 0
    assert store.release(first, 3, T0 + 1).released
    for step, url in enumerate([URL, URL, "wss://feed.example/b", "wss://feed.example/b"]):
        control.stop("c", T0 + 10 + 2 * step)
        control.start("c", url, T0 + 11 + 2 * step)
    item = store.get("c")
    assert item is not None
    assert (item.start_gen, item.seq_gen, item.last_seq) == (5, 1, 0)


def test_a_plain_stop_release_reports_no_restart(store, control):
    control.start("c", URL, T0)
    lease = won(store.acquire("c", "w1", T0))
    control.stop("c", T0 + 1_000)
    released = store.release(lease, 4, T0 + 2_000)
    assert (released.released, released.checkpointed, released.restarted) == (True, True, False)
    item = store.get("c")
    assert item is not None
    assert (item.last_seq, item.desired_state, item.lease_owner) == (4, schema.STOPPED, None)


# --- what every write leaves behind, and the races between the writes of one holder ----


class ClientSpy:
    """The DynamoDB Local client with a look at each call: records the arguments of
    every call, and runs ``before_update[n]`` just before the n-th ``update_item``
    (0-based), to let another writer in between two writes of the store."""

    def __init__(self, client, *, max_page: int | None = None) -> None:
        self._client = client
        self._max_page = max_page
        self.calls: list[tuple[str, dict]] = []
        self.before_update: dict[int, Callable[[], object]] = {}

    def _record(self, name: str, kwargs: dict) -> None:
        self.calls.append((name, kwargs))

    def updates(self) -> int:
        return sum(1 for name, _ in self.calls if name == "update_item")

    def update_item(self, **kwargs):
        hook = self.before_update.pop(self.updates(), None)
        self._record("update_item", kwargs)
        if hook is not None:
            hook()
        return self._client.update_item(**kwargs)

    def get_item(self, **kwargs):
        self._record("get_item", kwargs)
        return self._client.get_item(**kwargs)

    def query(self, **kwargs):
        self._record("query", kwargs)
        if self._max_page is not None:
            # As DynamoDB does when a page reaches 1 MB: fewer items than the limit,
            # and a LastEvaluatedKey to go on from.
            kwargs = kwargs | {"Limit": min(kwargs["Limit"], self._max_page)}
        return self._client.query(**kwargs)


@pytest.mark.parametrize("step", ["acquire", "renew", "release", "release_after_reset"])
def test_every_lease_write_stamps_updated_at(store, control, step):
    control.start("c", URL, T0)
    lease = won(store.acquire("c", "w1", T0 + 10))
    if step == "renew":
        assert isinstance(store.renew(lease, 1, T0 + 20), Renewed)
    elif step == "release":
        assert store.release(lease, 1, T0 + 20).checkpointed
    elif step == "release_after_reset":
        control.stop("c", T0 + 11)
        control.start("c", "wss://feed.example/b", T0 + 12)
        released = store.release(lease, 1, T0 + 20)
        assert (released.released, released.checkpointed) == (True, False)
    item = store.get("c")
    assert item is not None
    assert item.updated_at_ms == (T0 + 10 if step == "acquire" else T0 + 20)


def test_each_acquire_attempt_writes_a_fresh_random_token(store, control):
    control.start("c", URL, T0)
    tokens = []
    for attempt in range(3):
        lease = won(store.acquire("c", "w1", T0 + attempt))
        item = store.get("c")
        assert item is not None
        tokens.append(item.lease_token)
        assert store.release(lease, 0, T0 + attempt).released
    assert all(re.fullmatch(r"[0-9a-f]{16}", str(token)) for token in tokens), tokens
    assert len(set(tokens)) == 3


def test_a_late_release_of_an_older_epoch_of_the_same_worker_frees_nothing(store, control):
    """w1 held epoch 1, lost track of it (fenced) and took the connection again as
    epoch 2 after it lapsed. The release of epoch 1 arrives late: epoch 2 must stay
    held, with its expiry and without the old checkpoint."""
    control.start("c", URL, T0)
    old = won(store.acquire("c", "w1", T0))
    newer = won(store.acquire("c", "w1", T0 + 21_001))
    assert newer.epoch == 2
    assert isinstance(store.renew(newer, 30, T0 + 22_000), Renewed)
    late = store.release(old, 5, T0 + 22_500)
    assert late == Released(released=False, restarted=False, checkpointed=False)
    item = store.get("c")
    assert item is not None
    assert (item.lease_owner, item.lease_epoch, item.lease_expires_at_ms, item.last_seq) == (
        "w1",
        2,
        T0 + 42_000,
        30,
    )
    assert store.acquire("c", "w2", T0 + 23_000) is AcquireRefusal.HELD


def test_a_stale_renew_of_an_older_epoch_never_extends_the_newer_lease(store, control):
    control.start("c", URL, T0)
    old = won(store.acquire("c", "w1", T0))
    won(store.acquire("c", "w1", T0 + 21_001))
    # The old runner's renew, sent later by the wall clock than the new acquire:
    assert store.renew(old, 9, T0 + 30_000) is RenewRefusal.LOST
    item = store.get("c")
    assert item is not None
    assert (item.lease_epoch, item.lease_expires_at_ms, item.last_seq) == (2, T0 + 41_001, 0)


def test_releasing_a_lease_no_longer_held_is_one_write_that_changes_nothing(ddb, table, control):
    spy = ClientSpy(ddb)
    store = LeaseStore(spy, table, TIMING)
    control.start("c", URL, T0)
    old = won(store.acquire("c", "w1", T0))
    won(store.acquire("c", "w2", T0 + 21_001))
    before = store.get("c")
    writes = spy.updates()
    assert store.release(old, 5, T0 + 22_000) == Released(
        released=False, restarted=False, checkpointed=False
    )
    assert spy.updates() == writes + 1  # no second try without the checkpoint
    assert store.get("c") == before


def test_a_release_whose_second_write_finds_the_lease_taken_frees_nothing(ddb, table, control):
    """The checkpoint was reset (restart with a new URL), so the release is sent again
    without it; in between, the lease lapsed and another worker took it. The second
    write must not free the new hold."""
    spy = ClientSpy(ddb)
    store = LeaseStore(spy, table, TIMING)
    other = LeaseStore(ddb, table, TIMING)
    control.start("c", URL, T0)
    lease = won(store.acquire("c", "w1", T0))
    control.stop("c", T0 + 1_000)
    control.start("c", "wss://feed.example/b", T0 + 2_000)
    taken: list[Lease] = []
    first_release = spy.updates()
    spy.before_update[first_release + 1] = lambda: taken.append(
        won(other.acquire("c", "w2", T0 + 21_001))
    )
    released = store.release(lease, 40, T0 + 21_002)
    assert released == Released(released=False, restarted=False, checkpointed=False)
    assert spy.updates() == first_release + 2
    item = store.get("c")
    assert item is not None
    assert (item.lease_owner, item.lease_epoch, item.lease_expires_at_ms, item.last_seq) == (
        "w2",
        taken[0].epoch,
        T0 + 41_001,
        0,
    )


def test_reads_are_strongly_consistent_unless_asked_otherwise(ddb, table, control):
    """DynamoDB Local reads are always consistent, so this looks at the request."""
    spy = ClientSpy(ddb)
    store = LeaseStore(spy, table, TIMING)
    control.start("c", URL, T0)
    assert store.get("c") is not None
    assert store.get("c", consistent=False) is not None
    assert [kwargs["ConsistentRead"] for name, kwargs in spy.calls if name == "get_item"] == [
        True,
        False,
    ]


@pytest.mark.parametrize("limit", [1, 2, 3, 5, 7])
def test_orphans_are_read_across_pages_up_to_the_limit(ddb, table, control, limit):
    """Pages cut short (at 1 MB, DynamoDB returns fewer items than the limit and a key
    to go on from) are followed until the limit is reached or nothing is left."""
    spy = ClientSpy(ddb, max_page=2)
    store = LeaseStore(spy, table, TIMING)
    ids = {f"o{i}" for i in range(5)}
    for cid in ids:
        control.start(cid, URL, T0)
    found = store.find_orphans(T0 + 1, limit=limit)
    assert len(found) == len(set(found)) == min(limit, 5)
    assert set(found) <= ids
