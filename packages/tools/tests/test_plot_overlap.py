"""``inspect-data plot``: curves on the same path stay visible (``plot_styles``)."""

from __future__ import annotations

import shutil

import bloomline.tools.plot as corpus_plot


def test_overlap_groups_and_their_dashes():
    """Bug: lines of one group given one dash pattern (the last drawn hides the others)."""
    from bloomline.tools.plot_styles import alternating_dashes, overlap_groups

    assert overlap_groups([0.25, 0.5, 0.25, 0.25]) == [(0, 3), (0, 1), (1, 3), (2, 3)]
    assert alternating_dashes(0, 1) == "-"
    patterns = [alternating_dashes(k, 3) for k in range(3)]
    offsets = sorted(offset for offset, _ in patterns)
    dash, gap = patterns[0][1]
    assert len(set(offsets)) == 3 and gap == 2 * dash  # each dash falls in the others' gaps
    assert all(b - a == dash for a, b in zip(offsets, offsets[1:], strict=False))


def test_datasets_of_one_weight_and_identical_lengths_stay_visible(corpus_copy, tmp_path,
                                                                    inspect, drawn_figures):
    """Bug: two datasets with the same weight (their shares converge on one value) were drawn
    as identical solid lines, the second hiding the first, in the blend panel (and in the
    length panel when their documents are alike): a 4-dataset blend of equal weights showed
    one line. Checked on the drawn artists: each of a group has its own marker, staggered,
    and its own dash offset; the legend says they alternate; a dataset alone stays solid."""
    drawn = drawn_figures(corpus_plot)
    for suffix in (".bin", ".idx"):  # c: b's documents again, identical lengths
        shutil.copy(corpus_copy / f"b{suffix}", corpus_copy / f"c{suffix}")
    code, _, err = inspect("plot", corpus_copy, "--out", tmp_path / "p.png", "--seq-length",
                           16, "--train-samples", 200, "--split", "90,10", "--weight", "a=2",
                           "--weight", "b=1", "--weight", "c=1",
                           "--cache-dir", tmp_path / "cache")
    assert code == 0, err
    (figure,) = drawn
    lengths, blend = figure.axes[:2]
    shares = {line.get_label(): line for line in blend.get_lines()
              if not line.get_label().startswith("_")}
    names = {label.split(";")[0]: label for label in shares}
    assert names["a"] == "a" and shares["a"].get_linestyle() == "-"
    assert shares["a"].get_marker() in (None, "None", "")
    b, c = shares[names["b"]], shares[names["c"]]
    assert "dashes alternate" in names["b"] and "dashes alternate" in names["c"]
    assert b.get_marker() != c.get_marker()
    assert b.get_markevery() != c.get_markevery()
    assert b.get_linestyle() == c.get_linestyle() == "--"  # dashed, in turns (offsets above)
    steps = {patch.get_label().split(" ")[0]: patch for patch in lengths.patches}
    assert steps["a"].get_linestyle() == "-"
    assert steps["b"].get_linestyle() != steps["c"].get_linestyle()
    assert "dashes alternate" in steps["c"].get_label()
    legend = [text.get_text() for text in blend.get_legend().get_texts()]
    assert legend == list(shares)

