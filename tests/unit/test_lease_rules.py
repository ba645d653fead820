"""The pure lease rules, as tables of inputs and expected decisions."""

import pytest

from wsfleet import schema
from wsfleet.item import ConnectionItem
from wsfleet.lease_rules import (
    AcquireRefusal,
    Lease,
    ParkOutcome,
    ReleaseOutcome,
    RenewRefusal,
    acquire_failure,
    acquire_update,
    failing_cleared_update,
    failing_since_update,
    fence_deadline,
    is_orphan,
    lease_won,
    may_handle,
    orphan_cutoff_ms,
    park_failure,
    park_update,
    release_failure,
    release_update,
    renew_failure,
    renew_update,
    restarted_since,
)
from wsfleet.timing import LeaseTiming

TIMING = LeaseTiming.from_lease(20)  # skew 1 s, margin 2 s
ME = "worker-a"
NOW = 1_000_000


def item(**fields) -> ConnectionItem:
    base = {
        "connection_id": "c1",
        "desired_state": schema.STARTED,
        "ws_url": "wss://feed.example/c1",
        "lease_owner": None,
        "lease_expires_at_ms": 0,
        "lease_epoch": 0,
        "last_seq": 0,
        "start_gen": 1,
    }
    return ConnectionItem(**(base | fields))


def lease(**fields) -> Lease:
    base = {
        "connection_id": "c1",
        "owner": ME,
        "epoch": 3,
        "start_gen": 1,
        "ws_url": "wss://feed.example/c1",
        "last_seq": 10,
        "expires_at_ms": NOW + 20_000,
    }
    return Lease(**(base | fields))


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({}, True),  # never taken: expiry 0
        ({"lease_owner": "w", "lease_expires_at_ms": NOW}, False),  # exactly at expiry
        ({"lease_owner": "w", "lease_expires_at_ms": NOW - 1000}, False),  # at the skew margin
        ({"lease_owner": "w", "lease_expires_at_ms": NOW - 1001}, True),  # 1 ms past it
        ({"lease_owner": "w", "lease_expires_at_ms": NOW + 5000}, False),  # live
        ({"lease_owner": None, "lease_expires_at_ms": NOW + 5000}, True),  # released
        ({"desired_state": schema.STOPPED}, False),
        ({"desired_state": schema.STOPPED, "lease_owner": "w"}, False),
        # parked: released, but given up on until re-armed
        ({"parked_reason": "HTTP 404 from upstream", "lease_expires_at_ms": 0}, False),
        ({"parked_reason": "x", "lease_expires_at_ms": schema.PARKED_EXPIRY_MS}, False),
    ],
)
def test_is_orphan_boundaries(fields, expected):
    assert is_orphan(item(**fields), NOW, TIMING) is expected


def test_orphan_cutoff_is_now_minus_skew():
    assert orphan_cutoff_ms(NOW, TIMING) == NOW - 1000


def test_acquire_update_carries_expiry_and_cutoff():
    update = acquire_update(ME, NOW, TIMING, "tok")
    values = update.values
    assert values[":token"] == {"S": "tok"}
    assert values[":expiry"] == {"N": str(NOW + 20_000)}
    assert values[":cutoff"] == {"N": str(NOW - 1000)}
    assert values[":me"] == {"S": ME}
    assert "ADD #epoch :one" in update.update_expression
    assert "#expiry < :cutoff" in update.condition_expression
    assert set(update.names.values()) >= {"desired_state", "lease_owner", "lease_epoch"}


@pytest.mark.parametrize(
    ("old", "expected_epoch", "expected_latency"),
    [
        (item(), 1, None),  # first start
        (item(lease_epoch=4, lease_expires_at_ms=0), 5, None),  # released: not a takeover
        (item(lease_owner="w", lease_epoch=4, lease_expires_at_ms=NOW - 3000), 5, 3000),
        (item(lease_owner="w", lease_epoch=9, lease_expires_at_ms=NOW + 10), 10, 0),  # clamp
    ],
)
def test_lease_won_from_old_item(old, expected_epoch, expected_latency):
    won = lease_won(old, ME, NOW, TIMING)
    assert won.epoch == expected_epoch
    assert won.takeover_latency_ms == expected_latency
    assert won.expires_at_ms == NOW + 20_000
    assert (won.ws_url, won.last_seq, won.start_gen) == (old.ws_url, old.last_seq, old.start_gen)


@pytest.mark.parametrize(
    ("old", "expected"),
    [
        (None, AcquireRefusal.UNKNOWN_ID),
        (item(lease_owner="other", lease_expires_at_ms=NOW + 1), AcquireRefusal.HELD),
        (item(desired_state=schema.STOPPED), AcquireRefusal.STOPPED),
        (item(desired_state=schema.STOPPED, lease_owner="other"), AcquireRefusal.STOPPED),
        (item(parked_reason="HTTP 404 from upstream"), AcquireRefusal.PARKED),
        # stopped and parked: the stop is the router's newer word
        (item(desired_state=schema.STOPPED, parked_reason="x"), AcquireRefusal.STOPPED),
    ],
)
def test_acquire_refusals(old, expected):
    assert acquire_failure(old, ME, "tok") is expected


def test_acquire_failure_adopts_own_lease_after_a_retried_success():
    old = item(
        lease_owner=ME,
        lease_token="tok",
        lease_epoch=7,
        lease_expires_at_ms=NOW + 20_000,
        last_seq=42,
    )
    adopted = acquire_failure(old, ME, "tok")
    assert isinstance(adopted, Lease)
    assert (adopted.epoch, adopted.last_seq, adopted.expires_at_ms) == (7, 42, NOW + 20_000)
    assert adopted.takeover_latency_ms is None


@pytest.mark.parametrize("stored_token", ["older-attempt", None])
def test_acquire_failure_never_adopts_an_older_hold_of_the_same_worker(stored_token):
    """An earlier runner of this worker (fenced, its release maybe still in flight)
    left the lease: adopting it could outlive that release while another worker takes
    over, so it counts as held."""
    old = item(lease_owner=ME, lease_token=stored_token, lease_epoch=7, lease_expires_at_ms=NOW)
    assert acquire_failure(old, ME, "tok") is AcquireRefusal.HELD


@pytest.mark.parametrize(
    ("old", "expected"),
    [
        (None, RenewRefusal.GONE),
        (item(lease_owner="other", lease_epoch=4), RenewRefusal.LOST),
        (item(lease_owner=ME, lease_epoch=4), RenewRefusal.LOST),  # our id, newer epoch
        (item(lease_owner=None, lease_epoch=3), RenewRefusal.LOST),  # released meanwhile
        # lost wins over stopped: another holder may already be running it
        (item(lease_owner="other", lease_epoch=4, desired_state=schema.STOPPED), RenewRefusal.LOST),
        (item(lease_owner=ME, lease_epoch=3, desired_state=schema.STOPPED), RenewRefusal.STOPPED),
        (item(lease_owner=ME, lease_epoch=3, start_gen=2), RenewRefusal.RESTARTED),
        (
            item(lease_owner=ME, lease_epoch=3, start_gen=2, desired_state=schema.STOPPED),
            RenewRefusal.STOPPED,
        ),
        (
            item(lease_owner=ME, lease_epoch=3, lease_expires_at_ms=NOW + 25_000),
            RenewRefusal.SUPERSEDED,
        ),
    ],
)
def test_renew_refusals(old, expected):
    assert renew_failure(old, lease()) is expected


@pytest.mark.parametrize(
    ("refusal", "keeps", "graceful"),
    [
        (RenewRefusal.LOST, False, False),
        (RenewRefusal.GONE, False, False),
        (RenewRefusal.STOPPED, False, True),
        (RenewRefusal.RESTARTED, False, True),
        (RenewRefusal.SUPERSEDED, True, False),
    ],
)
def test_renew_refusal_consequences(refusal, keeps, graceful):
    assert refusal.keeps_lease is keeps
    assert refusal.graceful is graceful


def test_renew_update_checkpoints_in_the_same_write():
    update = renew_update(lease(), 57, NOW, TIMING)
    assert update.values[":seq"] == {"N": "57"}
    assert update.values[":expiry"] == {"N": str(NOW + 20_000)}
    assert "#expiry <= :expiry" in update.condition_expression
    for clause in ("#owner = :me", "#epoch = :epoch", "#gen = :gen", "#state = :started"):
        assert clause in update.condition_expression


def test_release_with_checkpoint_requires_the_same_seq_generation():
    """Not the start generation: a restart with the same URL keeps the stream, and the
    final checkpoint with it; only a reset (new URL, new ``seq_gen``) drops it."""
    with_seq = release_update(lease(seq_gen=3), 99, NOW)
    assert "#seqgen = :seqgen" in with_seq.condition_expression
    assert "#gen" not in with_seq.condition_expression
    assert with_seq.values[":seqgen"] == {"N": "3"}
    assert with_seq.values[":seq"] == {"N": "99"}
    without = release_update(lease(), None, NOW)
    assert ":seq" not in without.values
    assert "#seqgen" not in without.condition_expression
    assert "REMOVE #owner, #token" in without.update_expression


@pytest.mark.parametrize(
    ("old", "restarted"),
    [
        (item(start_gen=1), False),  # the generation it was acquired under
        (item(start_gen=2), True),  # started again since
        (item(start_gen=2, desired_state=schema.STOPPED), False),  # and stopped again
        (item(start_gen=1, desired_state=schema.STOPPED), False),  # only stopped
    ],
)
def test_restarted_since(old, restarted):
    assert restarted_since(old, lease()) is restarted


def test_acquire_learns_the_seq_generation():
    won = lease_won(item(seq_gen=4), ME, NOW, TIMING)
    assert won.seq_gen == 4


@pytest.mark.parametrize(
    ("old", "expected"),
    [
        (None, ReleaseOutcome.NOT_HELD),
        (item(lease_owner="other", lease_epoch=3), ReleaseOutcome.NOT_HELD),
        (item(lease_owner=ME, lease_epoch=4), ReleaseOutcome.NOT_HELD),
        (item(lease_owner=ME, lease_epoch=3, start_gen=2), ReleaseOutcome.RETRY_WITHOUT_CHECKPOINT),
    ],
)
def test_release_failures(old, expected):
    assert release_failure(old, lease()) is expected


@pytest.mark.parametrize(
    ("now", "allowed"),
    [
        (100.0, True),  # just renewed
        (116.999, True),
        (117.0, False),  # exactly at lease - skew - margin
        (117.001, False),
        (200.0, False),
    ],
)
def test_fence_deadline_boundaries(now, allowed):
    deadline = fence_deadline(100.0, TIMING)
    assert deadline == pytest.approx(117.0)
    assert may_handle(now, deadline) is allowed


def test_fence_deadline_falls_before_any_takeover():
    """With clocks within the skew, no other worker can pass the acquire condition
    before the holder's fence deadline."""
    for clock_offset_ms in (-1000, 0, 1000):
        renew_sent_ms = NOW
        expiry = renew_sent_ms + TIMING.lease_ms
        # earliest takeover, on the holder's clock: the other's now - skew > expiry
        takeover_on_holder_clock = expiry + TIMING.skew_ms + 1 - clock_offset_ms
        fence_on_holder_clock = renew_sent_ms + TIMING.fence_after * 1000
        assert fence_on_holder_clock < takeover_on_holder_clock


def test_acquire_refuses_a_parked_connection_and_a_new_owner_learns_the_failing_clock():
    update = acquire_update(ME, NOW, TIMING, "tok")
    assert "attribute_not_exists(#parked)" in update.condition_expression
    assert update.names["#parked"] == schema.PARKED_REASON
    won = lease_won(item(failing_since_ms=NOW - 5000), ME, NOW, TIMING)
    assert won.failing_since_ms == NOW - 5000
    assert lease_won(item(), ME, NOW, TIMING).failing_since_ms is None


def test_park_update_releases_checkpoints_and_leaves_the_orphan_query():
    update = park_update(lease(seq_gen=2, start_gen=4), 17, "HTTP 404 from upstream", NOW)
    for clause in (
        "#owner = :me",
        "#epoch = :epoch",
        "#seqgen = :seqgen",
        "#state = :started",
        "#gen = :gen",
    ):
        assert clause in update.condition_expression
    assert update.update_expression.startswith("REMOVE #owner, #token, #failing SET ")
    values = update.values
    assert values[":parked_expiry"] == {"N": str(2**53 - 1)}
    assert values[":seq"] == {"N": "17"}
    assert values[":reason"] == {"S": "HTTP 404 from upstream"}
    assert values[":now"] == {"N": str(NOW)}
    assert (values[":seqgen"], values[":gen"]) == ({"N": "2"}, {"N": "4"})
    # The sentinel is beyond any cutoff: the orphan query never returns it.
    assert orphan_cutoff_ms(10 * NOW**2, TIMING) < schema.PARKED_EXPIRY_MS


def test_park_reason_is_kept_short():
    update = park_update(lease(), 0, "x" * 1000, NOW)
    assert len(update.values[":reason"]["S"]) == 200


@pytest.mark.parametrize(
    ("old", "expected"),
    [
        (None, ParkOutcome.NOT_HELD),
        (item(lease_owner="other", lease_epoch=3), ParkOutcome.NOT_HELD),
        (item(lease_owner=ME, lease_epoch=4), ParkOutcome.NOT_HELD),
        # still ours, but the router spoke since: an ordinary release instead
        (
            item(lease_owner=ME, lease_epoch=3, desired_state=schema.STOPPED),
            ParkOutcome.RELEASE_INSTEAD,
        ),
        (item(lease_owner=ME, lease_epoch=3, start_gen=2), ParkOutcome.RELEASE_INSTEAD),
        (item(lease_owner=ME, lease_epoch=3, start_gen=2, seq_gen=1), ParkOutcome.RELEASE_INSTEAD),
    ],
)
def test_park_failures(old, expected):
    assert park_failure(old, lease()) is expected


def test_the_failing_mark_is_written_and_removed_only_by_the_holder():
    mark = failing_since_update(lease(), NOW - 250, NOW)
    cleared = failing_cleared_update(lease(), NOW)
    for update in (mark, cleared):
        assert update.condition_expression == "#owner = :me AND #epoch = :epoch"
        assert update.names["#failing"] == schema.FAILING_SINCE_MS
    assert mark.update_expression.startswith("SET #failing = :since")
    assert mark.values[":since"] == {"N": str(NOW - 250)}
    assert cleared.update_expression.startswith("REMOVE #failing")


@pytest.mark.parametrize(
    ("owner", "expiry", "latency"),
    [
        (None, 0, None),  # never taken, or released
        (None, NOW - 3000, None),  # no holder: nothing was taken over, whatever the expiry
        ("w", 0, None),  # a holder with no expiry written: no moment to measure from
        ("w", 1, NOW - 1),  # the smallest real expiry counts
        ("w", NOW - 3000, 3000),
        ("w", NOW, 0),
        ("w", NOW + 10, 0),  # taken within the skew: clamped, never negative
    ],
)
def test_takeover_latency_is_measured_only_from_a_lapsed_holder(owner, expiry, latency):
    old = item(lease_owner=owner, lease_expires_at_ms=expiry, lease_epoch=2)
    assert lease_won(old, ME, NOW, TIMING).takeover_latency_ms == latency


def test_lease_won_carries_everything_the_runner_needs_from_the_old_item():
    old = item(
        ws_url="wss://feed.example/other",
        lease_owner="w",
        lease_token="theirs",
        lease_epoch=6,
        lease_expires_at_ms=NOW - 5000,
        last_seq=31,
        start_gen=4,
        seq_gen=2,
    )
    assert lease_won(old, ME, NOW, TIMING) == Lease(
        connection_id="c1",
        owner=ME,
        epoch=7,
        start_gen=4,
        ws_url="wss://feed.example/other",
        last_seq=31,
        expires_at_ms=NOW + 20_000,
        takeover_latency_ms=5000,
        seq_gen=2,
    )


def test_an_adopted_lease_is_the_stored_one_field_by_field():
    """Adoption takes the lease exactly as the landed attempt wrote it: the stored epoch
    and expiry (which the fence proof relies on), the URL, checkpoint and both
    generations the release and the renews are conditioned on."""
    old = item(
        ws_url="wss://feed.example/other",
        lease_owner=ME,
        lease_token="tok",
        lease_epoch=7,
        lease_expires_at_ms=NOW + 20_000,
        last_seq=42,
        start_gen=3,
        seq_gen=2,
    )
    assert acquire_failure(old, ME, "tok") == Lease(
        connection_id="c1",
        owner=ME,
        epoch=7,
        start_gen=3,
        ws_url="wss://feed.example/other",
        last_seq=42,
        expires_at_ms=NOW + 20_000,
        takeover_latency_ms=None,
        seq_gen=2,
    )


@pytest.mark.parametrize(
    ("stored_owner", "stored_token", "expected"),
    [
        (ME, "tok", Lease),  # this very attempt landed
        (ME, "other", AcquireRefusal.HELD),  # an older attempt of mine
        ("other", "tok", AcquireRefusal.HELD),  # the same token, another worker
        (None, "tok", AcquireRefusal.HELD),
        (None, None, AcquireRefusal.HELD),
    ],
)
def test_adoption_needs_both_the_owner_and_the_token(stored_owner, stored_token, expected):
    old = item(lease_owner=stored_owner, lease_token=stored_token, lease_expires_at_ms=NOW)
    result = acquire_failure(old, ME, "tok")
    if expected is Lease:
        assert isinstance(result, Lease)
    else:
        assert result is expected


def test_an_adopted_lease_keeps_the_failing_clock_of_the_item():
    old = item(lease_owner=ME, lease_token="tok", lease_epoch=2, failing_since_ms=NOW - 5_000)
    adopted = acquire_failure(old, ME, "tok")
    assert isinstance(adopted, Lease)
    assert adopted.failing_since_ms == NOW - 5_000


@pytest.mark.parametrize(
    "update",
    [
        lambda: failing_since_update(lease(), NOW - 5_000, NOW),
        lambda: failing_cleared_update(lease(), NOW),
    ],
    ids=["mark", "clear"],
)
def test_the_failing_mark_writes_stamp_the_time_of_the_write(update):
    assert update().values[":now"] == {"N": str(NOW)}
