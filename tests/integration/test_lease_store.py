"""The lease store against DynamoDB Local (moto is not atomic for racing conditional
writes, so the lease protocol is only ever tested here)."""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.support.timing import scaled
from wsfleet import schema
from wsfleet.desired_state import DesiredStateStore, StartOutcome, StopOutcome
from wsfleet.item import ConnectionItem
from wsfleet.item_io import get_connection
from wsfleet.lease_rules import AcquireRefusal, Lease, RenewRefusal
from wsfleet.lease_store import LeaseStore, Released, Renewed
from wsfleet.timing import LeaseTiming

pytestmark = pytest.mark.timeout(scaled(120))

TIMING = LeaseTiming.from_lease(20)  # lease 20 000 ms, skew 1 000 ms
T0 = 1_800_000_000_000
URL = "wss://feed.example/a"


@pytest.fixture
def store(ddb, table) -> LeaseStore:
    return LeaseStore(ddb, table, TIMING)


@pytest.fixture
def control(ddb, table) -> DesiredStateStore:
    return DesiredStateStore(ddb, table)


@pytest.fixture
def read(ddb, table) -> Callable[[str], ConnectionItem | None]:
    """The item as stored (a consistent read), not through the store under test."""
    return lambda connection_id: get_connection(ddb, table, connection_id)


def won(result) -> Lease:
    assert isinstance(result, Lease), result
    return result


def test_sixteen_racing_acquirers_have_exactly_one_winner_every_round(
    store, control, ddb, table, read
):
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
                barrier.wait(timeout=scaled(30))
                return store.acquire("race", f"racer-{i}", now)

            results = list(pool.map(race, range(racers)))
            leases = [r for r in results if isinstance(r, Lease)]
            winners_per_round.append(len(leases))
            assert all(r is AcquireRefusal.HELD for r in results if not isinstance(r, Lease))
            holder = leases[0] if leases else None
    assert winners_per_round == [1] * rounds
    final = read("race")
    assert final is not None
    assert final.lease_epoch == rounds  # +1 per successful acquisition, never more


def test_acquire_returns_what_the_worker_needs(store, control, read):
    control.start("c", URL, T0)
    lease = won(store.acquire("c", "w1", T0))
    assert (lease.epoch, lease.last_seq, lease.start_gen, lease.ws_url) == (1, 0, 1, URL)
    assert lease.expires_at_ms == T0 + 20_000
    assert lease.takeover_latency_ms is None
    item = read("c")
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


def test_renew_after_loss_fails_as_lost(store, control, read):
    control.start("c", URL, T0)
    old = won(store.acquire("c", "w1", T0))
    won(store.acquire("c", "w2", T0 + 21_001))
    assert store.renew(old, 5, T0 + 21_500) is RenewRefusal.LOST
    item = read("c")
    assert item is not None
    assert (item.lease_owner, item.last_seq) == ("w2", 0)  # the loser wrote nothing


def test_renew_retried_after_success_still_succeeds(store, control, read):
    control.start("c", URL, T0)
    lease = won(store.acquire("c", "w1", T0))
    assert store.renew(lease, 3, T0 + 5_000) == Renewed(T0 + 25_000)
    assert store.renew(lease, 3, T0 + 5_000) == Renewed(T0 + 25_000)
    item = read("c")
    assert item is not None
    assert (item.lease_expires_at_ms, item.last_seq) == (T0 + 25_000, 3)


def test_late_renew_cannot_move_the_expiry_backwards(store, control, read):
    control.start("c", URL, T0)
    lease = won(store.acquire("c", "w1", T0))
    assert isinstance(store.renew(lease, 9, T0 + 10_000), Renewed)
    assert store.renew(lease, 4, T0 + 5_000) is RenewRefusal.SUPERSEDED
    item = read("c")
    assert item is not None
    assert (item.lease_expires_at_ms, item.last_seq) == (T0 + 30_000, 9)


def test_release_then_acquire_by_another_resumes_from_the_checkpoint(store, control, read):
    control.start("c", URL, T0)
    lease = won(store.acquire("c", "w1", T0))
    assert store.release(lease, 77, T0 + 1_000).released
    released = read("c")
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


def test_a_new_attempt_never_adopts_an_older_hold_whose_release_is_in_flight(store, control, read):
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
    item = read("c")
    assert item is not None
    assert (item.lease_owner, item.lease_epoch) == ("w2", 2)


def test_renew_sees_stop_and_restart(store, control):
    control.start("c", URL, T0)
    lease = won(store.acquire("c", "w1", T0))
    control.stop("c", T0 + 1_000)
    assert store.renew(lease, 2, T0 + 5_000) is RenewRefusal.STOPPED
    assert control.start("c", URL, T0 + 6_000).outcome is StartOutcome.RESTARTED
    assert store.renew(lease, 2, T0 + 7_000) is RenewRefusal.RESTARTED


def test_release_after_restart_with_new_url_keeps_the_reset_checkpoint(store, control, read):
    control.start("c", URL, T0)
    lease = won(store.acquire("c", "w1", T0))
    assert isinstance(store.renew(lease, 50, T0 + 1_000), Renewed)
    control.stop("c", T0 + 2_000)
    restarted = control.start("c", "wss://feed.example/b", T0 + 3_000)
    assert restarted.outcome is StartOutcome.RESTARTED
    released = store.release(lease, 60, T0 + 4_000)
    assert (released.released, released.checkpointed) == (True, False)  # not the stale seq
    assert released.restarted  # the release saw the new start: the holder takes it again
    item = read("c")
    assert item is not None
    assert (item.last_seq, item.ws_url, item.start_gen, item.lease_owner) == (
        0,
        "wss://feed.example/b",
        2,
        None,
    )
    again = won(store.acquire("c", "w2", T0 + 4_001))
    assert (again.ws_url, again.last_seq, again.start_gen) == ("wss://feed.example/b", 0, 2)


def test_restart_with_the_same_url_keeps_the_checkpoint(store, control, read):
    control.start("c", URL, T0)
    lease = won(store.acquire("c", "w1", T0))
    assert store.release(lease, 12, T0 + 1).released
    control.stop("c", T0 + 2)
    item = read("c")
    assert item is not None
    assert item.expires_at is not None
    assert control.start("c", URL, T0 + 3).outcome is StartOutcome.RESTARTED
    item = read("c")
    assert item is not None
    assert (item.last_seq, item.start_gen, item.expires_at, item.desired_state) == (
        12,
        2,
        None,
        schema.STARTED,
    )


def test_start_outcomes_are_decided_by_conditional_writes(control, store, read):
    assert control.start("c", URL, T0).outcome is StartOutcome.CREATED
    assert control.start("c", URL, T0 + 1).outcome is StartOutcome.ALREADY_STARTED
    assert control.start("c", URL + "x", T0 + 2).outcome is StartOutcome.CONFLICT
    item = read("c")
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


def test_seq_gen_moves_only_when_the_router_resets_the_checkpoint(store, control, read):
    control.start("c", URL, T0)
    first = won(store.acquire("c", "w1", T0))
    assert first.seq_gen == 0
    assert store.release(first, 3, T0 + 1).released
    for step, url in enumerate([URL, URL, "wss://feed.example/b", "wss://feed.example/b"]):
        control.stop("c", T0 + 10 + 2 * step)
        control.start("c", url, T0 + 11 + 2 * step)
    item = read("c")
    assert item is not None
    assert (item.start_gen, item.seq_gen, item.last_seq) == (5, 1, 0)


def test_a_plain_stop_release_reports_no_restart(store, control, read):
    control.start("c", URL, T0)
    lease = won(store.acquire("c", "w1", T0))
    control.stop("c", T0 + 1_000)
    released = store.release(lease, 4, T0 + 2_000)
    assert (released.released, released.checkpointed, released.restarted) == (True, True, False)
    item = read("c")
    assert item is not None
    assert (item.last_seq, item.desired_state, item.lease_owner) == (4, schema.STOPPED, None)


# --- parking (docs/DESIGN.md §3.3.1) ---------------------------------------------------

REASON = "HTTP 404 from upstream"


def parked_lease(store, control, cid: str = "p", *, last_seq: int = 0) -> Lease:
    control.start(cid, URL, T0)
    lease = won(store.acquire(cid, "w1", T0))
    if last_seq:
        assert isinstance(store.renew(lease, last_seq, T0 + 1), Renewed)
    return lease


def test_park_releases_with_the_final_checkpoint_and_marks_the_item(store, control, read):
    lease = parked_lease(store, control, last_seq=5)
    assert store.record_failing_since(lease, T0 + 100, T0 + 100)
    parked = store.park(lease, 9, REASON, T0 + 2_000)
    assert parked == Released(released=True, restarted=False, checkpointed=True, parked=True)
    item = read("p")
    assert item is not None
    assert item.lease_owner is None
    assert item.lease_token is None
    assert item.last_seq == 9
    assert (item.parked_reason, item.parked_at_ms) == (REASON, T0 + 2_000)
    assert item.failing_since_ms is None
    assert item.lease_expires_at_ms == schema.PARKED_EXPIRY_MS
    assert item.desired_state == schema.STARTED  # the router's alone
    # A second park (a retry after a lost answer) finds nothing of ours.
    assert store.park(lease, 9, REASON, T0 + 2_001) == Released(
        released=False, restarted=False, checkpointed=False
    )


def test_a_parked_connection_is_refused_and_never_an_orphan(store, control, read):
    lease = parked_lease(store, control)
    control.start("free", URL, T0)
    store.park(lease, 0, REASON, T0 + 1)
    for now in (T0 + 1, T0 + 10**9, T0 + 10**12):
        assert store.acquire("p", "w2", now) is AcquireRefusal.PARKED
        assert store.find_orphans(now, limit=100) == ["free"]
    assert read("p").lease_epoch == lease.epoch  # type: ignore[union-attr]


def test_park_after_a_stop_or_a_restart_is_an_ordinary_release(store, control, read):
    lease = parked_lease(store, control, last_seq=4)
    control.stop("p", T0 + 10)
    released = store.park(lease, 6, REASON, T0 + 20)
    assert (released.released, released.parked, released.restarted) == (True, False, False)
    item = read("p")
    assert item is not None
    assert item.parked_reason is None
    assert item.last_seq == 6
    # A restart with another URL while held: the release sees it, the checkpoint is
    # not written over the reset.
    control.start("p", URL, T0 + 25)
    lease = won(store.acquire("p", "w1", T0 + 30))
    control.stop("p", T0 + 40)
    control.start("p", URL + "?v=2", T0 + 41)
    released = store.park(lease, 8, REASON, T0 + 50)
    assert (released.released, released.parked, released.restarted) == (True, False, True)
    item = read("p")
    assert item is not None
    assert item.parked_reason is None
    assert item.last_seq == 0


@pytest.mark.parametrize(
    ("url", "keeps_checkpoint"), [(URL, True), ("wss://feed.example/other", False)]
)
def test_a_start_re_arms_a_parked_connection(store, control, read, url, keeps_checkpoint):
    lease = parked_lease(store, control, last_seq=7)
    store.park(lease, 7, REASON, T0 + 10)
    before = read("p")
    assert before is not None
    result = control.start("p", url, T0 + 20)
    assert result.outcome is StartOutcome.RESTARTED
    item = read("p")
    assert item is not None
    assert (item.parked_reason, item.parked_at_ms, item.failing_since_ms) == (None, None, None)
    assert item.lease_expires_at_ms == 0
    assert item.start_gen == before.start_gen + 1
    assert item.ws_url == url
    if keeps_checkpoint:
        assert (item.last_seq, item.seq_gen) == (7, before.seq_gen)
    else:
        assert (item.last_seq, item.seq_gen) == (0, before.seq_gen + 1)
    # Found and taken again, by anyone.
    assert store.find_orphans(T0 + 30, limit=10) == ["p"]
    again = won(store.acquire("p", "w2", T0 + 30))
    assert again.epoch == lease.epoch + 1
    assert again.last_seq == item.last_seq
    # Re-armed and running: a second start is the usual "already started".
    assert control.start("p", url, T0 + 40).outcome is StartOutcome.ALREADY_STARTED


def test_a_stopped_parked_connection_stays_parked_until_started(store, control, read):
    lease = parked_lease(store, control, last_seq=3)
    store.park(lease, 3, REASON, T0 + 10)
    assert control.stop("p", T0 + 20) is StopOutcome.STOPPED
    item = read("p")
    assert item is not None
    assert (item.desired_state, item.parked_reason) == (schema.STOPPED, REASON)
    assert store.acquire("p", "w2", T0 + 30) is AcquireRefusal.STOPPED
    assert control.start("p", URL, T0 + 40).outcome is StartOutcome.RESTARTED
    item = read("p")
    assert item is not None
    assert (item.desired_state, item.parked_reason, item.expires_at) == (schema.STARTED, None, None)
    assert (item.lease_expires_at_ms, item.last_seq) == (0, 3)


def test_the_failing_mark_is_written_once_read_by_the_next_owner_and_cleared(store, control, read):
    lease = parked_lease(store, control)
    assert store.record_failing_since(lease, T0 + 100, T0 + 150)
    assert read("p").failing_since_ms == T0 + 100  # type: ignore[union-attr]
    # The holder crashes; the next owner goes on from the recorded start.
    later = T0 + TIMING.lease_ms + TIMING.skew_ms + 1
    taken = won(store.acquire("p", "w2", later))
    assert taken.failing_since_ms == T0 + 100
    # The old holder can no longer touch it.
    assert store.clear_failing_since(lease, later + 1) is False
    assert store.record_failing_since(lease, later + 1, later + 1) is False
    assert store.clear_failing_since(taken, later + 2) is True
    assert read("p").failing_since_ms is None  # type: ignore[union-attr]
    released = store.release(taken, 0, later + 3)
    assert released.released
    assert won(store.acquire("p", "w3", later + 4)).failing_since_ms is None


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
def test_every_lease_write_stamps_updated_at(store, control, step, read):
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
    item = read("c")
    assert item is not None
    assert item.updated_at_ms == (T0 + 10 if step == "acquire" else T0 + 20)


def test_each_acquire_attempt_writes_a_fresh_random_token(store, control, read):
    control.start("c", URL, T0)
    tokens = []
    for attempt in range(3):
        lease = won(store.acquire("c", "w1", T0 + attempt))
        item = read("c")
        assert item is not None
        tokens.append(item.lease_token)
        assert store.release(lease, 0, T0 + attempt).released
    assert all(re.fullmatch(r"[0-9a-f]{16}", str(token)) for token in tokens), tokens
    assert len(set(tokens)) == 3


def test_a_late_release_of_an_older_epoch_of_the_same_worker_frees_nothing(store, control, read):
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
    item = read("c")
    assert item is not None
    assert (item.lease_owner, item.lease_epoch, item.lease_expires_at_ms, item.last_seq) == (
        "w1",
        2,
        T0 + 42_000,
        30,
    )
    assert store.acquire("c", "w2", T0 + 23_000) is AcquireRefusal.HELD


def test_a_stale_renew_of_an_older_epoch_never_extends_the_newer_lease(store, control, read):
    control.start("c", URL, T0)
    old = won(store.acquire("c", "w1", T0))
    won(store.acquire("c", "w1", T0 + 21_001))
    # The old runner's renew, sent later by the wall clock than the new acquire:
    assert store.renew(old, 9, T0 + 30_000) is RenewRefusal.LOST
    item = read("c")
    assert item is not None
    assert (item.lease_epoch, item.lease_expires_at_ms, item.last_seq) == (2, T0 + 41_001, 0)


def test_releasing_a_lease_no_longer_held_is_one_write_that_changes_nothing(
    ddb, table, control, read
):
    spy = ClientSpy(ddb)
    store = LeaseStore(spy, table, TIMING)
    control.start("c", URL, T0)
    old = won(store.acquire("c", "w1", T0))
    won(store.acquire("c", "w2", T0 + 21_001))
    before = read("c")
    writes = spy.updates()
    assert store.release(old, 5, T0 + 22_000) == Released(
        released=False, restarted=False, checkpointed=False
    )
    assert spy.updates() == writes + 1  # no second try without the checkpoint
    assert read("c") == before


def test_a_release_whose_second_write_finds_the_lease_taken_frees_nothing(
    ddb, table, control, read
):
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
    item = read("c")
    assert item is not None
    assert (item.lease_owner, item.lease_epoch, item.lease_expires_at_ms, item.last_seq) == (
        "w2",
        taken[0].epoch,
        T0 + 41_001,
        0,
    )
