"""Where a rank's time goes, section by section: ``SectionClock`` marks the moments the
training loop and the step runner move from one part of a step to the next, and sums the time
between marks per section over a log interval (``stragglers.py`` compares the ranks' sums).

The sections, in the order a step passes through them (``SECTIONS``):

- ``other``: from the previous step's verdict to this step's batch: logging, evaluations,
  checkpoints, rollbacks (rank 0 writes the files, so it is uneven by design: not judged);
- ``data``: waiting for the step's micro-batches (the loader), the token check, the fault point;
- ``forward``, ``backward``: the plain runner's micro-batches, each forward and each backward
  added to its section. The data-parallel gradient reduction runs inside the last
  micro-batch's backward (FSDP2 and the buffers engine start it as the gradients complete),
  tensor parallelism's all-reduces inside both, ZeRO-3's all-gathers inside both;
- ``forward_backward``: a pipelined run's whole schedule (torch's schedule interleaves the
  stages' forwards, backwards and their sends and receives: they cannot be told apart here);
- ``reduce``: the step's reductions after forward/backward: the loss's mean over dp, the
  buffers engine's reduce-scatter of what backward left, the tied embedding's reduction, the
  fp16 unscale and the gradient norm (clipping);
- ``optimizer``: the finite check, the optimizer's step (the buffers engine's all-gather of
  the updated parameters included) and ``zero_grad``;
- ``verdict``: the step's closing all-reduce (``RunGuard.judge``): every rank leaves it
  together, so the time in it is the wait for the slowest rank.

How it measures: on CPU, ``time.perf_counter`` at each mark (about 0.1 us). On CUDA a mark is
a CUDA event recorded on the current stream (no synchronization on the hot path): the
sections are the GPU's timeline, so ``data`` is the time the GPU waited for a batch (nothing
while the loader kept ahead) and a section's time is its kernels' and its waits', not how
long the CPU took to queue them. The events are read at the log step, after one
``torch.cuda.synchronize`` (the train record synchronizes there already).

The clock records only between ``start`` and ``stop`` (the training loop): a ``train_step``
called on its own (a test, a benchmark) adds nothing. Each new section fires the fault point
``section`` (``bloomline.common.faults``: ``delay@section:section=forward:rank=1:seconds=2``
slows one rank's forward) and tells ``on_enter`` (the heartbeat) where the rank is.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from bloomline.common import faults

__all__ = ["JUDGED", "SECTIONS", "SectionClock", "Sections"]

SECTIONS = ("other", "data", "forward", "backward", "forward_backward", "reduce", "optimizer",
            "verdict")
# sections a rank can be named a straggler in: ``other`` is uneven by design (rank 0 logs and
# writes files) and ``verdict`` ends in the step's all-reduce (no rank falls behind in it)
JUDGED = ("data", "forward", "backward", "forward_backward", "reduce", "optimizer")
_INDEX = {name: index for index, name in enumerate(SECTIONS)}


class Sections:
    """Where a runner marks its sections: a ``SectionClock``'s interface that does nothing
    (the default of ``StepRunner.sections``: steps outside a training loop)."""

    def enter(self, name: str) -> None:
        """The rank moves into section ``name`` (one of ``SECTIONS``)."""


class SectionClock(Sections):
    """One rank's section times (seconds per section, summed) since the last ``take``.

    Args:
        device: The run's device: CUDA events on CUDA, ``perf_counter`` elsewhere.
        on_enter: Called with (step, section, entries in this step) at every new section:
            the heartbeat publishes it (``survival/heartbeat.py``).
    """

    def __init__(self, device: torch.device,
                 on_enter: Callable[[int, str, int], None] | None = None) -> None:
        self.device = device
        self._cuda = device.type == "cuda"
        self._on_enter = on_enter
        self._running = self._warming = False
        self._marks: list[tuple[int, object]] = []  # (section index, mark), in time order
        self._spare: list = []  # CUDA events read already, recorded again later
        self.section = "other"
        self.step = 0  # the step being taken (or, in ``other``, the next one)
        self._entries = 0  # sections entered in this step: where a rank is, comparably
        self.steps = 0  # steps whose verdict came since the last take
        self.first_step = 0

    # -- the loop's marks -----------------------------------------------------------------
    def start(self, step: int) -> None:
        """Start recording: the loop begins, in ``other`` before step ``step + 1``. The
        sums leave out that first step: it carries the process's start-up (the loader's first
        batch, the allocator's and kernels' warm-up), uneven across ranks and no slowness."""
        self._running, self._warming = True, True
        self._marks = []
        self.steps, self.first_step = 0, step + 1
        self.section = ""
        self.step = step + 1
        self.enter("other")

    def stop(self) -> None:
        self._running = False
        self._marks = []

    def begin_step(self, step: int) -> None:
        """Step ``step`` starts: its data wait."""
        if not self._running:
            return
        self.step, self._entries = step, 0
        self.enter("data")

    def enter(self, name: str) -> None:
        if not self._running or name == self.section:
            return
        self._marks.append((_INDEX[name], self._mark()))
        self.section = name
        self._entries += 1
        if self._on_enter is not None:
            self._on_enter(self.step, name, self._entries)
        # after the mark: an injected delay counts in the section it slows
        faults.fire("section", section=name, step=self.step)

    def synced(self) -> None:
        """The step's verdict (its closing all-reduce) returned: the step is over."""
        if not self._running:
            return
        self.steps += 1
        step = self.step
        if self._warming:  # the process's first step: counted from its end on
            if self._cuda:
                self._spare.extend(mark for _, mark in self._marks)
            self._warming, self._marks, self.steps, self.first_step = False, [], 0, step + 1
        self.enter("other")
        self.step, self._entries = step + 1, 0

    def _mark(self):
        if not self._cuda:
            return time.perf_counter()
        event = self._spare.pop() if self._spare else torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    # -- the interval's sums --------------------------------------------------------------
    def take(self) -> list[float]:
        """Seconds per section (in ``SECTIONS`` order) between the marks since the last
        ``take``; the section in progress goes on into the next interval. Resets ``steps``
        and ``first_step``."""
        totals = [0.0] * len(SECTIONS)
        marks = self._marks
        if self._cuda and len(marks) > 1:
            torch.cuda.synchronize(self.device)
        for (section, begun), (_, ended) in zip(marks, marks[1:], strict=False):
            totals[section] += (begun.elapsed_time(ended) / 1000.0 if self._cuda
                                else ended - begun)
        if self._cuda:
            self._spare.extend(mark for _, mark in marks[:-1])
        self._marks = marks[-1:]
        self.steps, self.first_step = 0, self.step
        return totals
