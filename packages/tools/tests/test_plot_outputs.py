"""``inspect-data plot --out``: an image file and nothing else, one writer at a time."""

from __future__ import annotations

import pytest

from conftest import held_elsewhere


def _args(corpus_dir, out, cache, *more):
    return ["plot", corpus_dir, "--out", out, "--seq-length", 16, "--train-samples", 50,
            "--split", "90,10", "--cache-dir", cache, *more]



def _checkpoint(folder):
    folder.mkdir(parents=True)
    for name in ("manifest.json", "config.toml", ".metadata", "trainer_state.json"):
        (folder / name).write_bytes(b"{}")
    return folder


def test_plot_never_replaces_a_token_file_or_writes_into_a_checkpoint(corpus_copy, tmp_path,
                                                                      inspect):
    """Bug: `plot --out CORPUS/demo.idx --overwrite` replaced a corpus index with a PNG, and
    `--out CKPT/x.png` added a file to a checkpoint, which then failed verification."""
    pytest.importorskip("matplotlib")
    index = corpus_copy / "a.idx"
    before = index.read_bytes()
    ckpt = _checkpoint(tmp_path / "run" / "checkpoints" / "step_00000001")
    (tmp_path / "renamed.png").write_bytes(before)  # an index under an image's name
    cache = tmp_path / "cache"
    for out, why in ((index, "must end in .png or .svg"),
                     (tmp_path / "renamed.png", "holds something else"),
                     (ckpt / "x.png", "is a checkpoint"),
                     (tmp_path / "run" / "x.png", "is a run folder"),
                     (corpus_copy / "x.png", "is a corpus folder")):
        code, _, err = inspect(*_args(corpus_copy, out, cache, "--overwrite"))
        assert code == 1 and why in err and len(err.strip().splitlines()) == 1, err
        assert err.startswith(f"error: {out}: not ")
    assert index.read_bytes() == before
    assert sorted(p.name for p in ckpt.iterdir()) == [
        ".metadata", "config.toml", "manifest.json", "trainer_state.json"]
    assert not cache.exists()  # refused before the index was built


def test_plot_refuses_a_second_writer_of_the_same_out(corpus, tmp_path, inspect):
    """Bug: two plots of one --out racing: both pass the exists-check and the later replaces
    the other's image (nothing locked the output)."""
    pytest.importorskip("matplotlib")
    out = tmp_path / "plot.png"
    with held_elsewhere(out):  # the first writer, mid-write
        code, _, err = inspect(*_args(corpus["dir"], out, tmp_path / "cache"))
    assert code == 1 and f"another process (pid 4242) is writing {out}" in err
    assert not out.exists() and not (tmp_path / "cache").exists()


def test_plot_writes_svg_and_overwrites_its_own_image(corpus, tmp_path, inspect):
    """Bug: --overwrite refusing the plot's own earlier output, or an .svg name given PNG
    bytes (which the next --overwrite would then refuse as not an SVG)."""
    pytest.importorskip("matplotlib")
    out = tmp_path / "plot.svg"
    for extra in ((), ("--overwrite",)):
        code, _, err = inspect(*_args(corpus["dir"], out, tmp_path / "cache", *extra))
        assert code == 0, err
    assert out.read_bytes().startswith(b"<?xml")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache", "plot.svg"]
