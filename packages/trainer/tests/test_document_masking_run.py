"""Document masking wired into a run: ``data.reset_attention_mask`` / ``data.eod_mask_loss``
change what ``Trainer`` trains on packed samples, the EOD id comes from the corpus's
fingerprints, and the settings a run cannot honour are refused in one line."""

from __future__ import annotations

import json

import numpy as np
import pytest

from bloomline.common.errors import UserError
from bloomline.dataprep.fingerprint import write_fingerprint_record
from bloomline.dataprep.indexed_dataset import IndexedDatasetWriter
from bloomline.trainer.loop import Trainer

EOD = 95


def _packed_corpus(folder, fingerprint: bool = True) -> str:
    """Short documents (3 to 12 tokens, EOD appended): a 32-token sample holds several; with
    ``fingerprint`` the token files record the EOD id, as dataprep tokenize writes them."""
    rng = np.random.default_rng(0)
    folder.mkdir(parents=True)
    writer = IndexedDatasetWriter(folder / "toy", np.uint16)
    for _ in range(300):
        start, length = int(rng.integers(0, EOD)), int(rng.integers(3, 13))
        tokens = (start + np.arange(length)) % EOD
        writer.add_document(np.append(tokens, EOD).astype(np.uint16))
    writer.finalize()
    if fingerprint:
        write_fingerprint_record(folder / "toy", {"format": 1, "append_eod": True, "tokenizer": {
            "kind": "test", "name": "toy", "vocab_size": EOD + 1, "eod_id": EOD,
            "vocab_sha256": "0" * 64}})
    return str(folder)


def _losses(run_dir) -> tuple[list[float], list[float]]:
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return ([r["loss"] for r in records if r["kind"] == "train"],
            [r["valid_loss"] for r in records if r["kind"] == "valid"])


@pytest.mark.slow
def test_document_masking_changes_what_a_run_trains(tmp_path, make_config):
    """Bug: the settings load but never reach the step (the runner built without them, the
    loader's batches bypassing them) or validation, so a masked run trains and evaluates
    exactly as an unmasked one on samples of several documents; or the run's first line does
    not say that documents are masked."""
    corpus = _packed_corpus(tmp_path / "corpus")
    runs = {}
    for name, data in [("plain", {}), ("masked", {"reset_attention_mask": True,
                                                  "eod_mask_loss": True})]:
        cfg = make_config(corpus, tmp_path / name, data=data,
                          train={"train_samples": 16, "log_interval": 1, "eval_interval": 4,
                                 "eval_samples": 4})
        printed: list[str] = []
        trainer = Trainer(cfg, log=printed.append)
        assert trainer.spec.eod_id == (EOD if data else None)
        trainer.run()
        runs[name] = _losses(tmp_path / name)
        said = any("attention within documents; no loss on EOD inputs;" in line
                   for line in printed)
        assert said == bool(data), "the model line says whether documents are masked"
    (plain, plain_valid), (masked, masked_valid) = runs["plain"], runs["masked"]
    assert len(plain) == len(masked) == 4 and len(plain_valid) == len(masked_valid) == 1
    # the same weights and samples at step 1: only the masking differs
    assert abs(plain[0] - masked[0]) > 1e-3
    assert abs(plain_valid[0] - masked_valid[0]) > 1e-3


def test_masking_without_an_eod_id_is_refused(tmp_path, make_config):
    """Bug: a run asked to mask documents whose EOD id nobody knows (no tokenizer, token
    files without a fingerprint) trains unmasked, or masks at a guessed id."""
    corpus = _packed_corpus(tmp_path / "corpus", fingerprint=False)
    for field in ("reset_attention_mask", "eod_mask_loss"):
        cfg = make_config(corpus, tmp_path / "run", data={field: True})
        with pytest.raises(UserError, match=f"data.{field} needs the end-of-document"):
            Trainer(cfg, log=lambda line: None)


def test_reset_position_ids_alone_is_refused(tmp_path, make_config):
    """Bug: Megatron's data.reset_position_ids = true alone is taken silently (with ALiBi it
    would do nothing: there are no position ids, and attention would still cross
    documents)."""
    cfg = make_config(_packed_corpus(tmp_path / "corpus"), tmp_path / "run",
                      data={"reset_position_ids": True})
    with pytest.raises(UserError, match="data.reset_position_ids = true: ALiBi has no "
                                        "position ids"):
        Trainer(cfg, log=lambda line: None)
    cfg.data.reset_attention_mask = True  # together: the same as reset_attention_mask alone
    assert Trainer(cfg, log=lambda line: None).runner.documents.reset_attention_mask


@pytest.mark.parametrize("override, key", [
    ("--reset-attention-mask=true", "data.reset_attention_mask"),
    ("--eod-mask-loss=true", "data.eod_mask_loss"),
    ("train.reset_attention_mask=true", "data.reset_attention_mask")])
def test_megatron_spellings_are_answered_with_our_key(override, key):
    """Bug: a Megatron user's flag (dashes, or the key under another section) gets a bare
    "unknown config key" with no pointer to the setting that does what they asked."""
    from bloomline.trainer.config import load_trainer_config

    with pytest.raises(UserError, match=f"did you mean {key}"):
        load_trainer_config(None, [override])
