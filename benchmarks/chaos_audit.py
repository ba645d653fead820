"""What the chaos run checks and reports, as pure functions over delivery records and
the faults it applied (nothing here reads a clock, a file or the network).

The safety checks themselves (stale epochs, lost seqs, duplicate counts) are
:mod:`local_stack.audit`; this module adds the liveness figures (how long a started
connection went unhandled) and the explanation of each duplicate delivery.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Final

from benchmarks.chaos_plan import FAULT_KINDS, TARGETED, Options, PlannedConnection
from benchmarks.report import table
from local_stack.audit import (
    Record,
    by_connection,
    duplicate_count,
    lost_seqs,
    stale_deliveries,
)

NO_FAULT = "no fault on that worker (lease lost or fenced under load)"


@dataclass(frozen=True, slots=True)
class Fault:
    """One fault the run applied. Times are epoch seconds; ``end`` is when it was
    undone (SIGCONT, heal), None for instantaneous ones (signals that end a process)."""

    kind: str
    worker: str | None
    start: float
    end: float | None = None
    detail: str = ""


@dataclass(frozen=True, slots=True)
class Gap:
    """The longest time one connection went unhandled, and where it was."""

    connection_id: str
    seconds: float
    where: str
    """``start`` (start call to first delivery), ``between`` (two deliveries) or
    ``tail`` (last delivery to the end of the measurement)."""
    at: float
    """Epoch seconds at which the gap began."""


def longest_gaps(
    records: Iterable[Record], started_at: Mapping[str, float], until: float
) -> dict[str, Gap]:
    """Per started connection, its longest unhandled stretch: from the start call to
    the first delivery, between consecutive deliveries, and from the last delivery to
    ``until``. A connection with no delivery at all is unhandled from start to ``until``."""
    grouped = by_connection(records)
    gaps: dict[str, Gap] = {}
    for cid, start in started_at.items():
        times = [r.t for r in grouped.get(cid, [])]
        best = Gap(cid, (times[0] if times else until) - start, "start", start)
        for before, after in itertools.pairwise(times):
            if after - before > best.seconds:
                best = Gap(cid, after - before, "between", before)
        if times and until - times[-1] > best.seconds:
            best = Gap(cid, until - times[-1], "tail", times[-1])
        gaps[cid] = best
    return gaps


def worst(gaps: Iterable[Gap]) -> Gap | None:
    """The longest of ``gaps`` (None if there are none)."""
    return max(gaps, key=lambda g: g.seconds, default=None)


def stuck(records: Iterable[Record], connection_ids: Iterable[str], since: float) -> list[str]:
    """Connections with no delivery at or after ``since``."""
    recent = {r.connection_id for r in records if r.t >= since}
    return sorted(cid for cid in connection_ids if cid not in recent)


@dataclass(frozen=True, slots=True)
class DuplicateCause:
    cause: str
    deliveries: int
    """Deliveries beyond the first of their seq, blamed on this cause."""
    handovers: int
    """Distinct (connection, epoch) whose messages the next owner delivered again."""
    max_per_handover: int
    same_epoch: int
    """Duplicates delivered under the same epoch as the original (a resume that went
    back before the in-memory checkpoint): expected to be 0."""


def explain_duplicates(
    records: Iterable[Record], faults: Sequence[Fault], lease_seconds: float
) -> list[DuplicateCause]:
    """Blame every duplicate delivery on what ended the epoch of the copy before it.

    A duplicate is any successful delivery of a (connection, seq) after its first. The
    copy before it was handled by worker W under epoch e; the next owner resumed from
    the last checkpoint that reached DynamoDB, so W's epoch ended without its final
    checkpoint. The cause is the first fault aimed at W (scale-out starts a worker and
    is never a cause) that started at most one lease before that copy (a partition or
    pause may begin a little before the last messages W handled, up to its fence
    deadline) and before the duplicate. A message handed over several times in a row
    is blamed on each handover in turn.
    """
    per_worker: dict[str | None, list[Fault]] = defaultdict(list)
    for fault in sorted(faults, key=lambda f: f.start):
        if fault.kind in TARGETED:
            per_worker[fault.worker].append(fault)
    copies: dict[tuple[str, int], list[Record]] = defaultdict(list)
    for record in records:
        if not record.failed:
            copies[(record.connection_id, record.seq)].append(record)
    deliveries: Counter[str] = Counter()
    same_epoch: Counter[str] = Counter()
    per_handover: dict[str, Counter[tuple[str, int]]] = defaultdict(Counter)
    for (cid, _), found in copies.items():
        if len(found) < 2:
            continue
        found.sort(key=lambda r: r.t)
        for before, again in itertools.pairwise(found):
            cause = _cause(per_worker.get(before.worker, []), before, again, lease_seconds)
            deliveries[cause] += 1
            per_handover[cause][(cid, before.epoch)] += 1
            if again.epoch == before.epoch:
                same_epoch[cause] += 1
    return [
        DuplicateCause(
            cause=cause,
            deliveries=count,
            handovers=len(per_handover[cause]),
            max_per_handover=max(per_handover[cause].values()),
            same_epoch=same_epoch[cause],
        )
        for cause, count in deliveries.most_common()
    ]


def _cause(faults: Sequence[Fault], original: Record, again: Record, lease: float) -> str:
    for fault in faults:
        if original.t - lease <= fault.start <= again.t:
            return fault.kind
    return NO_FAULT


def fault_counts(faults: Iterable[Fault]) -> dict[str, int]:
    """How many faults of each kind were applied."""
    return dict(Counter(f.kind for f in faults))


@dataclass
class Outcome:
    """What the run observed while applying faults."""

    faults: list[Fault] = field(default_factory=list)
    skipped: Counter[str] = field(default_factory=Counter)
    """Planned faults not applied, by kind (no eligible target, fleet at its limit)."""
    unexpected_exits: list[str] = field(default_factory=list)
    unclean_exits: list[str] = field(default_factory=list)


BALANCE_RATIO: Final = 1.10
"""After the faults, the busiest worker may run at most this much more than the mean."""
BALANCE_WITHIN_S: Final = 60.0
"""...within this many seconds of the last fault's end."""


@dataclass(frozen=True, slots=True)
class Balance:
    """How the connections spread over the live workers after the faults."""

    seconds: float | None
    """From the end of the last fault to the first balanced sight; None: not within
    :data:`BALANCE_WITHIN_S`."""
    loads: dict[str, int]
    """Connections per live worker at that sight (or at the deadline)."""

    @property
    def max_over_mean(self) -> float:
        counts = list(self.loads.values())
        mean = sum(counts) / len(counts) if counts else 0.0
        return max(counts) / mean if mean else 1.0


def is_balanced(loads: Mapping[str, int]) -> bool:
    """``max <= ceil(1.10 x mean)`` over the live workers: the target's ratio in whole
    connections (12 connections on 3 workers may be 5/4/3: 5 is the nearest whole
    number to 1.10 x 4)."""
    counts = list(loads.values())
    if not counts:
        return False
    mean = sum(counts) / len(counts)
    return max(counts) <= math.ceil(round(BALANCE_RATIO * mean, 9))


def audit(
    *,
    options: Options,
    records: list[Record],
    planned: list[PlannedConnection],
    started_at: dict[str, float],
    settle_since: float,
    measured_until: float,
    outcome: Outcome,
    held: list[str],
    connection_endings: dict[str, int],
    balance: Balance | None = None,
) -> dict[str, Any]:
    """Every check and figure of the run, as one JSON-ready dict; ``violations`` lists
    the failed checks (empty: the run passed)."""
    stale = stale_deliveries(records)
    lost = lost_seqs(records)
    duplicates = duplicate_count(records)
    ids = [p.connection_id for p in planned]
    stuck_ids = stuck(records, ids, settle_since)
    gaps = longest_gaps(records, started_at, measured_until)
    faulted = {p.connection_id for p in planned if p.upstream_fault}
    worst_clean = worst(g for cid, g in gaps.items() if cid not in faulted)
    worst_faulted = worst(g for cid, g in gaps.items() if cid in faulted)
    first_at: dict[str, float] = {}
    for r in records:
        first_at[r.connection_id] = min(r.t, first_at.get(r.connection_id, r.t))
    worst_start = worst(
        Gap(cid, first_at[cid] - t, "start", t) for cid, t in started_at.items() if cid in first_at
    )
    causes = explain_duplicates(records, outcome.faults, options.lease_seconds)
    epochs = {(r.connection_id, r.epoch) for r in records}
    lost_total = sum(len(v) for v in lost.values())
    violations = []
    if stale:
        violations.append(f"{len(stale)} deliveries under a superseded epoch")
    if lost_total:
        violations.append(f"{lost_total} lost seqs on {len(lost)} connections")
    if stuck_ids:
        violations.append(
            f"{len(stuck_ids)} connections not handled after the faults: {stuck_ids[:5]}"
        )
    if outcome.unexpected_exits:
        violations.append(f"workers exited on their own: {outcome.unexpected_exits}")
    if outcome.unclean_exits:
        violations.append(f"SIGTERM without status 0: {outcome.unclean_exits}")
    if held:
        violations.append(f"{len(held)} leases held after the final shutdown: {held[:5]}")
    if balance is not None and balance.seconds is None:
        violations.append(f"not balanced {BALANCE_WITHIN_S:g} s after the faults: {balance.loads}")

    def gap_json(gap: Gap | None) -> dict[str, Any] | None:
        if gap is None:
            return None
        return {
            "connection_id": gap.connection_id,
            "seconds": round(gap.seconds, 3),
            "where": gap.where,
        }

    return {
        "options": {
            "duration_s": options.duration,
            "seed": options.seed,
            "workers": options.workers,
            "connections": options.connections,
            "lease_s": options.lease_seconds,
            "rate_per_connection": options.rate,
            "upstream_faulted_connections": len(faulted),
        },
        "deliveries": len(records),
        "epochs": len(epochs),
        "takeovers": len(epochs) - len({cid for cid, _ in epochs}),
        "stale_deliveries": len(stale),
        "lost_seqs": lost_total,
        "stuck_connections": len(stuck_ids),
        "duplicates": sum(duplicates.values()),
        "duplicates_by_cause": [asdict(c) for c in causes],
        "longest_unhandled": gap_json(worst(gaps.values())),
        "longest_unhandled_clean": gap_json(worst_clean),
        "longest_unhandled_upstream_faulted": gap_json(worst_faulted),
        "longest_start_to_first_delivery": gap_json(worst_start),
        "faults_applied": fault_counts(outcome.faults),
        "faults_skipped": dict(outcome.skipped),
        "fault_log": [
            {
                "kind": f.kind,
                "worker": f.worker,
                "start": round(f.start, 3),
                "end": round(f.end, 3) if f.end else None,
                "detail": f.detail,
            }
            for f in outcome.faults
        ],
        "connection_endings": connection_endings,
        "unexpected_exits": outcome.unexpected_exits,
        "unclean_exits": outcome.unclean_exits,
        "leases_held_after_shutdown": len(held),
        "balance": None
        if balance is None
        else {
            "seconds_after_faults": None if balance.seconds is None else round(balance.seconds, 2),
            "max_over_mean": round(balance.max_over_mean, 3),
            "loads": balance.loads,
        },
        "violations": violations,
    }


def render(result: dict[str, Any]) -> str:
    """The readable summary of :func:`audit`'s result."""
    o = result["options"]
    lines = [
        f"chaos run: {o['duration_s']:g} s, seed {o['seed']}, {o['workers']} workers, "
        f"{o['connections']} connections ({o['upstream_faulted_connections']} with upstream "
        f"faults) at {o['rate_per_connection']:g} msg/s, lease {o['lease_s']:g} s",
        "",
        "faults applied",
        table(
            ["kind", "applied", "skipped (no eligible target)"],
            [
                [k, result["faults_applied"].get(k, 0), result["faults_skipped"].get(k, 0)]
                for k in FAULT_KINDS
            ],
        ),
        "",
    ]

    def gap(key: str) -> str:
        g = result[key]
        return "n/a" if g is None else f"{g['seconds']:.2f} s ({g['connection_id']}, {g['where']})"

    checks = [
        ["deliveries under a superseded epoch", result["stale_deliveries"], "must be 0"],
        ["lost seqs", result["lost_seqs"], "must be 0"],
        ["connections stuck after the faults", result["stuck_connections"], "must be 0"],
        ["workers that exited on their own", len(result["unexpected_exits"]), "must be 0"],
        ["SIGTERMs without exit status 0", len(result["unclean_exits"]), "must be 0"],
        ["leases held after the final shutdown", result["leases_held_after_shutdown"], "must be 0"],
        ["duplicate deliveries", result["duplicates"], "allowed (see below)"],
        ["deliveries", result["deliveries"], ""],
        ["takeovers (new epochs after the first)", result["takeovers"], ""],
        ["longest unhandled, any connection", gap("longest_unhandled"), ""],
        ["longest unhandled, clean upstream", gap("longest_unhandled_clean"), ""],
        ["longest unhandled, faulty upstream", gap("longest_unhandled_upstream_faulted"), ""],
        ["longest start to first delivery", gap("longest_start_to_first_delivery"), ""],
    ]
    balance = result.get("balance")
    if balance is not None:
        seconds = balance["seconds_after_faults"]
        checks.append(
            [
                "balanced after the faults (max <= ceil(1.10 x mean))",
                "not reached" if seconds is None else f"{seconds:.1f} s",
                f"within {BALANCE_WITHIN_S:g} s",
            ]
        )
        checks.append(["max / mean connections per worker then", balance["max_over_mean"], ""])
    lines += ["checks", table(["check", "value", "rule"], checks), ""]
    if result["duplicates_by_cause"]:
        lines += [
            "duplicates by cause (messages handled after the last checkpoint that reached "
            "DynamoDB; the next owner resumed from that checkpoint)",
            table(
                ["cause", "deliveries", "handovers", "max per handover", "same epoch"],
                [
                    [
                        c["cause"],
                        c["deliveries"],
                        c["handovers"],
                        c["max_per_handover"],
                        c["same_epoch"],
                    ]
                    for c in result["duplicates_by_cause"]
                ],
            ),
            "",
        ]
    endings_rows = sorted(result["connection_endings"].items())
    if endings_rows:
        lines += ["connection endings on the workers", table(["ending", "count"], endings_rows), ""]
    verdict = result["violations"]
    lines.append(f"violations: {len(verdict)}" + ("" if not verdict else f" {verdict}"))
    return "\n".join(lines)
