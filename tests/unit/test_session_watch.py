"""Expiry by observation (wsfleet/session_watch.py, docs/DESIGN.md §3.6): a session
lapses once this worker has seen its beat (and state) unchanged for ``expire_after``
on its own monotonic clock, counted from the first listing that showed it so. A beat
change, a stale listing or a session that drops out of the listings restarts the
count; nothing brings it forward. And the safety rule: with both clocks' rates within
:data:`~wsfleet.timing.DRIFT_RATE`, whatever their offsets and whatever the listing
times, the earliest reap falls after the holder's fence deadline in real time."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wsfleet import schema
from wsfleet.lease_rules import fence_deadline
from wsfleet.session_rules import SessionItem
from wsfleet.session_watch import WAKE_MARGIN, SessionWatch
from wsfleet.timing import DRIFT_RATE, LeaseTiming

TIMING = LeaseTiming.from_lease()  # lease 2.2 s: expire after 2.2022 s, fence after 1.98 s
E = TIMING.expire_after
MINE = ("me", 1)
TINY = 1e-6


def item(
    worker: str = "w", gen: int = 1, *, beat: int | None = 3, state: str | None = schema.ALIVE
) -> SessionItem:
    return SessionItem(worker_id=worker, session_gen=gen, state=state, expires_at_ms=0, beat=beat)


def watched(
    *listings: tuple[float, list[SessionItem]], timing: LeaseTiming = TIMING
) -> SessionWatch:
    watch = SessionWatch(timing)
    for now, sessions in listings:
        watch.observe(sessions, now)
    return watch


# --- when a session lapses -------------------------------------------------------------


def test_a_session_lapses_once_seen_unchanged_for_expire_after():
    assert TIMING.expire_after == pytest.approx(2.2022)
    session = item()
    watch = watched((0.0, [session]))
    assert watch.unchanged_for(session, 0.0) == 0.0
    assert watch.unchanged_for(session, 1.25) == 1.25
    assert not watch.lapsed(session, 0.0)
    assert not watch.lapsed(session, TIMING.lease)  # a lease is not enough
    assert not watch.lapsed(session, E - TINY)
    assert watch.lapsed(session, E)  # at expire_after exactly
    assert watch.lapsed(session, 3600.0)


def test_the_count_starts_at_the_first_listing_that_showed_the_beat():
    """Listings that show the same beat again do not restart it."""
    session = item()
    watch = watched((10.0, [session]), (10.6, [session]), (11.2, [session]), (12.4, [session]))
    assert watch.unchanged_for(session, 12.5) == pytest.approx(2.5)
    assert not watch.lapsed(session, 10.0 + E - TINY)
    assert watch.lapsed(session, 10.0 + E + TINY)


def test_a_beat_change_restarts_the_count():
    before, after = item(beat=3), item(beat=4)
    watch = watched((0.0, [before]), (2.0, [after]))
    # Only the beat as listed now counts; the older one is not seen unchanged at all.
    assert watch.unchanged_for(before, 2.4) == 0.0
    assert not watch.lapsed(before, 100.0)
    assert watch.unchanged_for(after, 2.4) == pytest.approx(0.4)
    assert not watch.lapsed(after, E + TINY)  # it would have lapsed from the first listing
    assert not watch.lapsed(after, 2.0 + E - TINY)
    assert watch.lapsed(after, 2.0 + E + TINY)


def test_a_live_session_renewing_every_heartbeat_never_lapses():
    watch = SessionWatch(TIMING)
    for n in range(100):
        now = n * TIMING.reconcile
        session = item(beat=n // 2)  # a new beat seen every other pass
        watch.observe([session], now)
        assert not watch.lapsed(session, now + TIMING.reconcile)
        assert watch.overdue([session], now + TIMING.reconcile) == frozenset()


def test_a_state_change_restarts_the_count():
    """A session listed without a state (reapable) after being listed ALIVE, or DEAD
    after ALIVE, is a new sighting: how long it has been seen DEAD is counted from the
    first listing that showed it DEAD."""
    alive, stateless, dead = item(), item(state=None), item(state=schema.DEAD)
    watch = watched((0.0, [alive]), (2.0, [stateless]))
    assert not watch.lapsed(stateless, E + TINY)
    assert watch.lapsed(stateless, 2.0 + E + TINY)
    watch.observe([dead], 5.0)
    assert watch.unchanged_for(dead, 6.5) == pytest.approx(1.5)
    assert watch.unchanged_for(alive, 6.5) == 0.0


def test_a_stale_listing_restarts_the_count_and_never_brings_a_reap_forward():
    """An eventually consistent listing shows beat 3 after one that showed beat 4: the
    count for beat 4 restarts at its next sighting, and beat 3 counts from the stale
    listing, not from when it was first seen."""
    three, four = item(beat=3), item(beat=4)
    watch = watched((0.0, [three]), (1.0, [four]), (2.0, [three]))
    assert watch.unchanged_for(three, 2.5) == pytest.approx(0.5)
    assert not watch.lapsed(three, E + TINY)  # not from its first sighting at 0
    assert watch.lapsed(three, 2.0 + E + TINY)
    assert not watch.lapsed(four, 1.0 + E + TINY)
    watch.observe([four], 3.0)
    assert not watch.lapsed(four, 1.0 + E + TINY)
    assert not watch.lapsed(four, 3.0 + E - TINY)
    assert watch.lapsed(four, 3.0 + E + TINY)


def test_a_worker_that_just_started_watches_for_expire_after_before_anything_lapses():
    """Its first listing shows sessions that may have stopped renewing long ago (their
    expiry, by the writer's wall clock, an hour past): nothing lapses before it has
    watched them for ``expire_after`` itself."""
    stale = [
        SessionItem("a", 1, schema.ALIVE, expires_at_ms=0, beat=9),
        SessionItem("b", 4, schema.ALIVE, expires_at_ms=0, beat=None),
        SessionItem("c", 2, None, expires_at_ms=0, beat=0),
    ]
    started = 50_000.0
    watch = watched((started, stale))
    assert not any(watch.lapsed(s, started + E - TINY) for s in stale)
    assert watch.overdue(stale, started + TIMING.lease - TINY) == frozenset()
    assert watch.next_lapse(MINE, started) == pytest.approx(started + E + WAKE_MARGIN)
    assert all(watch.lapsed(s, started + E + TINY) for s in stale)
    # A fresh watch has seen nothing at all: nothing lapses, nothing is due.
    fresh = SessionWatch(TIMING)
    assert not fresh.lapsed(stale[0], 1e9)
    assert fresh.unchanged_for(stale[0], 1e9) == 0.0
    assert fresh.next_lapse(MINE, 0.0) is None


def test_a_dead_session_never_lapses():
    dead = item(state=schema.DEAD)
    watch = watched((0.0, [dead]))
    assert not watch.lapsed(dead, 3600.0)
    assert watch.unchanged_for(dead, 3600.0) == 3600.0  # how long it has been seen DEAD


def test_a_session_listed_without_a_state_or_a_beat_lapses_like_any_other():
    for bare in (item(state=None), item(beat=None), item(state=None, beat=None)):
        watch = watched((0.0, [bare]))
        assert not watch.lapsed(bare, E - TINY)
        assert watch.lapsed(bare, E + TINY)


def test_only_what_is_listed_is_asked_about():
    """A session object that is not as last listed (another beat, another state,
    another generation, another worker) has not been seen unchanged at all."""
    watch = watched((0.0, [item()]))
    for other in (
        item(beat=4),
        item(beat=None),
        item(state=None),
        item(state=schema.DEAD),
        item(gen=2),
        item("v"),
    ):
        assert watch.unchanged_for(other, 100.0) == 0.0
        assert not watch.lapsed(other, 100.0)


def test_time_before_the_sighting_counts_as_nothing():
    watch = watched((10.0, [item()]))
    assert watch.unchanged_for(item(), 9.0) == 0.0
    assert not watch.lapsed(item(), 9.0)


def test_a_session_no_longer_listed_is_forgotten():
    a, b = item("a"), item("b")
    watch = watched((0.0, [a, b]), (1.0, [a]))
    assert watch.unchanged_for(b, 1.5) == 0.0
    assert not watch.lapsed(b, E + TINY)
    assert watch.next_lapse(MINE, 1.0) == pytest.approx(E + WAKE_MARGIN)  # a's alone
    watch.observe([a, b], 2.0)  # listed again: counted from now
    assert watch.lapsed(a, E + TINY)
    assert not watch.lapsed(b, 2.0 + E - TINY)
    assert watch.lapsed(b, 2.0 + E + TINY)
    watch.observe([], 3.0)  # an empty listing forgets everything
    assert watch.next_lapse(MINE, 3.0) is None
    assert not watch.lapsed(a, 100.0)


# --- overdue -------------------------------------------------------------------------------


def test_overdue_lists_the_alive_sessions_seen_unrenewed_for_a_lease():
    lease = TIMING.lease
    quiet = item("quiet")
    renewing = item("renewing", beat=1)
    dead = item("dead", state=schema.DEAD)
    stateless = item("stateless", state=None)
    unseen = item("unseen")
    listing = [quiet, renewing, dead, stateless]
    watch = watched((0.0, listing), (1.5, [quiet, item("renewing", beat=2), dead, stateless]))
    sessions = [quiet, item("renewing", beat=2), dead, stateless, unseen]
    assert watch.overdue(sessions, lease - TINY) == frozenset()
    assert watch.overdue(sessions, lease) == {("quiet", 1)}  # a lease exactly
    assert watch.overdue(sessions, 1.5 + lease) == {("quiet", 1), ("renewing", 1)}
    assert watch.overdue(sessions, 1e6) == {("quiet", 1), ("renewing", 1)}
    # Only among the sessions asked about, and only as listed.
    assert watch.overdue([quiet], 1e6) == {("quiet", 1)}
    assert watch.overdue([item("quiet", beat=4)], 1e6) == frozenset()
    assert watch.overdue([], 1e6) == frozenset()


def test_overdue_comes_a_little_before_the_lapse():
    """Overdue after a lease (no longer counted on to take anything), reaped only after
    ``expire_after``."""
    session = item()
    watch = watched((0.0, [session]))
    between = (TIMING.lease + E) / 2
    assert watch.overdue([session], between) == {("w", 1)}
    assert not watch.lapsed(session, between)


# --- the next pass ---------------------------------------------------------------------


def test_the_next_pass_comes_when_a_watched_session_lapses_if_not_renewed():
    first = [item("quiet"), item("me"), item("gone", state=schema.DEAD), item("bare", state=None)]
    watch = watched((0.0, first), (1.0, [*first, item("late")]))
    # quiet and bare lapse at E (mine and the DEAD one are skipped), late at 1 + E.
    assert watch.next_lapse(MINE, 1.0) == pytest.approx(E + WAKE_MARGIN)
    # The instant itself is not after now: the next one counts.
    assert watch.next_lapse(MINE, E + WAKE_MARGIN) == pytest.approx(1.0 + E + WAKE_MARGIN)
    assert watch.next_lapse(MINE, 1.0 + E + WAKE_MARGIN) is None
    # Mine is skipped by its key: another generation of the same worker is not.
    assert watch.next_lapse(("me", 2), 1.0) == pytest.approx(E + WAKE_MARGIN)
    only_mine = watched((0.0, [item("me")]))
    assert only_mine.next_lapse(MINE, 0.0) is None
    assert only_mine.next_lapse(("me", 2), 0.0) == pytest.approx(E + WAKE_MARGIN)
    only_dead = watched((0.0, [item("gone", state=schema.DEAD)]))
    assert only_dead.next_lapse(MINE, 0.0) is None


def test_a_pass_at_the_next_lapse_finds_the_session_lapsed():
    session = item()
    watch = watched((123_456.789, [session]))
    due = watch.next_lapse(MINE, 123_456.789)
    assert due is not None
    assert due == pytest.approx(123_456.789 + E + WAKE_MARGIN)
    assert watch.lapsed(session, due)
    assert not watch.lapsed(session, due - 2 * WAKE_MARGIN)


def test_a_renew_seen_moves_the_next_pass():
    watch = watched((0.0, [item(beat=3)]), (2.0, [item(beat=4)]))
    assert watch.next_lapse(MINE, 2.0) == pytest.approx(2.0 + E + WAKE_MARGIN)


# --- this worker's own reap ------------------------------------------------------------


def test_a_reap_of_this_worker_is_recorded_as_seen_dead_from_then():
    alive = item()
    dead = item(state=schema.DEAD)
    watch = watched((0.0, [alive]))
    watch.reaped(dead, 3.0)
    assert not watch.lapsed(alive, 100.0)  # no longer ALIVE as this worker knows it
    assert not watch.lapsed(dead, 100.0)
    assert watch.unchanged_for(dead, 4.0) == pytest.approx(1.0)
    assert watch.next_lapse(MINE, 3.0) is None
    # The listings that follow show it DEAD with the same beat: the count goes on.
    watch.observe([dead], 3.6)
    assert watch.unchanged_for(dead, 4.0) == pytest.approx(1.0)
    assert watch.overdue([dead], 100.0) == frozenset()


def test_a_reap_of_a_session_not_watched_any_more_is_recorded_too():
    dead = item("other", state=schema.DEAD)
    watch = SessionWatch(TIMING)
    watch.reaped(dead, 7.0)
    assert watch.unchanged_for(dead, 9.0) == pytest.approx(2.0)
    watch.observe([], 10.0)  # and forgotten once no longer listed
    assert watch.unchanged_for(dead, 11.0) == 0.0


# --- properties ----------------------------------------------------------------------------

NEW, OLD, ABSENT = "new", "old", "absent"
TIMINGS = [
    TIMING,
    LeaseTiming.from_lease(2, heartbeat=0.5, reconcile=0.5),  # the tests' scaled timings
    LeaseTiming.from_lease(0.5),
    LeaseTiming.from_lease(120),
    LeaseTiming.from_lease(1.0, heartbeat=0.3, margin=0.0021),  # the least margin allowed
    LeaseTiming.from_lease(1000, heartbeat=100, margin=2.001),
]


@dataclass(frozen=True)
class Renew:
    """One renew and what a reaper sees of it. Real times in seconds; each clock reads
    ``rate x real + offset``."""

    timing: LeaseTiming
    holder_rate: float
    holder_offset: float
    reaper_rate: float
    reaper_offset: float
    sent: float
    landed: float
    listings: list[tuple[float, str]]
    """When each of the reaper's listings was answered (sorted), and whether it showed
    the renew's beat (NEW: only once it landed), the beat before (OLD: before it landed,
    or a stale read after) or not the session at all (ABSENT)."""

    def holder(self, real: float) -> float:
        return self.holder_rate * real + self.holder_offset

    def reaper(self, real: float) -> float:
        return self.reaper_rate * real + self.reaper_offset

    @property
    def fenced_at(self) -> float:
        """The holder's fence deadline of this renew, in real time."""
        deadline = fence_deadline(self.holder(self.sent), self.timing)
        return (deadline - self.holder_offset) / self.holder_rate


OLD_ITEM, NEW_ITEM = item(beat=3), item(beat=4)
SHOWN = {NEW: [NEW_ITEM], OLD: [OLD_ITEM], ABSENT: []}


@st.composite
def renews(draw: st.DrawFn) -> Renew:
    timing = draw(st.sampled_from(TIMINGS))
    lease = timing.lease
    # The extremes, where the rule is tightest, as often as any rate within them.
    rates = st.one_of(
        st.sampled_from([1 - DRIFT_RATE, 1 + DRIFT_RATE]),
        st.floats(min_value=1 - DRIFT_RATE, max_value=1 + DRIFT_RATE),
    )
    offsets = st.floats(min_value=-1e6, max_value=1e6)
    sent = draw(st.floats(min_value=-1e5, max_value=1e5))
    in_flight = draw(st.one_of(st.just(0.0), st.floats(min_value=0, max_value=3)))
    landed = sent + in_flight * lease
    listings = []
    # In leases from the send or from the landing; 0: the very instant.
    for from_landing, at, shows in draw(
        st.lists(
            st.tuples(
                st.booleans(),
                st.one_of(st.just(0.0), st.floats(min_value=-3, max_value=5)),
                st.sampled_from([NEW, OLD, ABSENT]),
            ),
            max_size=12,
        )
    ):
        answered = (landed if from_landing else sent) + at * lease
        listings.append((answered, OLD if shows == NEW and answered < landed else shows))
    return Renew(
        timing=timing,
        holder_rate=draw(rates),
        holder_offset=draw(offsets),
        reaper_rate=draw(rates),
        reaper_offset=draw(offsets),
        sent=sent,
        landed=landed,
        listings=sorted(listings),
    )


@settings(max_examples=500)
@given(renews())
def test_no_reap_before_the_holders_fence_deadline(renew):
    """The holder sends a renew at real time ``sent`` and fences ``fence_after`` later
    on its own clock. The renew lands at ``landed`` (not before its send), changing the
    beat from 3 to 4. The reaper lists the session at any times and reaps on condition
    of beat 4 as soon as its watch says so: never before the fence deadline, in real
    time, whatever the clocks' offsets and their rates within the drift. (A reap on
    beat 3 fails once the renew has landed; one that lands before makes the renew fail,
    so this renew moves no deadline.)"""
    watch = SessionWatch(renew.timing)
    fenced_at = renew.fenced_at
    listings = renew.listings
    for n, (at, shows) in enumerate(listings):
        if at > fenced_at:
            break
        watch.observe(SHOWN[shows], renew.reaper(at))
        # The watch only changes at a listing: checking right before the next one (or
        # at the deadline) covers every instant until then.
        until = min(listings[n + 1][0], fenced_at) if n + 1 < len(listings) else fenced_at
        assert not watch.lapsed(NEW_ITEM, renew.reaper(until)), (at, until, fenced_at)


@given(renews())
def test_the_reap_comes_expire_after_from_the_first_of_the_last_listings_showing_it(renew):
    """Not put off for ever either: when the last listings show beat 4, the session
    lapses ``expire_after`` on the reaper's clock after the first of them."""
    listings = renew.listings
    if not listings or listings[-1][1] != NEW:
        return
    first = len(listings) - 1
    while first > 0 and listings[first - 1][1] == NEW:
        first -= 1
    watch = SessionWatch(renew.timing)
    for at, shows in listings:
        watch.observe(SHOWN[shows], renew.reaper(at))
    since = renew.reaper(listings[first][0])
    expire_after = renew.timing.expire_after
    assert watch.lapsed(NEW_ITEM, since + expire_after + TINY)
    assert not watch.lapsed(NEW_ITEM, since + expire_after - TINY)
    assert not watch.lapsed(OLD_ITEM, since + 10 * renew.timing.lease)  # beat 3: never


def _lapses_at(
    listings: list[tuple[float, list[SessionItem]]], session: SessionItem, at: float
) -> bool:
    """Whether the watch fed every listing answered by ``at`` finds ``session`` lapsed."""
    return watched(*[(t, sessions) for t, sessions in listings if t <= at]).lapsed(session, at)


@given(
    beats=st.lists(
        st.tuples(st.floats(min_value=0, max_value=20), st.one_of(st.none(), st.integers(0, 3))),
        min_size=1,
        max_size=10,
    ),
    inserted=st.tuples(
        st.floats(min_value=0, max_value=20), st.one_of(st.none(), st.integers(0, 2))
    ),
)
def test_a_stale_or_missing_listing_never_brings_a_reap_forward(beats, inserted):
    """Whatever the listings, one more that shows an older beat than the newest (or
    not the session at all) never makes the newest beat lapse any sooner."""

    def listing(beat: int | None) -> list[SessionItem]:
        return [] if beat is None else [item(beat=beat)]

    base = sorted(((t, listing(beat)) for t, beat in beats), key=lambda x: x[0])
    newest = item(beat=3)
    with_stale = sorted([*base, (inserted[0], listing(inserted[1]))], key=lambda x: x[0])
    instants = (
        {t for t, _ in with_stale}
        | {t + E for t, _ in with_stale}
        | {t + E + TINY for t, _ in with_stale}
    )
    for at in sorted(instants):
        if _lapses_at(with_stale, newest, at):
            assert _lapses_at(base, newest, at), at
