"""How busy the host's CPUs were while this process measured something: the cores that other
processes kept busy over the same interval.

A matmul peak measured while other processes hold the cores reads low, and every MFU divided
by it reads high (``mfu.py``). The load average is no measure of that: it lags by a minute
and counts this process's own threads. ``/proc/stat`` counts every core's busy time (steal
time included: a virtual machine's neighbours take cores too); minus this process's own CPU
time over the same interval, what remains is the other processes' share. Where
``/proc/stat`` is missing (not Linux) the other processes' share is unknown (``None``).
"""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = ["CpuLoad", "CpuLoadMeter", "parse_proc_stat"]

_PROC_STAT = Path("/proc/stat")


def parse_proc_stat(text: str) -> float | None:
    """Busy CPU seconds of all cores from ``/proc/stat``'s text: user, nice, system, irq,
    softirq and steal (not idle, not iowait); None when the first line is not the ``cpu``
    total."""
    fields = text.split("\n", 1)[0].split()
    if not fields or fields[0] != "cpu" or len(fields) < 9:
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(v) for v in fields[1:9])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def _busy_seconds() -> float | None:
    try:
        return parse_proc_stat(_PROC_STAT.read_text())
    except (OSError, ValueError):
        return None


def _own_seconds() -> float:
    times = os.times()  # every thread of this process (the matmul thread pool included)
    return times.user + times.system


@dataclass(frozen=True)
class CpuLoad:
    """The CPU use over one interval, in cores (CPU seconds per second of wall time).

    ``other_cores`` is None where the host's total is unknown; ``host`` tells apart the
    ranks of a job that share a host (whose own use is not "other" to each other)."""

    other_cores: float | None
    own_cores: float
    cores: int
    host: str

    def record(self) -> dict:
        return {"other_cpu_cores": (None if self.other_cores is None
                                    else round(self.other_cores, 3)),
                "own_cpu_cores": round(self.own_cores, 3), "cores": self.cores,
                "host": self.host}


class CpuLoadMeter:
    """``with CpuLoadMeter() as meter: ...`` then ``meter.load``: the host's CPU use by other
    processes while the block ran."""

    load: CpuLoad | None = None

    def __enter__(self) -> CpuLoadMeter:
        self._start = (time.perf_counter(), _busy_seconds(), _own_seconds())
        return self

    def __exit__(self, *exc) -> None:
        wall0, busy0, own0 = self._start
        wall = max(time.perf_counter() - wall0, 1e-9)
        busy1, own = _busy_seconds(), (_own_seconds() - own0) / wall
        other = (None if busy0 is None or busy1 is None
                 else max(0.0, (busy1 - busy0) / wall - own))
        self.load = CpuLoad(other, own, os.cpu_count() or 1, socket.gethostname())
