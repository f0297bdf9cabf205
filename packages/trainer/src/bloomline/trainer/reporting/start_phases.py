"""What a run does before its first step, said as each phase begins: building the model,
loading the checkpoint it resumes, opening (or building) the sample indices, measuring the
matmul peak, opening the W&B run, the first step (the loader's first batch, compilation with
``train.compile``, the kernels' warm-up). Under load or at scale these take minutes, and the
first step's own line comes only after them.

One short line per phase, ``start 0:00:12 | WHAT`` (the time since the trainer started, as
``elapsed`` counts it), printed by rank 0 only (the trainer's log is silent elsewhere); the
indices add a line with their time only when they were built or were slow to open.
"""

from __future__ import annotations

from bloomline.trainer.reporting.clock import RunClock, format_hms, now

__all__ = ["StartPhases"]

SLOW_SECONDS = 2.0  # an index phase this long gets its closing line even with nothing built


class StartPhases:
    """The start-up's lines, through ``log`` with the elapsed time of ``clock``."""

    def __init__(self, log, clock: RunClock) -> None:
        self.log, self.clock = log, clock
        self._indices_began: float | None = None

    def begin(self, what: str) -> None:
        self.log(f"start {format_hms(self.clock.elapsed())} | {what}")

    def building(self, parameters: int, layout: str) -> None:
        self.begin(f"building the model: {parameters:,} parameters, {layout}")

    def resuming(self, setting: str, listed: list) -> None:
        """``checkpoint.resume`` is ``setting`` and the run folder holds ``listed``
        (``checkpoint.list_checkpoints``): a line when a checkpoint will be loaded."""
        if setting == "auto" and listed:
            self.begin(f"resuming: verifying and loading the newest checkpoint "
                       f"({listed[-1].name} first)")
        elif setting not in ("auto", "none"):
            self.begin(f"resuming: verifying and loading {setting}")

    def opening_indices(self, source: str) -> None:
        self.begin(f"data: opening the sample indices of {source} (built on first use)")
        self._indices_began = now()

    def indices_ready(self, report: dict | None) -> None:
        """The closing line of the indices: how many were built and reused (``report``:
        dataprep's ``BuiltIndex.report``), when any was built or the phase was slow."""
        if self._indices_began is None:
            return
        seconds, self._indices_began = now() - self._indices_began, None
        built, reused = _index_counts(report or {})
        if built or seconds >= SLOW_SECONDS:
            self.begin(f"data: {built} sample indices built, {reused} reused, in "
                       f"{seconds:.1f} s")

    def measuring_peak(self) -> None:
        self.begin("measuring the matmul peak for MFU (a few seconds; monitor.peak_flops "
                   "skips it)")

    def first_step(self, compiled: bool) -> None:
        self.begin("first step: " + ("compiling the model (train.compile), " if compiled else "")
                   + "the loader's first batch, the kernels' warm-up")


def _index_counts(report: dict) -> tuple[int, int]:
    """(built, reused) over every index of the report: each split's per-dataset indices and
    its blend index."""
    statuses = []
    for split in report.get("splits", {}).values():
        statuses += [row.get("status") for row in split.get("datasets", {}).values()]
        if "blend" in split:
            statuses.append(split["blend"].get("status"))
    return statuses.count("built"), statuses.count("reused")
