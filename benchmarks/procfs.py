"""CPU time and memory of a process, read from Linux ``/proc`` (no psutil)."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

_TICKS_PER_SECOND = os.sysconf("SC_CLK_TCK")


class ProcessGoneError(RuntimeError):
    """The process has exited (its ``/proc`` entry is gone)."""


def cpu_seconds(pid: int) -> float:
    """User + system CPU time the process has used so far, in seconds."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError as error:
        raise ProcessGoneError(f"process {pid} is gone") from error
    # The command name (field 2) is in parentheses and may hold spaces: split after it.
    fields = raw[raw.rindex(")") + 2 :].split()
    # Fields 14 and 15 of stat(5) (utime, stime) are at 11 and 12 after the name.
    return (int(fields[11]) + int(fields[12])) / _TICKS_PER_SECOND


def rss_bytes(pid: int) -> int:
    """Resident set size of the process in bytes (``VmRSS``)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError as error:
        raise ProcessGoneError(f"process {pid} is gone") from error
    for line in status.splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise ProcessGoneError(f"process {pid} has no VmRSS (a zombie?)")


@dataclass(frozen=True, slots=True)
class CpuSample:
    """CPU time of one process at one wall-clock instant (monotonic seconds)."""

    pid: int
    at: float
    cpu: float

    @classmethod
    def take(cls, pid: int) -> CpuSample:
        return cls(pid, time.monotonic(), cpu_seconds(pid))

    def percent_until(self, later: CpuSample) -> float:
        """CPU use between two samples of the same process, in percent of one core."""
        if later.pid != self.pid:
            raise ValueError("samples of two different processes")
        elapsed = later.at - self.at
        return 100.0 * (later.cpu - self.cpu) / elapsed if elapsed > 0 else 0.0


@dataclass(frozen=True, slots=True)
class SystemCpuSample:
    """Busy and total CPU time of the whole machine (all cores), from ``/proc/stat``."""

    busy: float
    total: float

    @classmethod
    def take(cls) -> SystemCpuSample:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        # user nice system idle iowait irq softirq steal (guest time is inside user).
        idle = fields[3] + fields[4]
        total = sum(fields[:8])
        return cls((total - idle) / _TICKS_PER_SECOND, total / _TICKS_PER_SECOND)

    def busy_percent_until(self, later: SystemCpuSample) -> float:
        """Share of all cores' time spent busy between two samples, in percent."""
        total = later.total - self.total
        return 100.0 * (later.busy - self.busy) / total if total > 0 else 0.0
