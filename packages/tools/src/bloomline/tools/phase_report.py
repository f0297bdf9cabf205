"""Blend phases in the inspection reports: per phase of a train blend (``dataprep
build-index --phase``), its weights and the shares it really gives, and the shares per window
of training that ``inspect-data plot`` draws with the phase boundaries.

The phases come from the build report (``blend.phases``, counted from the blend's
``dataset_index`` when it was built); the windows from the prefix counts the plot takes.
"""

from __future__ import annotations

import numpy as np

from bloomline.dataprep.blend_phases import format_phases
from bloomline.dataprep.build_index import BuiltIndex

__all__ = ["draw_phase_curves", "format_phase_lines", "phases_of", "window_shares"]


def phases_of(built: BuiltIndex, split: str) -> list[dict]:
    """The split's phases (start, end, weights, counts, realized by dataset name); empty for
    a blend of one phase, a single dataset or a split without phases."""
    phases = built.report["splits"][split].get("blend", {}).get("phases", [])
    return phases if len(phases) > 1 else []


def format_phase_lines(phases: list[dict]) -> list[str]:
    """Lines under the blend table: each phase's weight -> realized share per dataset."""
    if not phases:
        return []
    return ["phases (weight -> realized share within the phase):", *format_phases(phases)]


def window_shares(counts: np.ndarray, stops: list[int]) -> np.ndarray:
    """Share of each dataset among the samples between consecutive ``stops`` (the first
    window from 0), from the prefix counts at the stops (``blend_report.prefix_counts``):
    ``(len(stops), num_datasets)``, where a cumulative share would hide a phase's change
    behind everything before it."""
    num_datasets = counts.shape[1]
    window = np.diff(counts, axis=0, prepend=np.zeros((1, num_datasets), dtype=np.int64))
    sizes = np.diff(np.asarray(stops), prepend=0)
    return window / np.maximum(sizes, 1)[:, None]


def draw_phase_curves(axes, curves: dict, split: str) -> None:
    """The blend panel of a phased blend on matplotlib ``axes``: each dataset's share per
    window of training (solid), its weight in each phase (dashed steps), the boundaries
    (dotted), on a linear axis where the phases keep their lengths."""
    phases, total = curves["phases"], curves["samples"]
    edges = [phase["start"] / total for phase in phases] + [1.0]
    for number, name in enumerate(curves["names"]):
        line, = axes.plot(curves["window_progress"], curves["window_shares"][:, number], label=name)
        axes.stairs([phase["weights"][name] for phase in phases], edges,
                    color=line.get_color(), linestyle="--", linewidth=0.8, baseline=None)
    for phase in phases[1:]:
        axes.axvline(phase["start"] / total, color="gray", linestyle=":", linewidth=1.0)
    axes.set(xlabel=f"fraction of the {split} split's samples (dotted: phase starts)",
             ylabel="share per window (dashed: the phase's weight)", ylim=(0, 1.02),
             title=f"blend proportions over training, {len(phases)} phases")
    axes.legend(fontsize="small")
