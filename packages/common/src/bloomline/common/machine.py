"""What machine this is, in the words a person reads: for figures that depend on it (the MFU
peak's cache key, benchmark result headers), and what it has left (memory, disk) for a job
that sizes its arrays before allocating them."""

from __future__ import annotations

import os
import platform
import shutil
from pathlib import Path

__all__ = ["available_memory", "cpu_model", "format_bytes", "free_disk", "memory_limit"]


def cpu_model() -> str:
    """The CPU's ``model name`` from ``/proc/cpuinfo`` (the processor name string); elsewhere
    what ``platform`` knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def available_memory() -> int | None:
    """Bytes of memory a new allocation can get without swapping (``MemAvailable`` of
    ``/proc/meminfo``); None where the system does not say."""
    return _meminfo("MemAvailable:")


def memory_limit() -> int | None:
    """The most memory this process can ever have: the machine's (``MemTotal``) or its
    container's limit (cgroup v2, else v1), whichever is smaller; None when neither is known.
    For "can never fit" refusals; ``available_memory`` is what is free now."""
    known = [m for m in (_meminfo("MemTotal:"), _cgroup_limit()) if m]
    return min(known) if known else None


def _meminfo(field: str) -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith(field):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _cgroup_limit() -> int | None:
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = Path(path).read_text().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < 2**60:  # v1 writes its "no limit" as ~2**63
            return int(text)
    return None


def free_disk(path: str | os.PathLike) -> int | None:
    """Bytes free to this user on the filesystem of ``path``, or of its nearest existing
    parent (a folder about to be created); None where it cannot be told."""
    path = Path(path).absolute()
    for folder in (path, *path.parents):
        try:
            return shutil.disk_usage(folder).free
        except FileNotFoundError:
            continue
        except OSError:
            return None
    return None


def format_bytes(count: float) -> str:
    """``1.5 GiB``: bytes in binary units, for messages."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(count) < 1024 or unit == "TiB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024
    raise AssertionError("unreachable")
