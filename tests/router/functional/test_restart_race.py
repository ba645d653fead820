"""The start-after-stop race, end to end: two real workers (lease 2 s, heartbeat 0.5 s),
the router over HTTP, DynamoDB Local, moto SQS and the demo feed.

A connection is stopped and started again through the router's API right after its
owner's session was renewed, so the owner still holds the lease and has not seen the
stop. The start bumps ``start_gen`` and, like the stop, leaves a notice on the owner's
session; the owner's next session renew returns them, it reads the item, closes and
releases without writing its old checkpoint over the router's reset, and the
connection runs again under a newer epoch with the URL of the latest start.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from local_stack.audit import Record, lost_seqs, stale_deliveries
from tests.support.fleet import TIMING, Fleet, wait_until
from tests.support.timing import scaled
from wsfleet.checkpoint_page import PageEntry
from wsfleet.item import ConnectionItem
from wsfleet.session_store import SessionStore

pytestmark = [pytest.mark.fleet, pytest.mark.timeout(scaled(180))]

STOP_BOUND = TIMING.heartbeat + 1.0
RESTART_BOUND = 2 * STOP_BOUND + 1.0  # the owner notices, releases; someone re-acquires


def running(fleet: Fleet, connection_id: str, ws_url: str) -> ConnectionItem:
    """Two workers, the connection started over HTTP and flowing; returns its item."""
    fleet.start_worker("w")
    fleet.start_worker("w")
    assert fleet.start_connection(connection_id, ws_url)["outcome"] == "created"
    fleet.wait_handling([connection_id], scaled(15), min_seq=5)
    item = fleet.item(connection_id)
    assert item.lease_owner is not None
    # The router's first answers about an owned connection (item, owner session, page)
    # are its slowest; the race below needs a stop and a start within one heartbeat.
    for _ in range(3):
        assert fleet.api.get(connection_id)["owner"] == item.lease_owner
    return item


RACE_ATTEMPTS = 4


def session_expiry(fleet: Fleet, item: ConnectionItem) -> int | None:
    """The expiry of the owning session named by ``item``: it moves with each renew."""
    if item.lease_owner is None or item.owner_session_gen is None:
        return None
    session = SessionStore(fleet.ddb, fleet.table, TIMING).get_session(
        item.lease_owner, item.owner_session_gen
    )
    return None if session is None else session.expires_at_ms


def restart_right_after_a_renew(
    fleet: Fleet, connection_id: str, url_for_attempt: Callable[[int], str]
) -> tuple[ConnectionItem, float, str]:
    """Stop, then start with ``url_for_attempt(n)``, just after the owner's session was
    renewed, so the owner has a whole heartbeat before it can notice. The race needs
    the stop and the start to land within that heartbeat; a busy machine can miss it,
    and then the attempt is simply repeated after the next renew (with the next URL).
    Returns the item as the owner left it, the time of the start and the URL it
    started with."""
    for attempt in range(RACE_ATTEMPTS):
        ws_url = url_for_attempt(attempt)
        owned = fleet.item(connection_id)
        seen = session_expiry(fleet, owned)
        assert seen is not None, owned
        wait_until(
            lambda owned=owned, seen=seen: session_expiry(fleet, owned) != seen,
            scaled(2 * TIMING.heartbeat + 1),
            "a session renew",
            interval=0.01,
        )
        before = fleet.item(connection_id)
        began = time.monotonic()
        assert fleet.stop_connection(connection_id)["state"] == "STOPPED"
        restarted = fleet.start_connection(connection_id, ws_url)
        restarted_at = time.time()
        took = time.monotonic() - began
        assert restarted["outcome"] == "restarted", restarted
        assert restarted["start_gen"] == before.start_gen + 1
        assert restarted["ws_url"] == ws_url
        # The race happened when the old owner still held the lease at the restart.
        raced = (
            took < TIMING.heartbeat
            and restarted["owner"] == before.lease_owner
            and restarted["epoch"] == before.lease_epoch
        )
        if raced:
            return before, restarted_at, ws_url
        print(f"attempt {attempt}: missed the race (stop + start took {took:.3f} s); again")
        wait_until(
            lambda before=before: any(
                r.connection_id == connection_id and r.epoch > before.lease_epoch
                for r in fleet.records()
            ),
            scaled(15),
            "the restarted connection to run again before the next attempt",
        )
    pytest.fail(f"the stop-start race was missed {RACE_ATTEMPTS} times in a row")


def first_delivery(records: list[Record], feed: str, after_epoch: int) -> Record | None:
    matching = [r for r in records if r.feed == feed and r.epoch > after_epoch]
    return min(matching, key=lambda r: r.t) if matching else None


def test_restart_with_a_new_url_runs_the_new_stream_from_its_start(fleet: Fleet) -> None:
    running(fleet, "race", fleet.feed("stream-a"))

    before, restarted_at, ws_url = restart_right_after_a_renew(
        fleet, "race", lambda attempt: fleet.feed(f"stream-b{attempt}")
    )
    stream_b = ws_url.rsplit("/", 1)[-1]

    first = wait_until(
        lambda: first_delivery(fleet.records(), stream_b, before.lease_epoch),
        scaled(RESTART_BOUND),
        "the new stream to be handled",
    )
    print(f"restart to first new-stream delivery: {first.t - restarted_at:.3f} s")
    wait_until(
        lambda: any(r.feed == stream_b and r.seq >= 10 for r in fleet.records()),
        scaled(15),
        "the new stream to flow",
    )
    records = fleet.records()
    new = [r for r in records if r.feed == stream_b]
    old = [r for r in records if r.feed == "stream-a"]
    assert min(r.seq for r in new) == 1  # from the start of stream B
    assert sorted({r.seq for r in new}) == list(range(1, max(r.seq for r in new) + 1))
    assert min(r.epoch for r in new) > before.lease_epoch  # under a newer epoch
    assert max(r.epoch for r in old) <= before.lease_epoch  # nothing of A under it
    assert not {r.epoch for r in old} & {r.epoch for r in new}
    assert stale_deliveries(records) == []

    def checkpointed_on_b() -> tuple[ConnectionItem, PageEntry] | None:
        """The item, and its owner's checkpoint page entry once it is 5 or more into
        the new stream under the current hold (a running connection's checkpoint is
        on its session's page, not on its item)."""
        item = fleet.item("race")
        if item.lease_owner is None or item.owner_session_gen is None:
            return None
        page = SessionStore(fleet.ddb, fleet.table, TIMING).read_page(
            item.lease_owner, item.owner_session_gen
        )
        entry = None if page is None else page.entries.get("race")
        if entry is None or entry.epoch != item.lease_epoch or entry.seq < 5:
            return None
        return item, entry

    item, entry = wait_until(
        checkpointed_on_b, scaled(TIMING.checkpoint + 10), "a checkpoint on the new stream"
    )
    assert item.ws_url == fleet.feed(stream_b)
    assert (item.desired_state, item.start_gen) == ("STARTED", before.start_gen + 1)
    assert item.lease_epoch > before.lease_epoch
    assert item.seq_gen == before.seq_gen + 1  # the router reset the checkpoint
    assert entry.seq_gen == item.seq_gen  # the page's entry is of the new stream
    assert entry.seq <= max(r.seq for r in fleet.records() if r.feed == stream_b)


def test_restart_with_the_same_url_continues_without_loss(fleet: Fleet) -> None:
    running(fleet, "steady", fleet.feed("stream-s"))

    before, restarted_at, _ = restart_right_after_a_renew(
        fleet, "steady", lambda _: fleet.feed("stream-s")
    )

    first = wait_until(
        lambda: first_delivery(fleet.records(), "stream-s", before.lease_epoch),
        scaled(RESTART_BOUND),
        "handling under a newer epoch",
    )
    print(f"restart to first delivery under the new epoch: {first.t - restarted_at:.3f} s")
    target = fleet.highest_seq("steady") + 10
    wait_until(lambda: fleet.highest_seq("steady") >= target, scaled(15), "deliveries to continue")
    records = fleet.records()
    assert lost_seqs(records) == {}
    assert stale_deliveries(records) == []
    newer = [r for r in records if r.epoch > before.lease_epoch]
    older = [r for r in records if r.epoch <= before.lease_epoch]
    # It resumed from the checkpoint (at most a heartbeat of messages again), not from 1.
    assert min(r.seq for r in newer) > 1
    assert min(r.seq for r in newer) <= max(r.seq for r in older) + 1
    item = fleet.item("steady")
    assert (item.ws_url, item.start_gen) == (fleet.feed("stream-s"), before.start_gen + 1)
    assert item.lease_epoch > before.lease_epoch
