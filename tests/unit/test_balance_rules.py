"""The balance rules as tables: fair shares, room to take, each worker's moves of a
round, the drain of a worker that shuts down, and whole fleets run round after round
(every worker planning from the same listing, all plans applied, then listed again)
until nothing moves.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterable, Mapping
from fractions import Fraction

import pytest

from wsfleet import schema
from wsfleet.balance_rules import (
    BalanceSettings,
    Load,
    fair_shares,
    imbalance,
    loads_of,
    plan_moves,
    room_to_take,
)
from wsfleet.session_rules import SessionItem

SETTINGS = BalanceSettings()  # tolerance 0.05, move_fraction 0.1


def fleet(*rows: tuple[str, int, int]) -> list[Load]:
    """``(key, connections, capacity)`` rows."""
    return [Load(key, connections, capacity) for key, connections, capacity in rows]


def plans(loads: list[Load], settings: BalanceSettings = SETTINGS) -> dict[str, dict[str, int]]:
    """Every worker's plan from the same listing (the empty ones left out)."""
    every = {load.key: plan_moves(load.key, loads, settings) for load in loads}
    return {key: plan for key, plan in every.items() if plan}


def apply(loads: list[Load], every: Mapping[str, Mapping[str, int]]) -> list[Load]:
    moved = {load.key: load.connections for load in loads}
    for giver, row in every.items():
        for receiver, count in row.items():
            moved[giver] -= count
            moved[receiver] += count
    return [Load(load.key, moved[load.key], load.capacity) for load in loads]


def counts(loads: Iterable[Load]) -> dict[str, int]:
    return {load.key: load.connections for load in loads}


def moved_in(every: Mapping[str, Mapping[str, int]]) -> int:
    return sum(sum(row.values()) for row in every.values())


def run(
    loads: list[Load], settings: BalanceSettings = SETTINGS, max_rounds: int = 200
) -> tuple[list[Load], list[int]]:
    """Rounds until one moves nothing: the final loads and what each round moved."""
    rounds: list[int] = []
    for _ in range(max_rounds):
        every = plans(loads, settings)
        if not every:
            return loads, rounds
        rounds.append(moved_in(every))
        loads = apply(loads, every)
    raise AssertionError(f"still moving after {max_rounds} rounds: {counts(loads)}")


# --- settings and loads ------------------------------------------------------------------


def test_the_default_settings():
    assert BalanceSettings() == BalanceSettings(
        tolerance=0.05, move_fraction=0.10, round_seconds=5.0
    )


@pytest.mark.parametrize(
    "fields",
    [
        {"tolerance": -0.01},
        {"tolerance": float("nan")},
        {"tolerance": float("inf")},
        {"move_fraction": 0.0},
        {"move_fraction": -0.1},
        {"move_fraction": 1.01},
        {"move_fraction": float("nan")},
        {"round_seconds": 0.0},
        {"round_seconds": -5.0},
        {"round_seconds": float("inf")},
        {"round_seconds": float("nan")},
    ],
)
def test_invalid_settings_raise(fields):
    with pytest.raises(ValueError, match=next(iter(fields))):
        BalanceSettings(**fields)


@pytest.mark.parametrize(
    "fields",
    [{"tolerance": 0.0}, {"move_fraction": 1.0}, {"move_fraction": 0.001}, {"round_seconds": 0.1}],
)
def test_settings_at_their_bounds_are_valid(fields):
    BalanceSettings(**fields)


@pytest.mark.parametrize(
    ("connections", "capacity", "field"),
    [(-1, 500, "connections"), (0, -1, "capacity")],
)
def test_a_negative_load_raises(connections, capacity, field):
    with pytest.raises(ValueError, match=field):
        Load("w1#1", connections, capacity)


@pytest.mark.parametrize(
    "call",
    [
        lambda loads: fair_shares(loads),
        lambda loads: room_to_take("w1#1", loads),
        lambda loads: plan_moves("w1#1", loads, SETTINGS),
    ],
)
def test_two_loads_under_one_key_raise(call):
    with pytest.raises(ValueError, match="w1#1"):
        call(fleet(("w1#1", 10, 500), ("w2#1", 0, 500), ("w1#1", 20, 500)))


@pytest.mark.parametrize(
    "call", [lambda loads: fair_shares(loads, -1), lambda loads: room_to_take("a", loads, -1)]
)
def test_a_negative_unowned_count_raises(call):
    with pytest.raises(ValueError, match="unowned"):
        call(fleet(("a", 10, 500)))


def session(worker: str, gen: int, state: str, connections: int, capacity: int) -> SessionItem:
    return SessionItem(
        worker_id=worker,
        session_gen=gen,
        state=state,
        expires_at_ms=1_000_000,
        connections=connections,
        capacity=capacity,
    )


def test_loads_of_lists_the_live_sessions_in_key_order():
    sessions = [
        session("w2", 1, schema.ALIVE, 30, 500),
        session("w1", 4, schema.ALIVE, 0, 0),  # draining, still alive: listed
        session("w1", 3, schema.DEAD, 200, 500),  # reaped: its connections are nobody's
        session("w3", 12, schema.ALIVE, 7, 250),
    ]
    assert loads_of(iter(sessions)) == [
        Load("w1#4", 0, 0),
        Load("w2#1", 30, 500),
        Load("w3#12", 7, 250),
    ]


def test_loads_of_nothing_is_empty():
    assert loads_of([]) == []


# --- fair shares ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("rows", "unowned", "shares"),
    [
        # equal capacities: equal shares
        ([("a", 400, 500), ("b", 400, 500), ("c", 0, 500), ("d", 0, 500)], 0,
         {"a": 200.0, "b": 200.0, "c": 200.0, "d": 200.0}),
        # heterogeneous capacities: in proportion
        ([("big", 0, 1000), ("s1", 250, 250), ("s2", 250, 250)], 0,
         {"big": 1000 / 3, "s1": 250 / 3, "s2": 250 / 3}),
        ([("big", 400, 1000), ("s1", 250, 250), ("s2", 250, 250)], 300,
         {"big": 800.0, "s1": 200.0, "s2": 200.0}),
        # exactly the fleet's capacity: everyone full
        ([("big", 500, 1000), ("s1", 250, 250), ("s2", 250, 250)], 500,
         {"big": 1000.0, "s1": 250.0, "s2": 250.0}),
        # above the fleet's capacity: capped at capacity, the rest is left
        ([("big", 1200, 1000), ("s1", 250, 250), ("s2", 100, 250)], 0,
         {"big": 1000.0, "s1": 250.0, "s2": 250.0}),
        ([("a", 100, 100), ("b", 50, 100)], 100, {"a": 100.0, "b": 100.0}),
        # the unowned ones count
        ([("a", 100, 500), ("b", 100, 500), ("c", 100, 500), ("d", 100, 500)], 1,
         {"a": 100.25, "b": 100.25, "c": 100.25, "d": 100.25}),
        ([("a", 0, 500), ("b", 0, 100)], 30, {"a": 25.0, "b": 5.0}),
        # a draining worker's connections count, its share is 0
        ([("d", 1000, 0), ("w0", 200, 600), ("w1", 200, 600), ("w2", 200, 600)], 0,
         {"d": 0.0, "w0": 1600 / 3, "w1": 1600 / 3, "w2": 1600 / 3}),
        # nothing to share, or nobody to share it with
        ([("a", 0, 500), ("b", 0, 500)], 0, {"a": 0.0, "b": 0.0}),
        ([("a", 7, 0), ("b", 3, 0)], 5, {"a": 0.0, "b": 0.0}),
        ([], 12, {}),
    ],
)  # fmt: skip
def test_fair_shares(rows, unowned, shares):
    loads = fleet(*rows)
    assert fair_shares(loads, unowned) == shares
    assert list(fair_shares(list(reversed(loads)), unowned)) == sorted(shares)  # key order


def test_fair_shares_of_random_fleets():
    rng = random.Random(7)
    for _ in range(300):
        loads = random_fleet(rng, draining=rng.random() < 0.3)
        unowned = rng.choice([0, 0, 1, 17, 400])
        total = sum(load.connections for load in loads) + unowned
        room = sum(load.capacity for load in loads)
        exact = exact_shares(loads, unowned)
        assert sum(exact.values()) == min(total, room)
        assert all(0 <= exact[load.key] <= load.capacity for load in loads)
        assert fair_shares(loads, unowned) == {key: float(exact[key]) for key in sorted(exact)}


# --- room to take ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("rows", "unowned", "rooms"),
    [
        # 4 x 100 and one unowned: share 100.25 each, every worker may take 1
        ([("a", 100, 500), ("b", 100, 500), ("c", 100, 500), ("d", 100, 500)], 1,
         {"a": 1, "b": 1, "c": 1, "d": 1}),
        # at the share exactly: nothing
        ([("a", 100, 500), ("b", 100, 500)], 0, {"a": 0, "b": 0}),
        # below and above the share (200 each)
        ([("a", 350, 500), ("b", 50, 500)], 0, {"a": 0, "b": 150}),
        ([("a", 350, 500), ("b", 50, 500)], 100, {"a": 0, "b": 200}),
        # a fractional share rounds up: 400 / 3 = 133.33 -> 134
        ([("a", 134, 500), ("b", 133, 500), ("c", 0, 500)], 133,
         {"a": 0, "b": 1, "c": 134}),
        # heterogeneous: up to the share in proportion to capacity
        ([("big", 0, 1000), ("s1", 250, 250), ("s2", 250, 250)], 0,
         {"big": 334, "s1": 0, "s2": 0}),
        # above the fleet's capacity: up to capacity, not beyond
        ([("a", 480, 500), ("b", 90, 100)], 1000, {"a": 20, "b": 10}),
        ([("a", 520, 500), ("b", 100, 100)], 1000, {"a": 0, "b": 0}),
        # a draining worker takes nothing
        ([("a", 0, 0), ("b", 10, 500)], 40, {"a": 0, "b": 40}),
        ([("a", 5, 0), ("b", 0, 500)], 0, {"a": 0, "b": 5}),
    ],
)  # fmt: skip
def test_room_to_take(rows, unowned, rooms):
    loads = fleet(*rows)
    assert {load.key: room_to_take(load.key, loads, unowned) for load in loads} == rooms


def test_an_unlisted_worker_has_no_room():
    assert room_to_take("nobody", fleet(("a", 0, 500)), 100) == 0
    assert room_to_take("nobody", [], 100) == 0


# --- one round's plans ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("rows", "settings", "expected"),
    [
        # two full workers and two new ones: 100 to each receiver... within the cap of
        # 80 (a tenth of 800): 40 from each giver, 20 to each receiver
        ([("a", 400, 500), ("b", 400, 500), ("c", 0, 500), ("d", 0, 500)], SETTINGS,
         {"a": {"c": 20, "d": 20}, "b": {"c": 20, "d": 20}}),
        # the whole excess when the cap allows it
        ([("a", 400, 500), ("b", 400, 500), ("c", 0, 500), ("d", 0, 500)],
         BalanceSettings(move_fraction=1.0),
         {"a": {"c": 100, "d": 100}, "b": {"c": 100, "d": 100}}),
        # heterogeneous: shares 333.33, 83.33, 83.33; the small ones give down to 84
        ([("big", 0, 1000), ("s1", 250, 250), ("s2", 250, 250)], SETTINGS,
         {"s1": {"big": 25}, "s2": {"big": 25}}),
        ([("big", 0, 1000), ("s1", 250, 250), ("s2", 250, 250)],
         BalanceSettings(move_fraction=1.0),
         {"s1": {"big": 166}, "s2": {"big": 166}}),
        # three givers, two receivers (shares 90): the cap of 45 is 15 per giver, the
        # receivers get 23 and 22, and each giver spreads over both
        ([("a", 150, 500), ("b", 150, 500), ("c", 150, 500), ("d", 0, 500), ("e", 0, 500)],
         SETTINGS,
         {"a": {"d": 8, "e": 7}, "b": {"d": 8, "e": 7}, "c": {"d": 7, "e": 8}}),
        # givers in proportion to their excess, receivers to their deficit (shares 100)
        ([("a", 190, 500), ("b", 130, 500), ("c", 40, 500), ("d", 40, 500)],
         BalanceSettings(move_fraction=0.2),
         {"a": {"c": 30, "d": 30}, "b": {"c": 10, "d": 10}}),
        ([("a", 190, 500), ("b", 130, 500), ("c", 20, 500), ("d", 60, 500)],
         BalanceSettings(move_fraction=0.2),
         {"a": {"c": 40, "d": 20}, "b": {"c": 13, "d": 7}}),
        # receivers get no more than up to floor(share): 400 / 3 = 133.33 -> 133, the
        # giver down to ceil(share) = 134 would need 266 out, only 133 + 133 fit...
        ([("a", 400, 500), ("b", 0, 500), ("c", 0, 500)], BalanceSettings(move_fraction=1.0),
         {"a": {"b": 133, "c": 133}}),
        # ...and nothing goes to a worker at floor(share)
        ([("a", 136, 500), ("b", 133, 500), ("c", 131, 500)],
         BalanceSettings(tolerance=0.0, move_fraction=1.0), {"a": {"c": 2}}),
        # a small fleet still moves one a round
        ([("a", 3, 10), ("b", 0, 10)], SETTINGS, {"a": {"b": 1}}),
        # above the fleet's capacity: shares are the capacities; an overfull worker
        # gives to the free capacity that is left
        # (total 1750 of 1500: the cap 175 goes 156 / 19 by deficit)
        ([("a", 1200, 500), ("b", 100, 500), ("c", 450, 500)], SETTINGS,
         {"a": {"b": 156, "c": 19}}),
        ([("a", 1200, 500), ("b", 100, 500), ("c", 450, 500)],
         BalanceSettings(move_fraction=1.0), {"a": {"b": 400, "c": 50}}),
        ([("a", 700, 500), ("b", 500, 500), ("c", 500, 500)], SETTINGS, {}),
    ],
)  # fmt: skip
def test_plans_of_one_round(rows, settings, expected):
    loads = fleet(*rows)
    assert plans(loads, settings) == expected
    assert plans(list(reversed(loads)), settings) == expected  # the listing's order is moot


@pytest.mark.parametrize(
    ("rows", "settings", "expected"),
    [
        # share 200, tolerance 0.05: 210 stays, 211 gives down to 200
        ([("a", 210, 1000), ("b", 190, 1000)], SETTINGS, {}),
        ([("a", 211, 1000), ("b", 189, 1000)], SETTINGS, {"a": {"b": 11}}),
        # share 100, tolerance 0.1: 100 * 1.1 is 110 exactly (in floats, 110.00000000000001)
        ([("a", 110, 1000), ("b", 90, 1000)], BalanceSettings(tolerance=0.1), {}),
        ([("a", 111, 1000), ("b", 89, 1000)], BalanceSettings(tolerance=0.1), {"a": {"b": 11}}),
        # fractional share 133.33: gives above ceil(140) = 140, down to 134
        ([("a", 140, 500), ("b", 130, 500), ("c", 130, 500)], SETTINGS, {}),
        ([("a", 141, 500), ("b", 130, 500), ("c", 129, 500)], SETTINGS,
         {"a": {"b": 3, "c": 4}}),
        # tolerance 0: anything above ceil(share) gives
        ([("a", 201, 1000), ("b", 199, 1000)], BalanceSettings(tolerance=0.0), {"a": {"b": 1}}),
        ([("a", 200, 1000), ("b", 200, 1000)], BalanceSettings(tolerance=0.0), {}),
    ],
)  # fmt: skip
def test_the_tolerance_at_its_boundary(rows, settings, expected):
    assert plans(fleet(*rows), settings) == expected


@pytest.mark.parametrize(
    ("move_fraction", "total", "cap"),
    [(0.1, 800, 80), (0.1, 9, 1), (0.1, 0, 1), (0.29, 100, 29), (0.07, 100, 7), (1.0, 13, 13)],
)
def test_the_round_cap_reads_the_fraction_as_written(move_fraction, total, cap):
    """0.29 * 100 is 28.999999999999996 in floats: the cap is 29."""
    assert BalanceSettings(move_fraction=move_fraction).round_cap(total) == cap


def test_the_round_cap_bounds_what_a_round_moves():
    loads = fleet(("a", 100, 1000), ("b", 0, 1000))  # cap 29 of the 50 the giver is over
    assert plans(loads, BalanceSettings(move_fraction=0.29)) == {"a": {"b": 29}}


def test_an_unlisted_worker_gives_nothing():
    assert plan_moves("nobody", fleet(("a", 400, 500), ("b", 0, 500)), SETTINGS) == {}


@pytest.mark.parametrize(
    "rows",
    [
        [("a", 200, 500), ("b", 200, 500), ("c", 200, 500)],
        [("a", 210, 500), ("b", 195, 500), ("c", 195, 500)],  # at the tolerance exactly
        [("a", 0, 500)],
        [("a", 3, 500)],
        [],
        [("a", 0, 500), ("b", 0, 500)],
        [("a", 1, 500), ("b", 0, 500), ("c", 0, 500)],  # nobody is above ceil(1/3)
        [("a", 334, 1000), ("s1", 83, 250), ("s2", 83, 250)],
        [("a", 500, 500), ("b", 500, 500), ("c", 480, 500)],
    ],
)
def test_a_fleet_within_tolerance_stays_still(rows):
    assert plans(fleet(*rows)) == {}


def test_random_fleets_within_tolerance_stay_still():
    rng = random.Random(11)
    checked = 0
    while checked < 300:
        loads = random_fleet(rng, draining=False)
        settings = random_settings(rng)
        total = sum(load.connections for load in loads)
        room = sum(load.capacity for load in loads)
        if total > room:
            continue
        # Deal the same total again, within the tolerance: floor(share) each, and one
        # more (ceil(share)) to some of those whose share is not whole.
        shares = exact_shares(loads)
        within = [Load(load.key, math.floor(shares[load.key]), load.capacity) for load in loads]
        fractional = [i for i, load in enumerate(loads) if shares[load.key].denominator > 1]
        for i in rng.sample(fractional, total - sum(load.connections for load in within)):
            within[i] = Load(within[i].key, within[i].connections + 1, within[i].capacity)
        assert sum(load.connections for load in within) == total
        assert all(load.connections <= math.ceil(shares[load.key]) for load in within)
        assert plans(within, settings) == {}
        checked += 1


# --- rounds until nothing moves -----------------------------------------------------------


def test_two_full_workers_and_two_new_ones_converge_to_200_each():
    loads, rounds = run(fleet(("a", 400, 500), ("b", 400, 500), ("c", 0, 500), ("d", 0, 500)))
    assert rounds == [80, 80, 80, 80, 80]  # the cap, 80 of 800 a round
    assert sum(rounds) == 400  # 200 out of each old worker, 200 into each new one
    assert counts(loads) == {"a": 200, "b": 200, "c": 200, "d": 200}
    assert imbalance(loads) == 1.0


def test_heterogeneous_capacities_converge_to_the_shares():
    loads, rounds = run(fleet(("big", 0, 1000), ("s1", 250, 250), ("s2", 250, 250)))
    assert rounds == [50, 50, 50, 50, 50, 50, 32]
    # shares 333.33, 83.33, 83.33: the small ones down to ceil(share), the big one takes
    # what they gave (up to 333)
    assert counts(loads) == {"big": 332, "s1": 84, "s2": 84}


def test_a_fleet_above_its_capacity_fills_everyone_to_capacity():
    loads, rounds = run(fleet(("a", 1200, 500), ("b", 100, 500), ("c", 300, 500)))
    assert rounds == [160, 160, 160, 120]  # the cap is a tenth of 1600
    assert counts(loads) == {"a": 600, "b": 500, "c": 500}  # 100 fit nowhere: they stay


def test_one_new_worker_in_a_fleet_of_ten():
    rows = [(f"w{i:02}", 200, 500) for i in range(10)] + [("w10", 0, 500)]
    loads, rounds = run(fleet(*rows))
    # share 181.82: each old worker gives down to 182 (tolerance line 191), the new one
    # gets 180; the round cap of 200 lets it all go in one round
    assert rounds == [180]
    assert counts(loads) == {**{f"w{i:02}": 182 for i in range(10)}, "w10": 180}
    assert imbalance(loads) == 182 * 11 / 2000


def exact_shares(loads: list[Load], unowned: int = 0) -> dict[str, Fraction]:
    """The shares computed apart, in exact fractions."""
    total = sum(load.connections for load in loads) + unowned
    room = sum(load.capacity for load in loads)
    return {load.key: Fraction(load.capacity * min(total, room), room or 1) for load in loads}


def gives_above(share: Fraction, settings: BalanceSettings) -> int:
    return math.ceil(share * (1 + Fraction(str(settings.tolerance))))


def random_fleet(rng: random.Random, *, draining: bool) -> list[Load]:
    loads = []
    for i in range(rng.randint(1, 8)):
        capacity = rng.choice([10, 50, 100, 250, 500, 1000])
        connections = rng.choice([0, rng.randint(0, capacity), capacity, rng.randint(0, 1200)])
        loads.append(Load(f"w{i}#{rng.randint(1, 9)}", connections, capacity))
    if draining:
        for _ in range(rng.randint(1, 2)):
            i = len(loads)
            loads.append(Load(f"w{i}#1", rng.choice([0, 1, 37, 300, 1000]), 0))
    rng.shuffle(loads)
    return loads


def random_settings(rng: random.Random) -> BalanceSettings:
    return BalanceSettings(
        tolerance=rng.choice([0.0, 0.05, 0.1, 0.5]),
        move_fraction=rng.choice([0.01, 0.1, 0.25, 1.0]),
    )


def check_round(before: list[Load], settings: BalanceSettings) -> tuple[list[Load], bool]:
    """Apply every worker's plan from one listing and check the bounds of a round; also
    says whether anything moved."""
    every = plans(before, settings)
    after = apply(before, every)
    shares = exact_shares(before)
    old = counts(before)
    givers = set(every)
    receivers = {receiver for row in every.values() for receiver in row}
    assert not givers & receivers, every
    assert sum(old.values()) == sum(load.connections for load in after)  # total preserved
    assert all(count > 0 for row in every.values() for count in row.values())
    assert exact_shares(after) == shares  # moves leave the shares as they were
    draining = {load.key for load in before if load.capacity == 0}
    assert not receivers & draining
    balance_moved = 0
    for load in after:
        share = shares[load.key]
        if load.key in draining:
            continue
        if load.key in givers:  # down to ceil(share), never below
            assert load.connections >= math.ceil(share), (load, share)
            balance_moved += old[load.key] - load.connections
        elif load.key in receivers:  # never beyond its capacity
            assert load.connections <= load.capacity, (load, share)
            if not draining:  # with no drain, a receiver never passes floor(share)
                assert load.connections <= math.floor(share), (load, share)
    assert balance_moved <= settings.round_cap(sum(old.values()))
    return after, bool(every)


def test_random_fleets_never_overfill_a_receiver_nor_empty_a_giver():
    rng = random.Random(20240611)
    for _ in range(300):
        loads = random_fleet(rng, draining=False)
        settings = random_settings(rng)
        rounds = 0
        while True:
            loads, moved = check_round(loads, settings)
            if not moved:
                break
            rounds += 1
            if rounds == 200:
                raise AssertionError(f"still moving after 200 rounds: {loads}")
        # At rest: no giver above its tolerance line, or no receiver below floor(share).
        shares = exact_shares(loads)
        givers = [
            load.key for load in loads if load.connections > gives_above(shares[load.key], settings)
        ]
        receivers = [load.key for load in loads if load.connections < math.floor(shares[load.key])]
        assert not (givers and receivers), (loads, settings)


# --- draining -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("capacity", "expected"),
    [
        # shares 533.33: 333 below each floor(share), the last one into free capacity
        (600, {"w0": 334, "w1": 333, "w2": 333}),
        # shares 500 (the fleet's capacity, 1500, is below its 1600): 300 each, 100 left
        (500, {"w0": 300, "w1": 300, "w2": 300}),
        # shares 400: only what fits, 600
        (400, {"w0": 200, "w1": 200, "w2": 200}),
    ],
)
def test_a_draining_worker_gives_all_that_fits_at_once(capacity, expected):
    loads = fleet(("d", 1000, 0), *[(f"w{i}", 200, capacity) for i in range(3)])
    assert plans(loads) == {"d": expected}  # not capped by the round's 160


@pytest.mark.parametrize(
    ("rows", "expected"),
    [
        # up to floor(share) first (shares 293.33, 73.33, 73.33: room 193, 53, 53), the
        # one left over by free capacity (1707, 427, 427)
        ([("d", 300, 0), ("big", 100, 2000), ("s1", 20, 500), ("s2", 20, 500)],
         {"d": {"big": 194, "s1": 53, "s2": 53}}),
        # in proportion to the room below the shares (200 and 100 for 100); the balance
        # moves get the rest of that room (133 and 67), within the cap of 60
        ([("d", 100, 0), ("a", 400, 500), ("b", 0, 500), ("c", 100, 500)],
         {"d": {"b": 67, "c": 33}, "a": {"b": 40, "c": 20}}),
        # nothing to a worker above its share while others have room below it
        ([("d", 100, 0), ("a", 300, 500), ("b", 0, 500)], {"d": {"b": 100}, "a": {"b": 40}}),
        # no room below any floor(share) (2/3 each): by free capacity, ties by key
        ([("d", 2, 0), ("a", 0, 3), ("b", 0, 3), ("c", 0, 3)], {"d": {"a": 1, "b": 1}}),
        # a full receiver gets nothing; what fits nowhere is not planned
        ([("d", 100, 0), ("a", 500, 500), ("b", 460, 500)], {"d": {"b": 40}}),
        ([("d", 100, 0), ("a", 500, 500)], {}),
        ([("d", 100, 0)], {}),
        ([("d", 100, 0), ("e", 0, 0)], {}),
        ([("d", 0, 0), ("a", 10, 500)], {}),
        # two draining workers share the room in proportion to their connections
        ([("d1", 300, 0), ("d2", 100, 0), ("a", 100, 300), ("b", 100, 300)],
         {"d1": {"a": 150, "b": 150}, "d2": {"a": 50, "b": 50}}),
        # only 300 of their 400 fit: 225 and 75
        ([("d1", 300, 0), ("d2", 100, 0), ("a", 150, 300), ("b", 150, 300)],
         {"d1": {"a": 113, "b": 112}, "d2": {"a": 37, "b": 38}}),
    ],
)  # fmt: skip
def test_draining_tables(rows, expected):
    assert plans(fleet(*rows)) == expected


def test_a_drain_first_then_the_balance_moves_in_the_room_left():
    """The drain (not capped) takes the room below the shares first; the balance moves
    of a worker above the tolerance get what is left, within the round cap."""
    loads = fleet(("d", 50, 0), ("a", 400, 1000), ("b", 50, 1000), ("c", 0, 1000))
    # total 500, shares 166.67: room below floor(share) 116 + 166 = 282; the drain's 50
    # goes 21 / 29, the balance moves get the rest: the cap of 50, by the deficits left
    # (95 and 137) 20 / 30
    assert plans(loads) == {"d": {"b": 21, "c": 29}, "a": {"b": 20, "c": 30}}


def test_random_drains_place_all_that_fits_and_overfill_nobody():
    rng = random.Random(5)
    for _ in range(400):
        loads = random_fleet(rng, draining=True)
        settings = random_settings(rng)
        every = plans(loads, settings)
        draining = [load for load in loads if load.capacity == 0]
        free = sum(max(0, load.capacity - load.connections) for load in loads)
        drained = sum(sum(every.get(load.key, {}).values()) for load in draining)
        assert drained == min(sum(load.connections for load in draining), free)
        check_round(loads, settings)


# --- workers joining and leaving -----------------------------------------------------------


def test_workers_joining_and_leaving_between_rounds():
    """Each round every worker lists the sessions, takes unowned connections up to its
    room, lists again and moves what its plan says. Between rounds workers join, one
    drains and leaves (what it could not hand off becomes unowned), and one crashes
    (all its connections become unowned)."""
    state = {"a": (500, 500), "b": (300, 500)}  # key -> (connections, capacity)
    unowned = 0

    def listing() -> list[Load]:
        return fleet(*[(key, conns, cap) for key, (conns, cap) in sorted(state.items())])

    def join(key: str, capacity: int) -> Callable[[], int]:
        def event() -> int:
            state[key] = (0, capacity)
            return 0

        return event

    def drain(key: str) -> Callable[[], int]:
        def event() -> int:
            state[key] = (state[key][0], 0)
            return 0

        return event

    def leave(key: str) -> Callable[[], int]:
        return lambda: state.pop(key)[0]

    events = {
        2: join("c", 500),
        4: drain("b"),
        5: leave("b"),
        6: join("d", 1000),
        9: leave("a"),  # a crash: everything it ran is unowned
        10: join("e", 250),
    }
    history = []
    for round_ in range(60):
        if round_ in events:
            unowned += events[round_]()
        total = sum(conns for conns, _ in state.values()) + unowned
        seen = listing()
        for load in seen:
            taken = min(room_to_take(load.key, seen, unowned), unowned)
            conns, cap = state[load.key]
            state[load.key] = (conns + taken, cap)
            unowned -= taken
        before = listing()
        after, _ = check_round(before, SETTINGS)
        state = {load.key: (load.connections, load.capacity) for load in after}
        assert sum(conns for conns, _ in state.values()) + unowned == total
        assert all(conns <= cap for conns, cap in state.values() if cap > 0)
        history.append((round_, counts(after), unowned))
        if round_ > max(events) and not plans(after) and unowned == 0:
            break
    else:
        raise AssertionError(f"still moving: {history[-3:]}")
    assert history == [
        (0, {"a": 420, "b": 380}, 0),  # at a's tolerance line (share 400): still
        (1, {"a": 420, "b": 380}, 0),
        (2, {"a": 374, "b": 346, "c": 80}, 0),  # c joins: the cap, 46 / 34 by excess
        (3, {"a": 328, "b": 312, "c": 160}, 0),
        (4, {"a": 400, "b": 0, "c": 400}, 0),  # b drains: all 312 at once
        (5, {"a": 400, "c": 400}, 0),
        (6, {"a": 360, "c": 360, "d": 80}, 0),  # d joins, twice the capacity
        (7, {"a": 320, "c": 320, "d": 160}, 0),
        (8, {"a": 280, "c": 280, "d": 240}, 0),
        (9, {"c": 280, "d": 520}, 0),  # a crashes: d takes its 280 (room 294)
        (10, {"c": 244, "d": 476, "e": 80}, 0),  # e joins (shares 228.6, 457.1, 114.3)
        (11, {"c": 229, "d": 476, "e": 95}, 0),  # c at ceil(share), d within tolerance
    ]


def test_random_churn_never_overfills_and_settles():
    """Workers join, drain and leave, or crash at random between rounds; every round's
    bounds hold, and once the churn stops the fleet settles."""
    rng = random.Random(99)
    for _ in range(60):
        loads = random_fleet(rng, draining=False)
        settings = random_settings(rng)
        unowned = 0
        joined = len(loads)
        for round_ in range(230):
            churn = round_ < 30
            event = rng.random() if churn else 1.0
            if event < 0.1:  # a worker joins
                joined += 1
                loads = [*loads, Load(f"n{joined:03}#1", 0, rng.choice([50, 250, 500, 1000]))]
            elif event < 0.15 and loads:  # a worker crashes
                gone = rng.choice(loads)
                loads = [load for load in loads if load is not gone]
                unowned += gone.connections
            elif event < 0.2 and loads:  # a worker drains; a drained one leaves
                chosen = rng.choice(loads)
                if chosen.capacity:
                    loads = [
                        load if load is not chosen else Load(load.key, load.connections, 0)
                        for load in loads
                    ]
                else:
                    loads = [load for load in loads if load is not chosen]
                    unowned += chosen.connections
            total = sum(load.connections for load in loads) + unowned
            taken = []
            for load in loads:
                take = min(room_to_take(load.key, loads, unowned), unowned)
                assert take == 0 or load.connections + take <= load.capacity
                unowned -= take
                taken.append(Load(load.key, load.connections + take, load.capacity))
            loads, moved = check_round(taken, settings)
            assert sum(load.connections for load in loads) + unowned == total
            if not churn and not moved:
                break
        else:
            raise AssertionError(f"still moving 200 rounds after the churn: {loads}")
