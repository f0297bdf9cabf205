"""The machine a benchmark ran on, for its result header, and the load other processes put on it.

A timing means little without the CPU it ran on and the code it ran, so every result file's
first line names both: ``$ .venv/bin/python -m benchmarks.X ARGS   # DATE UTC, at commit C,
N vCPUs MODEL; ...`` (:func:`header_line`). Result files are committed and read elsewhere,
so nothing printed names an absolute path of this machine (:func:`relative`).
:func:`machine_report` adds torch's view of the machine and the busiest other processes, for
the benchmarks that run torch.
"""

from __future__ import annotations

import datetime
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from benchmarks.harness.paths import REPO
from bloomline.common.machine import cpu_model

__all__ = ["REPO", "OtherLoad", "command_line", "cpu_busy_seconds", "cpu_model",
           "descendants_cpu_seconds", "git_commit", "header_line", "load_average",
           "machine_report", "others_line", "relative"]


def git_commit() -> str:
    """``git rev-parse --short HEAD``, with ``+dirty`` when the tree differs from it.

    ``--no-optional-locks``: status must not refresh (write) the index of a shared checkout.
    """
    def git(*args: str) -> str:
        return subprocess.run(["git", "--no-optional-locks", *args], cwd=REPO, text=True,
                              capture_output=True, timeout=30).stdout.strip()
    try:
        commit = git("rev-parse", "--short", "HEAD")
        if not commit:
            return "unknown"
        return commit + ("+dirty" if git("status", "--porcelain") else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def relative(path: str | os.PathLike) -> str:
    """``path`` relative to the repository when under it, else its name alone (a temporary
    folder, say): never an absolute path of this machine."""
    for candidate in (Path(os.path.abspath(path)), Path(path).resolve()):
        if candidate.is_relative_to(REPO):
            return str(candidate.relative_to(REPO))
    return Path(path).name


def command_line(argv: list[str] | None = None) -> str:
    """``$ .venv/bin/python -m benchmarks.X ARGS``: how this run was started (a module of this
    package shown in its ``-m`` form), absolute paths among the arguments shown
    :func:`relative`."""
    def shown(arg: str) -> str:
        option, sep, value = arg.partition("=")
        if sep and option.startswith("-") and os.path.isabs(value):
            return f"{option}={relative(value)}"
        return relative(arg) if os.path.isabs(arg) else arg
    script, *args = sys.argv if argv is None else argv
    shown_script = relative(script)
    if shown_script.startswith("benchmarks/") and shown_script.endswith(".py"):
        shown_script = "-m " + shown_script[:-3].replace("/", ".")
    return " ".join(["$ .venv/bin/python", shown_script, *map(shown, args)])


def header_line(*extras: str, started: float | None = None) -> str:
    """The first line of a result file: :func:`command_line`, then ``# DATE UTC, at commit
    C, N vCPUs MODEL``, then ``extras`` (library versions, ...) and, given the
    ``time.perf_counter()`` of the start, how long the run took; ``;`` between them."""
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    fields = [f"{now}, at commit {git_commit()}, {os.cpu_count()} vCPUs {cpu_model()}",
              *extras]
    if started is not None:
        fields.append(f"run took {time.perf_counter() - started:.0f} s")
    return f"{command_line()}   # " + "; ".join(fields)


def load_average(when: str) -> str:
    """``load average (1, 5, 15 min) WHEN the run: a, b, c``."""
    return (f"load average (1, 5, 15 min) {when} the run: "
            + ", ".join(f"{v:.2f}" for v in os.getloadavg()))


def others_line(cores: float) -> str:
    """The closing line of a result: the cores ``OtherLoad`` saw other processes keep busy,
    flagged when that is enough (a quarter of a core) to make the timings noisy."""
    return (f"other processes kept up to {cores:.2f} cores busy"
            + (" (WARNING: shared machine, timings noisy)" if cores > 0.25 else ""))


def cpu_busy_seconds() -> float:
    """CPU seconds all processes have used so far (user, nice, system, irq, softirq, steal)."""
    with open("/proc/stat") as fh:
        fields = [int(v) for v in fh.readline().split()[1:]]
    return sum(fields[i] for i in (0, 1, 2, 5, 6, 7)) / os.sysconf("SC_CLK_TCK")


def descendants_cpu_seconds() -> float:
    """CPU seconds of this process's live descendants, each with the children it reaped
    (``utime + stime + cutime + cstime`` of ``/proc/PID/stat``). For ``OtherLoad``'s
    ``live_seconds`` where ranks are forked by a server process (``run_distributed``'s
    forkserver, a live child): ``os.times`` counts reaped children only, so neither the server
    nor the ranks it reaps would count as ours."""
    parents: dict[int, list[int]] = {}
    times: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except OSError:  # exited meanwhile
            continue
        parents.setdefault(int(fields[1]), []).append(int(entry))
        times[int(entry)] = sum(int(v) for v in fields[11:15])
    total, todo = 0, list(parents.get(os.getpid(), []))
    while todo:
        pid = todo.pop()
        total += times.get(pid, 0)
        todo.extend(parents.get(pid, []))
    return total / os.sysconf("SC_CLK_TCK")


class OtherLoad:
    """Cores other processes kept busy between start() and cores(), and the CPU seconds of
    ours meanwhile (own_cpu()).

    Ours: this process and its reaped children (``os.times``), plus ``live_seconds()``: the
    CPU seconds of live processes of the benchmark that ``os.times`` does not count yet (a
    pool of limit processes, a Ray cluster's).
    """

    def __init__(self, live_seconds: Callable[[], float] | None = None) -> None:
        self.live_seconds = live_seconds

    def _own(self) -> float:
        t = os.times()
        live = self.live_seconds() if self.live_seconds is not None else 0.0
        return t.user + t.system + t.children_user + t.children_system + live

    def start(self) -> OtherLoad:
        self.wall, self.busy, self.own = time.perf_counter(), cpu_busy_seconds(), self._own()
        return self

    def own_cpu(self) -> float:
        """CPU seconds of our processes since start()."""
        return self._own() - self.own

    def cores(self) -> float:
        """Cores other processes kept busy since start(), on average."""
        wall = time.perf_counter() - self.wall
        other = (cpu_busy_seconds() - self.busy) - (self._own() - self.own)
        return max(other, 0.0) / max(wall, 1e-9)


def machine_report(*extras: str, header: bool = True) -> str:
    """The result header (:func:`header_line`: command, date, commit, CPU model, then torch's
    version and ``extras``; left out with ``header=False``, for a caller that writes its own),
    the load before the run and the busiest other processes."""
    import torch  # only the torch benchmarks call this; the dataprep ones run without torch

    lines = [header_line(f"torch {torch.__version__}", *extras)] if header else []
    lines.append(f"{load_average('before')}; os.cpu_count() = {os.cpu_count()}, torch threads "
                 f"= {torch.get_num_threads()}, CPU capability "
                 f"{torch.backends.cpu.get_cpu_capability()}")
    try:
        top = subprocess.run(["top", "-bn1", "-w", "120"], capture_output=True, text=True,
                             timeout=10).stdout.splitlines()
        busy = [line for line in top[7:] if line.split() and _cpu_of(line) >= 5.0
                and line.split()[0] != str(os.getpid())]
        lines.append("top -bn1, processes above 5% CPU: " +
                     ("; ".join(" ".join(line.split()[i] for i in (0, 8, 11)) for line in busy[:5])
                      or "none"))
    except (OSError, subprocess.SubprocessError):
        pass
    return "\n".join(lines)


def _cpu_of(line: str) -> float:
    try:
        return float(line.split()[8])
    except (IndexError, ValueError):
        return 0.0
