"""Timing profiles for benchmark workers: the project's defaults against the seed's."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from worker import config as worker_settings


@dataclass(frozen=True, slots=True)
class Profile:
    """A named timing choice for workers: worker variables on top of the deployment's."""

    name: str
    env: Mapping[str, str]


def ours(lease_seconds: float | None) -> Profile:
    """The project's defaults: only the lease is set (nothing at all with ``None``: the
    shipped defaults); heartbeat and reconcile follow it, and a released connection
    is announced with a ``reassign`` message."""
    if lease_seconds is None:
        return Profile("ours", {})
    return Profile("ours", {worker_settings.LEASE_SECONDS: repr(lease_seconds)})


def seed(lease_seconds: float) -> Profile:
    """The seed's timings scaled to ``lease_seconds``: reconcile every 3 x lease (60 s at
    a 20 s lease) and no ``reassign`` message on release."""
    return Profile(
        "seed",
        {
            worker_settings.LEASE_SECONDS: repr(lease_seconds),
            worker_settings.RECONCILE_SECONDS: repr(3 * lease_seconds),
            worker_settings.REASSIGN_ON_RELEASE: "false",
        },
    )
