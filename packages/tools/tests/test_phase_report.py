"""``inspect-data blend`` and ``plot`` on a blend of phases (``build-index --phase``): each
phase's weights and realized shares, and the plot's windows with the boundaries marked."""

from __future__ import annotations

import json

import numpy as np
import pytest

from bloomline.tools.phase_report import window_shares

ARGS = ["--seq-length", "16", "--train-samples", "200", "--split", "90,10",
        "--weight", "a=0.5", "--weight", "b=0.5", "--phase", "120:a=0.1,b=0.9"]


def test_blend_reports_each_phase(corpus, tmp_path, inspect):
    """Bug: a phased blend reported with its first phase's weights only (the realized share
    over the whole run, which no phase asked for, looking like a broken blend), or the
    phases missing from --json."""
    cache = ["--cache-dir", str(tmp_path / "cache")]
    code, out, err = inspect("blend", str(corpus["dir"]), *ARGS, *cache)
    assert code == 0, err
    assert "phases (weight -> realized share within the phase):" in out, out
    assert "  phase 0 [0, 120): a 0.5000 -> 0.5000, b 0.5000 -> 0.5000" in out, out
    assert "  phase 1 [120, 200): a 0.1000 -> 0.1000, b 0.9000 -> 0.9000" in out, out
    code, out, _ = inspect("blend", str(corpus["dir"]), *ARGS, *cache, "--json")
    phases = json.loads(out)["phases"]
    assert [(p["start"], p["end"], p["counts"]) for p in phases] == [
        (0, 120, {"a": 60, "b": 60}), (120, 200, {"a": 8, "b": 72})]
    # one phase: no phase lines, an empty list
    code, out, _ = inspect("blend", str(corpus["dir"]), *ARGS[:-2], *cache, "--json")
    assert json.loads(out)["phases"] == []


def test_window_shares_show_a_phase_change():
    """Bug: the plot's shares cumulative from the start, where a late phase's new mix hides
    behind everything before it."""
    counts = np.array([[5, 5], [10, 10], [11, 19]])  # prefix counts at 10, 20, 30 samples
    np.testing.assert_allclose(window_shares(counts, [10, 20, 30]),
                               [[0.5, 0.5], [0.5, 0.5], [0.1, 0.9]])


def test_plot_marks_the_phases(corpus, tmp_path, inspect):
    """Bug: plot failing on (or ignoring) a blend of phases."""
    pytest.importorskip("matplotlib")
    out = tmp_path / "blend.png"
    code, text, err = inspect("plot", str(corpus["dir"]), "--out", str(out), *ARGS,
                              "--cache-dir", str(tmp_path / "cache"))
    assert code == 0 and out.read_bytes().startswith(b"\x89PNG"), err
