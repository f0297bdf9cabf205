"""``trainer plot RUN``: what each panel draws (from records, no pixels), the PNG of a tiny
run, and the one-line refusals."""

from __future__ import annotations

import json
import math
import shutil
import struct
import sys

import pytest
from trainer_fixtures import FakeMeasure, tiny_config, write_corpus
from typer.testing import CliRunner

import bloomline.trainer.reporting.monitor as monitor
from bloomline.common.errors import UserError
from bloomline.trainer.cli import app
from bloomline.trainer.loop import Trainer
from bloomline.trainer.reporting.plot import plot_run, plot_series


def _train(step: int, **extra) -> dict:
    return {"kind": "train", "step": step, "loss": 5.0 - step / 10, "lr": step * 1e-4,
            "grad_norm": 1.0 + step, "tokens_per_s": 100.0 * step, "mfu": step / 100,
            "skipped_steps": 0, **extra}


def test_series_feed_each_panel_the_right_numbers():
    """Catches: a panel fed the wrong key or scale (MFU as a fraction), a step logged twice
    (after a rollback or restart) drawn twice instead of its last record, per-dataset losses
    or valid points missing, a non-finite grad norm breaking the axis, or rollback, spike and
    skipped-step markers at the wrong steps."""
    records = [
        _train(2, **{"train_loss/en": 4.5}), _train(4, loss=9.0),
        {"kind": "valid", "step": 4, "valid_loss": 4.2, "valid_loss/en": 4.1,
         "valid_loss/code": 4.4},
        {"kind": "rollback", "step": 5, "checkpoint_step": 4},
        _train(4, **{"train_loss/en": 4.4, "train_loss/code": 4.8}),  # the re-run counts
        {"kind": "spike", "step": 5, "action": "none (no checkpoint)"},
        {"kind": "activation_stats", "step": 6, "grad_norm": [1.0, 2.0]},
        _train(6, grad_norm=float("inf"), skipped_steps=1),
        _train(8, skipped_steps=1), _train(10, skipped_steps=3)]
    series = plot_series(records)
    assert series["loss"]["train"] == ([2, 4, 6, 8, 10], [4.8, 4.6, 4.4, 4.2, 4.0])
    assert series["loss"]["valid"] == ([4], [4.2])
    assert series["loss"]["train en"] == ([2, 4], [4.5, 4.4])
    assert series["loss"]["train code"] == ([4], [4.8])
    assert series["loss"]["valid code"] == ([4], [4.4])
    assert set(series["loss"]) == {"train", "valid", "train en", "train code", "valid en",
                                   "valid code"}
    assert series["lr"] == ([2, 4, 6, 8, 10], pytest.approx([2e-4, 4e-4, 6e-4, 8e-4, 1e-3]))
    steps, norms = series["grad_norm"]
    assert norms[:2] == [3.0, 5.0] and math.isnan(norms[2]) and norms[3:] == [9.0, 11.0]
    assert series["tokens_per_s"][1] == [200.0, 400.0, 600.0, 800.0, 1000.0]
    assert series["mfu_percent"][1] == pytest.approx([2, 4, 6, 8, 10])
    assert (series["rollbacks"], series["spikes"], series["skipped"]) == ([5], [5], [6, 10])


def _png_size(path) -> tuple[int, int]:
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n" and head[12:16] == b"IHDR"
    return struct.unpack(">II", head[16:24])


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """One tiny run for the module (10 steps, validation at 5 and 10); tests that change its
    folder work on a copy."""
    root = tmp_path_factory.mktemp("plot")
    run = root / "run"
    cfg = tiny_config(write_corpus(root / "corpus"), run,
                      train={"train_samples": 40, "log_interval": 2, "eval_interval": 5,
                             "eval_samples": 4})
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(monitor, "measure_peak_flops", FakeMeasure(1e15))
        Trainer(cfg, log=lambda line: None).run()
    return run


def _copy_of(run, tmp_path):
    copy = tmp_path / "run"
    copy.mkdir()
    shutil.copy(run / "metrics.jsonl", copy / "metrics.jsonl")
    return copy


@pytest.mark.slow
def test_plot_of_a_tiny_run(tiny_run, tmp_path):
    """Catches: plot failing on a real run folder, an image that is not a 1200x800 PNG, the
    default output not RUN/plot.png or not redrawn on the next call, an explicit output
    replaced without --overwrite, or the command not wired into the CLI."""
    pytest.importorskip("matplotlib")
    tiny_run = _copy_of(tiny_run, tmp_path)
    result = plot_run(tiny_run)
    out = tiny_run / "plot.png"
    assert result["out"] == str(out) and _png_size(out) == (1200, 800)
    assert (result["train_records"], result["first_step"], result["last_step"],
            result["valid_records"]) == (6, 1, 10, 2)  # step 1, then every 2
    out.write_bytes(out.read_bytes()[:100])  # an older plot: the default is redrawn
    plot_run(tiny_run)
    assert _png_size(out) == (1200, 800) and out.stat().st_size > 100

    runner = CliRunner()
    other = tmp_path / "other.png"
    done = runner.invoke(app, ["plot", str(tiny_run), "--output", str(other)])
    assert done.exit_code == 0 and f"wrote {other}: 6 train records (steps 1-10), 2 valid" \
        in done.output
    with pytest.raises(UserError, match="output exists; pass --overwrite"):
        plot_run(tiny_run, other)
    assert plot_run(tiny_run, other, overwrite=True)["out"] == str(other)


@pytest.mark.slow
def test_plot_refuses_bad_input_in_one_line(tiny_run, tmp_path):
    """Catches: a traceback (or an empty PNG) for a folder that is not a run, a run that has
    not logged yet, a metrics.jsonl of torn lines, an output that is not a .png or is some
    other file; a torn line among good ones is skipped and reported, not fatal."""
    pytest.importorskip("matplotlib")
    with pytest.raises(UserError, match="no such run folder"):
        plot_run(tmp_path / "missing")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(UserError, match=f"{empty}: no metrics.jsonl"):
        plot_run(empty)
    (empty / "metrics.jsonl").write_text('{"kind": "valid", "step": 2, "valid_loss": 1}\n'
                                         '{"kind": "tra\n')
    with pytest.raises(UserError, match=r"metrics.jsonl: no train records to plot yet .*"
                                        r"1 lines did not parse \(first: line 2\)"):
        plot_run(empty)
    with pytest.raises(UserError, match="must end in .png"):
        plot_run(tiny_run, tmp_path / "plot.pdf")
    notes = tmp_path / "notes.png"
    notes.write_text("not an image")
    with pytest.raises(UserError, match="exists and is not a PNG; not replaced"):
        plot_run(tiny_run, notes, overwrite=True)
    assert notes.read_text() == "not an image"
    tiny_run = _copy_of(tiny_run, tmp_path)
    with (tiny_run / "metrics.jsonl").open("a") as fh:
        fh.write('{"kind": "train", "st\n' + json.dumps(_train(12)) + "\n")
    result = plot_run(tiny_run)
    assert result["last_step"] == 12 and len(result["bad_lines"]) == 1


def test_plot_without_matplotlib_names_the_extra(tmp_path, monkeypatch):
    """Catches: an ImportError traceback instead of how to install the plot extra."""
    (tmp_path / "metrics.jsonl").write_text(json.dumps(_train(2)) + "\n")
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    done = CliRunner().invoke(app, ["plot", str(tmp_path)])
    assert isinstance(done.exception, UserError)
    assert "pip install 'bloomline-trainer[plot]'" in str(done.exception)
    assert not (tmp_path / "plot.png").exists()
