"""``trainer plot --output``: never into a checkpoint or another folder of outputs, one
writer of an image at a time."""

from __future__ import annotations

import json

import pytest

from bloomline.common.errors import UserError
from bloomline.trainer.reporting.plot import plot_run
from conftest import held_elsewhere


@pytest.fixture
def run(tmp_path):
    """A run folder with three train records and a checkpoint."""
    folder = tmp_path / "run"
    ckpt = folder / "checkpoints" / "step_00000003"
    ckpt.mkdir(parents=True)
    for name in ("manifest.json", "config.toml", ".metadata", "trainer_state.json"):
        (ckpt / name).write_text("{}")
    (folder / "metrics.jsonl").write_text("".join(
        json.dumps({"kind": "train", "step": step, "loss": 5.0 - step, "lr": 1e-4,
                    "grad_norm": 1.0, "tokens_per_s": 10.0}) + "\n" for step in (1, 2, 3)))
    return folder


def test_plot_output_never_goes_into_a_checkpoint(run, tmp_path):
    """Bug: `trainer plot RUN --output CKPT/x.png` added a file to a checkpoint, which then
    failed verification (a file its manifest does not list); likewise into another run."""
    pytest.importorskip("matplotlib")
    ckpt = run / "checkpoints" / "step_00000003"
    for out, kind in ((ckpt / "x.png", "a checkpoint"), (run / "other.png", "a run folder")):
        for overwrite in (False, True):
            with pytest.raises(UserError, match=f"not written: .* is {kind}"):
                plot_run(run, out, overwrite)
    assert sorted(p.name for p in ckpt.iterdir()) == [
        ".metadata", "config.toml", "manifest.json", "trainer_state.json"]
    assert plot_run(run)["out"] == str(run / "plot.png")  # its own default stays allowed


def test_plot_refuses_a_second_writer_of_the_same_image(run, tmp_path):
    """Bug: two plots into one --output racing, the later replacing the other's image."""
    pytest.importorskip("matplotlib")
    out = tmp_path / "curves.png"
    with held_elsewhere(out), pytest.raises(
            UserError, match=r"another process \(pid 4242\) is writing"):
        plot_run(run, out)
    assert not out.exists()
