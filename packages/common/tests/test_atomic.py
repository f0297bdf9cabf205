"""Atomic outputs: nothing half-written under a final name, no clobbering by default."""

from __future__ import annotations

import os

import pytest

from bloomline.common import UserError, atomic_output_dir, atomic_write_bytes, check_can_write


def test_atomic_write_bytes_replaces_whole_file_with_default_permissions(tmp_path):
    """Catches: outputs left 0600 by mkstemp, or a temporary file left beside the output."""
    target = tmp_path / "sub" / "out.bin"
    atomic_write_bytes(target, b"abc")
    atomic_write_bytes(target, b"defg")
    assert target.read_bytes() == b"defg"
    assert sorted(p.name for p in target.parent.iterdir()) == ["out.bin"]
    umask = os.umask(0)
    os.umask(umask)
    assert target.stat().st_mode & 0o777 == 0o666 & ~umask


def test_scratch_dir_is_removed_even_on_error(tmp_path):
    """Catches: a crash leaving a scratch folder that is not hidden or not cleaned up."""
    with pytest.raises(RuntimeError), atomic_output_dir(tmp_path, "name") as scratch:
        assert scratch.name.startswith(".name.") and scratch.name.endswith(".partial")
        (scratch / "shard").write_bytes(b"x")
        raise RuntimeError("boom")
    assert list(tmp_path.iterdir()) == []


def test_check_can_write_refuses_existing_output_naming_it(tmp_path):
    """Catches: silently overwriting a user's token files without --overwrite."""
    existing = tmp_path / "a.idx"
    existing.write_bytes(b"")
    with pytest.raises(UserError, match=r"a\.idx: output exists; pass --overwrite"):
        check_can_write([tmp_path / "b.bin", existing], overwrite=False)
    check_can_write([existing], overwrite=True)


PNG = b"\x89PNG\r\n\x1a\n" + b"\0" * 8
SIGNATURES = {".png": (PNG[:8],)}


def _checkpoint(folder):
    folder.mkdir(parents=True)
    for name in ("manifest.json", "config.toml", ".metadata"):
        (folder / name).write_bytes(b"x")
    return folder


def test_output_file_replaces_only_a_file_of_its_own_kind(tmp_path):
    """Bug: --overwrite replacing whatever the output names (a corpus's .idx renamed .png,
    a folder, a link) with a plot, or the suffix not matching what is written."""
    from bloomline.common.atomic import check_replaceable_file

    own = tmp_path / "plot.png"
    own.write_bytes(PNG)
    with pytest.raises(UserError, match="plot.png: output exists; pass --overwrite"):
        check_replaceable_file(own, False, "plot image", SIGNATURES)
    check_replaceable_file(own, True, "plot image", SIGNATURES)
    check_replaceable_file(tmp_path / "new.png", False, "plot image", SIGNATURES)
    (tmp_path / "index.png").write_bytes(b"MMIDIDX\x00\x00")  # a token index renamed
    (tmp_path / "folder.png").mkdir()
    (tmp_path / "link.png").symlink_to(own)
    for name, why in (("index.png", "holds something else"), ("folder.png", "not a file"),
                      ("link.png", "a link"), ("demo.idx", "must end in .png")):
        for overwrite in (True, False):
            with pytest.raises(UserError, match=why) as refused:
                check_replaceable_file(tmp_path / name, overwrite, "plot image", SIGNATURES)
            assert str(refused.value).startswith(str(tmp_path / name))


def test_no_output_file_goes_into_a_checkpoint_run_or_corpus_folder(tmp_path):
    """Bug: a plot written into a checkpoint (which then fails verification: a file its
    manifest does not list), into a run folder, or among a corpus's token files."""
    from bloomline.common.atomic import check_replaceable_file, foreign_folder

    ckpt = _checkpoint(tmp_path / "run" / "checkpoints" / "step_00000005")
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "web.bin").write_bytes(b"")
    (corpus / "web.idx").write_bytes(b"")
    (tmp_path / "run" / "metrics.jsonl").write_text("")
    assert foreign_folder(ckpt).startswith("a checkpoint")
    assert foreign_folder(tmp_path / "run").startswith("a run folder")
    assert foreign_folder(corpus) == "a corpus folder (web.bin/.idx)"
    assert foreign_folder(tmp_path) is None
    for out, kind in ((ckpt / "x.png", "a checkpoint"), (ckpt / "sub" / "x.png", "a checkpoint"),
                      (tmp_path / "run" / "x.png", "a run folder"),
                      (corpus / "x.png", "a corpus folder")):
        with pytest.raises(UserError, match=f"not written: .* is {kind}"):
            check_replaceable_file(out, True, "plot image", SIGNATURES)
    check_replaceable_file(corpus / "plots" / "x.png", False, "plot image", SIGNATURES)


def test_publish_new_keeps_a_file_that_appeared_meanwhile(tmp_path):
    """Bug: the exists-check made only at the start, so the final rename silently replaces
    a file written there since, without --overwrite."""
    from bloomline.common.atomic import publish_new

    tmp, final = tmp_path / ".out.partial", tmp_path / "out.bin"
    tmp.write_bytes(b"new")
    final.write_bytes(b"theirs")
    with pytest.raises(UserError, match="out.bin: output exists"):
        publish_new(tmp, final)
    assert final.read_bytes() == b"theirs" and tmp.exists()
    final.unlink()
    publish_new(tmp, final)
    assert final.read_bytes() == b"new" and not tmp.exists()
    with pytest.raises(UserError, match="output exists"):
        atomic_write_bytes(final, b"again", overwrite=False)
    assert final.read_bytes() == b"new" and sorted(os.listdir(tmp_path)) == ["out.bin"]


def test_publish_dir_replaces_the_whole_folder(tmp_path):
    """Bug: replacing a folder output file by file, leaving a stale file of the old output
    (another tokenizer kind's) beside the new ones."""
    from bloomline.common.atomic import publish_dir

    final = tmp_path / "tok"
    final.mkdir()
    (final / "tokenizer.json").write_text("old")
    (final / "stale.model").write_text("old")
    with atomic_output_dir(tmp_path, "tok") as scratch:
        staged = scratch / "staged"
        staged.mkdir()
        (staged / "tokenizer.json").write_text("new")
        publish_dir(staged, final, scratch)
    assert sorted(os.listdir(final)) == ["tokenizer.json"]
    assert (final / "tokenizer.json").read_text() == "new"
    assert sorted(os.listdir(tmp_path)) == ["tok"]
