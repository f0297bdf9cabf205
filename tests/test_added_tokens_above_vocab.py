"""A tokenizer.json whose added tokens sit above its base vocabulary, with a gap (as GPT-4o's
o200k file: 200,000 entries, ``<|endofprompt|>`` at id 200018), through every command that
sizes a vocabulary or range-checks ids: ``dataprep tokenize``, ``inspect-data``, ``trainer
pretrain`` with ``model.vocab_size = 0``, ``trainer export-hf`` and transformers.

The vocabulary is the largest id + 1 (612 here), not the number of entries (about 300)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from bloomline.dataprep import IndexedDataset, load_tokenizer, tokenize_corpus
from bloomline.tools.cli import main as inspect_main

sys.path.insert(0, str(Path(__file__).parents[1] / "packages" / "trainer" / "tests"))
from trainer_fixtures import tiny_config  # noqa: E402

# added tokens far above the ~300 trained entries, with ids left unused between them
ADDED = {"<|im_start|>": 600, "<|im_end|>": 611}
ID_SPACE = 612
LINES = ["The quick brown fox jumps over the lazy dog.",
         "Return the number of items in the container.",
         "def tokenize(text): return text.split()"]
TEXTS = [f"<|im_start|>{LINES[i % 3]} {i}<|im_end|> {LINES[(i + 1) % 3]}" for i in range(120)]


@pytest.fixture(scope="module")
def gapped_tokenizer(tmp_path_factory) -> Path:
    """A byte-level BPE of ~300 entries, then ADDED edited into its tokenizer.json."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tokenizer.train_from_iterator(LINES * 20, trainer)
    assert tokenizer.get_vocab_size() < min(ADDED.values())
    spec = json.loads(tokenizer.to_str())
    for content, token_id in ADDED.items():
        spec["added_tokens"].append({"id": token_id, "content": content, "single_word": False,
                                     "lstrip": False, "rstrip": False, "normalized": False,
                                     "special": True})
        # the library keeps an added token's id only when the model's vocabulary has it there
        # too, as in the published files with such gaps
        spec["model"]["vocab"][content] = token_id
    folder = tmp_path_factory.mktemp("gapped") / "tok"
    folder.mkdir()
    (folder / "tokenizer.json").write_text(json.dumps(spec), encoding="utf-8")
    return folder


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, gapped_tokenizer) -> Path:
    folder = tmp_path_factory.mktemp("gapped_corpus")
    src = folder / "in.jsonl"
    src.write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXTS), encoding="utf-8")
    tokenize_corpus([str(src)], str(gapped_tokenizer), str(folder / "corpus" / "chat"),
                    show_progress=False)
    return folder / "corpus"


def test_the_vocabulary_is_the_largest_id_plus_one(gapped_tokenizer):
    """Bug: the vocabulary sized by its entry count (302), below the added ids (611)."""
    tokenizer = load_tokenizer(gapped_tokenizer)
    assert tokenizer.vocab_size == ID_SPACE
    assert set(ADDED.values()) <= set(tokenizer.control_ids())
    unassigned = tokenizer.unassigned_ids()
    assert 605 in unassigned and 600 not in unassigned and 0 not in unassigned


def test_tokenize_keeps_the_added_ids(corpus):
    """Bug: the added tokens' ids lost or the fingerprint's vocabulary size short of them."""
    dataset = IndexedDataset(corpus / "chat")
    ids = set(np.concatenate([dataset[i] for i in range(len(dataset))]).tolist())
    assert set(ADDED.values()) <= ids
    record = json.loads((corpus / "chat.fingerprint.json").read_text())
    assert record["tokenizer"]["vocab_size"] == ID_SPACE


def _inspect(capsys, *args) -> str:
    with pytest.raises(SystemExit) as exit_info:
        inspect_main([str(a) for a in args])
    captured = capsys.readouterr()
    assert (exit_info.value.code or 0) == 0, captured.err
    return captured.out


def test_inspect_data_decodes_the_added_ids(corpus, gapped_tokenizer, capsys):
    """Bug: ``IndexError: index 611 is out of bounds`` in show/verify/tokens/sample (per-id
    arrays sized by the entry count), or the added tokens refused as outside the vocabulary."""
    shown = _inspect(capsys, "show", corpus / "chat", "--doc", 0, "--tokenizer",
                     gapped_tokenizer)
    assert "⟦<|im_start|>⟧" in shown and "⟦<|im_end|>⟧" in shown
    verified = _inspect(capsys, "verify", corpus, "--tokenizer", gapped_tokenizer, "--json")
    assert json.loads(verified)["vocab_size"] == ID_SPACE
    counted = json.loads(_inspect(capsys, "tokens", corpus / "chat", "--tokenizer",
                                  gapped_tokenizer, "--json", "--top", 1000))
    assert {row["id"]: row["count"] for row in counted["top"]}[611] == len(TEXTS)
    # the gap between the entries and the added ids is no part of the vocabulary
    assert counted["vocab_size"] == ID_SPACE and counted["unused_ids"] < 300
    sample = _inspect(capsys, "sample", corpus, "--index", 0, "--seq-length", 32,
                      "--train-samples", 10, "--split", "90,10,0", "--tokenizer", gapped_tokenizer)
    assert "⟦<|im_" in sample


@pytest.mark.slow
def test_pretrain_export_and_transformers_keep_the_added_ids(corpus, gapped_tokenizer,
                                                             tmp_path):
    """Bug: model.vocab_size = 0 sized from the entry count (302 -> 384 rows) so that id 611
    has no embedding row; an export whose config or tokenizer loses the ids above the base."""
    from bloomline.trainer.cli import app
    from bloomline.trainer.loop import Trainer

    cfg = tiny_config(str(corpus), tmp_path / "run", model={"vocab_size": 0},
                      data={"tokenizer": str(gapped_tokenizer)},
                      train={"train_samples": 16, "log_interval": 1000})
    trainer = Trainer(cfg, log=lambda *_: None)
    assert trainer.cfg.model.vocab_size == 640  # 612 padded to a multiple of 128
    trainer.run()
    (checkpoint,) = (tmp_path / "run" / "checkpoints").iterdir()

    out = tmp_path / "hf"
    result = CliRunner().invoke(app, ["export-hf", str(checkpoint), str(out)])
    assert result.exit_code == 0, result.output
    assert json.loads((out / "config.json").read_text())["vocab_size"] == 640
    suppressed = json.loads((out / "generation_config.json").read_text())["suppress_tokens"]
    assert 605 in suppressed and 611 not in suppressed and 612 in suppressed

    transformers = pytest.importorskip("transformers")
    hf = transformers.AutoTokenizer.from_pretrained(out)
    ours = [int(i) for i in load_tokenizer(gapped_tokenizer).encode_batch([TEXTS[0]])[0]]
    assert hf(TEXTS[0])["input_ids"] == ours
    assert hf.convert_ids_to_tokens([600, 611]) == list(ADDED)
    model = transformers.BloomForCausalLM.from_pretrained(out)
    assert model.get_input_embeddings().num_embeddings == 640


def test_generation_never_picks_an_unassigned_id():
    """Bug: ``trainer generate`` picks an id in the gap below the added tokens, which no token
    has (the tokenizer decodes it to nothing)."""
    import torch

    from bloomline.trainer.generate import generate_ids

    class Peaked(torch.nn.Module):
        """Logits that favour id 605 (a gap), then 611 (an added token)."""

        def __init__(self) -> None:
            super().__init__()
            self.weight = torch.nn.Parameter(torch.zeros(640))

        def forward(self, ids):
            logits = self.weight.detach().clone()
            logits[605], logits[611] = 10.0, 5.0
            return logits.expand(1, ids.shape[1], 640)

    ids = generate_ids(Peaked(), [1, 2], 3, vocab_size=ID_SPACE,
                       unassigned_ids=list(range(302, 600)) + list(range(601, 611)))
    assert ids == [611, 611, 611]
