"""Stragglers named: at every log step the ranks' section times of the interval
(``step_sections.py``) are gathered (one all-gather of a few floats per rank); rank 0 puts
each section's median and maximum into the train record and names each rank that fell behind
the others in a section, with its host and pid, on the console and as a ``straggler`` record.

Who is a straggler (``find_stragglers``). The ranks meet in collectives, so a slow rank makes
the others *wait*, and the wait lands in whatever section holds their next collective: the
fast ranks' backward (where the gradient reduction runs) grows as much as the slow rank's
forward. Comparing section times alone would name the waiters too. What tells them apart is
*when* each rank reaches a section's end: every rank leaves the previous step's verdict (an
all-reduce) together, so the time from there to the end of a section is comparable across
ranks. A rank that falls behind the others during a section did slow work there; a rank that
waits only catches up with the late one and falls behind nobody. So, over an interval, with
A(r, s) the sum of rank r's times in the sections up to s (in ``SECTIONS`` order) and
lateness(r, s) = max(0, A(r, s) - the lower median of A(., s)), rank r is named in section s
when, per step,

- it fell behind in s: lateness(r, s) - lateness(r, s before) >= (factor - 1) x m and
  >= ``monitor.straggler_min_seconds``, and
- its time in s is >= factor x m,

m being the lower median of the ranks' times in s (the lower median: with two ranks the slow
one is compared with the other, not with their mean). Ranks are compared within their
pipeline stage only (stages do different work and finish the schedule at different times): a
stage of one rank is compared with nobody.

What it cannot see: slowness inside a section that also holds the collective the others wait
in (a slow backward under data parallelism, a slow tp rank inside forward): every rank leaves
that section together, so nobody fell behind in it; the step time shows it, not who.
Forward is free of dp collectives in ZeRO-0/1/2 and the buffers engine (not under tp, nor
ZeRO-3's all-gathers), so a slow device is named there by its forward.
"""

from __future__ import annotations

import os
import socket
import statistics
from dataclasses import dataclass

import torch

from bloomline.trainer.reporting.step_sections import JUDGED, SECTIONS, SectionClock

__all__ = ["Straggler", "StragglerWatch", "find_stragglers", "straggler_line"]


@dataclass(frozen=True)
class Straggler:
    """Rank ``rank`` was slow in ``section``: ``seconds`` per step there against its group's
    lower median ``median``, falling ``behind`` seconds per step behind the others."""

    rank: int
    section: str
    seconds: float
    median: float
    behind: float


def find_stragglers(seconds: list[list[float]], groups: list[int], steps: int, factor: float,
                    min_seconds: float) -> list[Straggler]:
    """The stragglers of an interval of ``steps`` steps (the rule: the module docstring).

    Args:
        seconds: Per rank, its seconds per section (``SECTIONS`` order) summed over the
            interval.
        groups: Per rank, what it is compared within (its pipeline stage).
        factor: ``monitor.straggler_factor``; 0: nobody is named.
        min_seconds: ``monitor.straggler_min_seconds``, per step.
    """
    if not factor or steps <= 0:
        return []
    found = []
    for group in sorted(set(groups)):
        ranks = [r for r, g in enumerate(groups) if g == group]
        if len(ranks) < 2:
            continue
        arrived = {r: 0.0 for r in ranks}
        late_before = {r: 0.0 for r in ranks}
        for index, name in enumerate(SECTIONS):
            for r in ranks:
                arrived[r] += seconds[r][index]
            median_arrival = statistics.median_low(arrived[r] for r in ranks)
            typical = statistics.median_low(seconds[r][index] for r in ranks) / steps
            for r in ranks:
                late = max(0.0, arrived[r] - median_arrival)
                behind = (late - late_before[r]) / steps
                late_before[r] = late
                spent = seconds[r][index] / steps
                if (name in JUDGED and behind > 0
                        and behind >= max(min_seconds, (factor - 1) * typical)
                        and spent >= factor * typical):
                    found.append(Straggler(r, name, spent, typical, behind))
    return sorted(found, key=lambda s: (-s.behind, s.rank))


def straggler_line(s: Straggler, host: str, pid: int, first: int, last: int) -> str:
    """``straggler: rank 3 (host node-a, pid 1234) forward 2.410 s/step vs median 0.820
    s/step (x2.9) over steps 11-20``."""
    ratio = f" (x{s.seconds / s.median:.1f})" if s.median > 0 else ""
    steps = f"step {first}" if first == last else f"steps {first}-{last}"
    return (f"straggler: rank {s.rank} (host {host}, pid {pid}) {s.section} "
            f"{s.seconds:.3f} s/step vs median {s.median:.3f} s/step{ratio} over {steps}")


# console lines per interval: a bad node's ranks are named together, not a screenful
_MAX_LINES = 8


class StragglerWatch:
    """One rank's part: its ``clock`` (``SectionClock``; the runner and the loop mark it),
    the hosts gathered at ``begin``, and at each log step ``interval_end``'s gather.

    Args:
        cfg: The ``monitor`` section's ``straggler_factor`` and ``straggler_min_seconds``.
        layout: The rank's pipeline stage (``pp_rank``): what it is compared within.
        clock: This rank's ``SectionClock``.
        monitor: Where records go (``RunMonitor.write``; rank 0 writes).
        log: Console lines (rank 0 prints).
    """

    def __init__(self, cfg, layout, clock: SectionClock, monitor, log) -> None:
        self.factor = cfg.monitor.straggler_factor
        self.min_seconds = cfg.monitor.straggler_min_seconds
        self.layout, self.clock, self.monitor, self.log = layout, clock, monitor, log
        self.ranks: list[tuple[str, int, int]] = []  # (host, pid, pp stage) per rank

    def begin(self, step: int) -> None:
        """The loop starts after step ``step`` (collective: the ranks' hosts, once)."""
        import torch.distributed as dist

        me = (socket.gethostname(), os.getpid(), self.layout.pp_rank)
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            gathered: list = [None] * dist.get_world_size()
            dist.all_gather_object(gathered, me)
            self.ranks = [tuple(item) for item in gathered]
        else:
            self.ranks = [me]
        self.clock.start(step)

    def end(self) -> None:
        self.clock.stop()

    def interval_end(self, step: int) -> dict[str, float]:
        """At log step ``step``, after its verdict, on every rank (collective): gather the
        interval's section times; rank 0 names the stragglers. Returns the train record's
        ``time_SECTION_s`` (the lower median over ranks, seconds per step) and
        ``time_SECTION_max_s`` (the slowest rank's) for each section some rank spent time in
        (on rank 0; {} elsewhere)."""
        first, steps = self.clock.first_step, self.clock.steps
        mine = self.clock.take()
        table = _gather(mine) if len(self.ranks) > 1 else [mine]
        if not self.monitor.is_main or steps <= 0:
            return {}
        record: dict[str, float] = {}
        for index, name in enumerate(SECTIONS):
            column = [row[index] / steps for row in table]
            if max(column) > 0:  # a section of this layout (not forward_backward's twin)
                record[f"time_{name}_s"] = statistics.median_low(column)
                record[f"time_{name}_max_s"] = max(column)
        named = find_stragglers(table, [stage for _, _, stage in self.ranks], steps,
                                self.factor, self.min_seconds)
        for number, s in enumerate(named):
            host, pid, _ = self.ranks[s.rank]
            if number < _MAX_LINES:
                self.log(straggler_line(s, host, pid, first, step))
            self.monitor.write({"kind": "straggler", "step": step, "rank": s.rank,
                                "host": host, "pid": pid, "section": s.section,
                                "seconds": s.seconds, "median": s.median,
                                "behind": s.behind, "steps": [first, step]})
        if len(named) > _MAX_LINES:
            self.log(f"straggler: {len(named) - _MAX_LINES} more over steps {first}-{step} "
                     "(the straggler records of metrics.jsonl)")
        return record


def _gather(mine: list[float]) -> list[list[float]]:
    """Every rank's row (one all-gather over the default group; on its device for NCCL)."""
    import torch.distributed as dist

    device = (torch.device("cuda", torch.cuda.current_device())
              if dist.get_backend() == "nccl" else torch.device("cpu"))
    row = torch.tensor(mine, dtype=torch.float64, device=device)
    rows = [torch.empty_like(row) for _ in range(dist.get_world_size())]
    dist.all_gather(rows, row)
    return [r.tolist() for r in rows]
