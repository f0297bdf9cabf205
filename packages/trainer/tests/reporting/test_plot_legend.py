"""``trainer plot``: the loss panel's legend beside the panel, never on its curves."""

from __future__ import annotations

import json
import math

import pytest

import bloomline.trainer.reporting.plot as run_plot

DATASETS = ("web", "code", "books", "wiki")


def _metrics(run_dir) -> None:
    """300 steps of a 4-dataset blend: 10 loss curves, decaying, spread over the panel."""
    lines = []
    for step in range(10, 310, 10):
        loss = 7.5 * math.exp(-step / 120) + 3.0
        record = {"kind": "train", "step": step, "loss": loss, "lr": 6e-4, "grad_norm": 1.0,
                  "tokens_per_s": 9000.0, "mfu": 0.2, "skipped_steps": 0}
        record.update({f"train_loss/{name}": loss + 0.2 * number
                       for number, name in enumerate(DATASETS)})
        lines.append(record)
        if step % 50 == 0:
            lines.append({"kind": "valid", "step": step, "valid_loss": loss + 0.1,
                          **{f"valid_loss/{name}": loss + 0.3 for name in DATASETS}})
    run_dir.mkdir()
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))


def test_the_loss_legend_sits_outside_the_loss_panel(tmp_path, drawn_figures):
    """Bug: the loss legend drawn inside the panel ("best" place), where with per-dataset
    losses (10 entries) it covered the curves. Checked on the drawn figure: the legend's
    box and the panel's plotting area do not overlap, and it names every curve."""
    drawn = drawn_figures(run_plot)
    _metrics(tmp_path / "run")
    run_plot.plot_run(tmp_path / "run")
    (figure,) = drawn
    loss = next(axes for axes in figure.axes if axes.get_title() == "loss")
    legend = loss.get_legend()
    # as saved: savefig ran the constrained layout, which placed the panels and the legend
    box, panel = legend.get_window_extent(), loss.get_window_extent()
    assert not box.overlaps(panel), (box, panel)
    labels = [text.get_text() for text in legend.get_texts()]
    assert len(labels) == 2 + 2 * len(DATASETS) and "valid wiki" in labels
    # the panel next to it (learning rate) is not covered either
    neighbour = next(axes for axes in figure.axes if axes.get_title() == "learning rate")
    assert not box.overlaps(neighbour.get_window_extent())


pytestmark = pytest.mark.filterwarnings("error::UserWarning")  # no "legend not fitting"
