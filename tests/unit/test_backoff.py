import itertools
import random

import pytest

from wsfleet.backoff import backoff_delays, jittered


@pytest.mark.parametrize("draw", [0.0, 0.5, 0.999])
def test_backoff_doubles_up_to_the_cap_with_half_kept(draw):
    delays = list(itertools.islice(backoff_delays(initial=1, maximum=8, rng=lambda: draw), 6))
    caps = [1, 2, 4, 8, 8, 8]
    for delay, cap in zip(delays, caps, strict=True):
        assert cap / 2 <= delay <= cap
        assert delay == pytest.approx(cap * (0.5 + 0.5 * draw))


def test_backoff_spreads_with_a_real_random_source():
    rng = random.Random(7)
    firsts = {next(backoff_delays(initial=1, maximum=1, rng=rng.random)) for _ in range(50)}
    assert len(firsts) == 50
    assert all(0.5 <= d <= 1 for d in firsts)


@pytest.mark.parametrize(
    ("initial", "maximum", "factor"), [(0, 1, 2), (2, 1, 2), (1, 2, 0.5), (-1, 2, 2)]
)
def test_backoff_refuses_nonsense(initial, maximum, factor):
    with pytest.raises(ValueError, match="initial"):
        next(backoff_delays(initial=initial, maximum=maximum, factor=factor, rng=random.random))


@pytest.mark.parametrize(("draw", "expected"), [(0.0, 4.0), (0.5, 5.0), (1.0, 6.0)])
def test_jitter_bounds(draw, expected):
    assert jittered(5.0, 0.2, lambda: draw) == pytest.approx(expected)
