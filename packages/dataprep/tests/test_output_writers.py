"""One writer per output, and ``--overwrite`` only over the command's own kind of output:
``dataprep tokenize``, ``merge`` and ``train-tokenizer``."""

from __future__ import annotations

import importlib
import json

import numpy as np
import pytest

from bloomline.common.errors import UserError
from bloomline.dataprep import IndexedDatasetWriter, tokenize_corpus, train_tokenizer
from conftest import _training_lines, held_elsewhere

tokenize_module = importlib.import_module("bloomline.dataprep.tokenize_corpus")



@pytest.fixture
def raw(tmp_path):
    path = tmp_path / "raw.jsonl"
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in _training_lines()[:200]))
    return path


def test_tokenize_refuses_a_second_writer_of_the_same_output(raw, tmp_path, tiny_tokenizer,
                                                             dataprep):
    """Bug: two `dataprep tokenize` runs with the same --output both passed the exists-check
    made at their start, and the later to finish replaced the other's .bin/.idx/fingerprint,
    both exiting 0 (nothing locked the prefix)."""
    out = tmp_path / "corpus" / "web"
    with held_elsewhere(out):
        code, _, err = dataprep("tokenize", raw, "--tokenizer", tiny_tokenizer, "--output",
                                out, "--workers", 1, "--quiet")
    assert code == 1, err
    assert err.strip() == (f"error: another process (pid 4242) is writing {out}; wait for it "
                           "to finish or choose another output")
    assert sorted(p.name for p in out.parent.iterdir()) == [".web.lock"]  # the holder's
    code, _, err = dataprep("tokenize", raw, "--tokenizer", tiny_tokenizer, "--output", out,
                            "--workers", 1, "--quiet")
    assert code == 0, err
    assert sorted(p.name for p in out.parent.iterdir()) == [
        "web.bin", "web.fingerprint.json", "web.idx"]  # the stale sidecar gone with it


def test_merge_refuses_a_second_writer_of_the_same_output(tmp_path, dataprep):
    """Bug: two `dataprep merge` runs into one --output, the later replacing the other's."""
    part = tmp_path / "part"
    with IndexedDatasetWriter(part, np.uint16) as writer:
        writer.add_document(np.arange(5))
    out = tmp_path / "all"
    with held_elsewhere(out):
        code, _, err = dataprep("merge", part, "--output", out)
    assert code == 1 and f"another process (pid 4242) is writing {out}" in err
    assert not out.with_suffix(".bin").exists() and not out.with_suffix(".idx").exists()


def test_tokenize_keeps_an_output_that_appeared_while_it_ran(raw, tmp_path, tiny_tokenizer,
                                                             monkeypatch):
    """Bug: the exists-check ran only at the start, so the final rename silently replaced a
    .idx written there meanwhile (by another program), without --overwrite."""
    out = tmp_path / "web"
    original = tokenize_module._tokenize_into

    def then_someone_writes(*args, **kwargs):
        original(*args, **kwargs)
        out.with_suffix(".idx").write_bytes(b"theirs")

    monkeypatch.setattr(tokenize_module, "_tokenize_into", then_someone_writes)
    with pytest.raises(UserError, match=r"web.idx: output exists .*pass --overwrite"):
        tokenize_corpus([str(raw)], str(tiny_tokenizer), str(out), show_progress=False)
    assert out.with_suffix(".idx").read_bytes() == b"theirs"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["raw.jsonl", "web.idx"]


def _export_folder(folder):
    folder.mkdir()
    for name in ("config.json", "model.safetensors", "tokenizer.json",
                 "tokenizer_config.json", "tokenizer.model"):
        (folder / name).write_text(f"the export's {name}")
    return folder


def _snapshot(folder):
    return {p.relative_to(folder).as_posix(): p.read_bytes()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def test_train_tokenizer_refuses_an_output_that_is_not_its_own(raw, tmp_path, dataprep):
    """Bug: `train-tokenizer --kind byte-bpe --output EXPORT --overwrite` replaced the
    export's tokenizer.json and left its tokenizer.model disagreeing with it; a SentencePiece
    pair could likewise be written beside a tokenizer.json, over a renamed file of another
    kind, or into a run folder."""
    export = _export_folder(tmp_path / "export")
    run = tmp_path / "run"
    (run / "tokenizer").mkdir(parents=True)
    (run / "metrics.jsonl").write_text("")
    (run / "tokenizer" / "tokenizer.json").write_text("the run's")
    (tmp_path / "tok").mkdir()
    (tmp_path / "tok" / "sp.model").write_bytes(b"MMIDIDX\x00\x00")  # an index, renamed
    before = _snapshot(tmp_path)
    for kind, out, why in (
            ("byte-bpe", export, "it also holds config.json, model.safetensors, "
                                 "tokenizer.model"),
            ("byte-bpe", run / "tokenizer", "is a run folder"),
            ("byte-bpe", run, "is a run folder"),
            ("sentencepiece", export / "tokenizer", "holds a Hugging Face tokenizer.json"),
            ("sentencepiece", run / "sp", "is a run folder"),
            ("sentencepiece", tmp_path / "tok" / "sp", "holds something else")):
        code, _, err = dataprep("train-tokenizer", raw, "--vocab-size", 300, "--kind", kind,
                                "--output", out, "--overwrite")
        assert code == 1 and why in err and len(err.strip().splitlines()) == 1, (kind, err)
    assert _snapshot(tmp_path) == before


def test_train_tokenizer_refuses_a_second_writer(raw, tmp_path, dataprep):
    """Bug: two train-tokenizer runs of one --output, the later replacing the other's."""
    out = tmp_path / "tok"
    with held_elsewhere(out):
        code, _, err = dataprep("train-tokenizer", raw, "--vocab-size", 300, "--output", out)
    assert code == 1 and f"another process (pid 4242) is writing {out}" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == [".tok.lock", "raw.jsonl"]


def test_byte_bpe_overwrite_replaces_its_own_folder_whole(raw, tmp_path):
    """Bug: --overwrite replacing the byte-bpe folder file by file (a stale file of the old
    output could stay), or refusing the command's own earlier output."""
    out = tmp_path / "tok"
    train_tokenizer([str(raw)], out, vocab_size=300, kind="byte-bpe")
    first = _snapshot(out)
    with pytest.raises(UserError, match="output exists; pass --overwrite"):
        train_tokenizer([str(raw)], out, vocab_size=300, kind="byte-bpe")
    train_tokenizer([str(raw)], out, vocab_size=310, kind="byte-bpe", overwrite=True)
    assert sorted(_snapshot(out)) == ["tokenizer.json", "tokenizer_config.json"]
    assert _snapshot(out) != first
    assert sorted(p.name for p in tmp_path.iterdir()) == ["raw.jsonl", "tok"]
