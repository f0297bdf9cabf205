"""``inspect-data plot``: document lengths and blend proportions over training, as one PNG
(or SVG, by the output's suffix).

matplotlib is an optional extra (``pip install 'bloomline-tools[plot]'``): every other
subcommand runs without it. The figure is drawn with matplotlib's object API and the Agg
canvas (no pyplot, no display, no global state) and written atomically.

The output is an image file and nothing else: ``--overwrite`` replaces only a PNG or SVG
(by its suffix and its first bytes), never a token file or anything in a checkpoint, run or
corpus folder (``bloomline.common.atomic.check_replaceable_file``).
"""

from __future__ import annotations

import io
import math
import os

import numpy as np

from bloomline.common.atomic import atomic_write_bytes, check_replaceable_file
from bloomline.common.errors import UserError
from bloomline.dataprep.build_index import BuiltIndex
from bloomline.tools.blend_report import dataset_index_of, prefix_counts
from bloomline.tools.corpus import document_lengths, open_datasets
from bloomline.tools.phase_report import draw_phase_curves, phases_of, window_shares
from bloomline.tools.plot_styles import (
    alternating_dashes,
    legend_handle_length,
    overlap_groups,
    shared_path_style,
)
from bloomline.tools.samples import split_dataset

__all__ = ["IMAGE_SIGNATURES", "INSTALL_HINT", "blend_curves", "check_plot_output",
           "length_histograms", "plot_corpus", "require_matplotlib"]

INSTALL_HINT = ("inspect-data plot needs matplotlib, an optional extra: "
                "pip install 'bloomline-tools[plot]' (or pip install matplotlib)")
_POINTS = 200  # points of training progress on the blend curve
_BINS = 60
# what plot writes: suffix -> how such a file starts (matplotlib's SVG has the XML prolog)
IMAGE_SIGNATURES = {".png": (b"\x89PNG\r\n\x1a\n",), ".svg": (b"<?xml", b"<svg")}


def check_plot_output(out: str | os.PathLike, overwrite: bool) -> None:
    """Refuse an ``--out`` plot may not write (see the module docstring), in one line."""
    check_replaceable_file(out, overwrite, "plot image (PNG or SVG)", IMAGE_SIGNATURES)


def require_matplotlib() -> type:
    """matplotlib's ``Figure`` class, or the one-line error saying how to install the extra."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise UserError(INSTALL_HINT) from None
    return Figure


def length_histograms(corpus_dir: str | os.PathLike) -> dict:
    """Per dataset: counts of non-empty documents in log-spaced length bins, shared edges."""
    lengths = {name: document_lengths(ds) for name, ds in open_datasets(corpus_dir).items()}
    longest = max((int(v.max()) for v in lengths.values() if v.size), default=1)
    edges = np.unique(np.geomspace(1, max(2, longest + 1), _BINS).round().astype(np.int64))
    counts = {name: np.histogram(v[v > 0], bins=edges)[0] for name, v in lengths.items()}
    empty = {name: int(np.count_nonzero(v == 0)) for name, v in lengths.items()}
    return {"edges": edges, "counts": counts, "empty": empty}


def blend_curves(built: BuiltIndex, split: str, request_split: str) -> dict:
    """Realized cumulative share of each dataset at ``_POINTS`` points of the split, the
    share within each window between them, and the split's phases (``phase_report``)."""
    split_ds, names = split_dataset(built, split, request_split)
    total = len(split_ds)
    stops = sorted({max(1, math.ceil(total * k / _POINTS)) for k in range(1, _POINTS + 1)})
    counts = prefix_counts(dataset_index_of(split_ds), len(names), stops)
    info = built.report["splits"][split]["datasets"]
    return {"progress": np.asarray(stops) / total,
            "shares": counts / np.asarray(stops)[:, None],
            "weights": [info[name].get("weight", 1.0) for name in names], "names": names,
            "samples": total, "phases": phases_of(built, split),
            # windows of 5 points: 40 over the split, wide enough for a share to settle
            "window_shares": window_shares(counts[4::5], stops[4::5]),
            "window_progress": np.asarray(stops[4::5]) / total}


def plot_corpus(corpus_dir: str | os.PathLike, built: BuiltIndex, out: str | os.PathLike,
                split: str = "train", request_split: str = "", overwrite: bool = False
                ) -> dict:
    """Write the PNG: length histogram (log-log) left, blend share over training right.

    Raises:
        UserError: matplotlib missing (with how to install it), or an ``out`` that may not
            be written (:func:`check_plot_output`).
    """
    figure_class = require_matplotlib()
    check_plot_output(out, overwrite)
    histograms = length_histograms(corpus_dir)
    curves = blend_curves(built, split, request_split)
    figure = figure_class(figsize=(12, 4.5), layout="constrained")
    left, right = figure.subplots(1, 2)
    edges = histograms["edges"]
    # identical distributions share their path in turns (plot_styles)
    places = overlap_groups([c.tobytes() for c in histograms["counts"].values()])
    for (name, counts), place in zip(histograms["counts"].items(), places, strict=True):
        left.stairs(counts, edges, linestyle=alternating_dashes(*place),
                    label=f"{name} ({histograms['empty'][name]} empty)"
                    + ("; same lengths as another: dashes alternate" if place[1] > 1 else ""))
    left.set(xscale="log", yscale="log", xlabel="document length (tokens)",
             ylabel="documents", title="document lengths")
    left.legend(fontsize="small", handlelength=legend_handle_length(places))
    if curves["phases"]:  # shares per window, each phase's weights, its boundaries
        draw_phase_curves(right, curves, split)
    else:
        # datasets of one weight converge on one line: drawn in turns (plot_styles)
        places = overlap_groups([round(w, 9) for w in curves["weights"]])
        for number, (name, place) in enumerate(zip(curves["names"], places, strict=True)):
            shared = f"; weight shared by {place[1]}: dashes alternate" if place[1] > 1 else ""
            line, = right.plot(curves["progress"], curves["shares"][:, number],
                               label=f"{name}{shared}", **shared_path_style(number, place))
            right.axhline(curves["weights"][number], color=line.get_color(), linewidth=0.8,
                          linestyle=alternating_dashes(*place) if place[1] > 1 else "--")
        right.set(xscale="log", xlabel=f"fraction of the {split} split's samples (log)",
                  ylabel="realized share so far (dashed: requested)", ylim=(0, 1.02),
                  title="blend proportions over training")
        right.legend(fontsize="small", handlelength=legend_handle_length(places))
    buffer = io.BytesIO()
    figure.savefig(buffer, format=os.fspath(out).rsplit(".", 1)[-1].lower(), dpi=100)
    atomic_write_bytes(out, buffer.getvalue(), overwrite=overwrite)
    return {"out": str(out), "datasets": curves["names"], "split": split,
            "samples": curves["samples"],
            "left_out": built.report["splits"][split].get("left_out", [])}
