"""Retry timing as pure functions: callers pass the random source in."""

from __future__ import annotations

from collections.abc import Callable, Iterator


def backoff_delays(
    *,
    initial: float = 0.5,
    maximum: float = 30.0,
    factor: float = 2.0,
    rng: Callable[[], float],
) -> Iterator[float]:
    """Exponential backoff with jitter, forever: attempt ``n`` waits a random time in
    ``[cap/2, cap]`` where ``cap = min(maximum, initial * factor**n)``.

    Half the cap is kept so a fleet that lost one upstream at the same instant
    spreads its reconnects without any of them retrying at once.
    """
    if initial <= 0 or maximum < initial or factor < 1:
        raise ValueError("need 0 < initial <= maximum and factor >= 1")
    cap = initial
    while True:
        yield cap * (0.5 + 0.5 * rng())
        cap = min(maximum, cap * factor)


def jittered(interval: float, fraction: float, rng: Callable[[], float]) -> float:
    """``interval`` moved by up to ``+-fraction`` of itself, uniformly."""
    return interval * (1.0 + fraction * (2.0 * rng() - 1.0))
