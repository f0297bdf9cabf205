"""export-hf writes the run's tokenizer so that transformers' AutoTokenizer gives our ids and our
text, and BloomForCausalLM + AutoTokenizer continue a prompt as ``trainer generate`` does."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from trainer_fixtures import tiny_config

from bloomline.common.errors import UserError
from bloomline.dataprep import tokenize_corpus
from bloomline.dataprep.tokenizer import load_tokenizer, train_tokenizer
from bloomline.trainer.hf import export_hf
from bloomline.trainer.model import ModelConfig, build_model, padded_vocab_size
from conftest import UNICODE_TEXTS

BIN = Path(sys.executable).parent

# Unicode, characters the tiny vocabularies never saw (SentencePiece's byte fallback), leading,
# repeated and trailing spaces, newlines and tabs, digits, an empty and a blank text
TEXTS = [*UNICODE_TEXTS,
         "Runes ᚠᚢᚦ, math 𝔘𝔫𝔦𝔠𝔬𝔡𝔢, fullwidth ＡＢＣ and U+2028\u2028here",
         "  two leading spaces, three   inside, trailing  ", " one leading space",
         "line one\nline two\n\n  indented\tand a tab\r\nCRLF\n",
         "Return the number of items in the container. 12345 + 678 = 13023",
         "The quick brown fox jumps over the lazy dog.", "", " ", "é", "\n"]
# a special token's spelling inside a document: text for SentencePiece and tiktoken, the special
# token for a tokenizer.json (as our encode and the tokenizers library read it)
SPECIAL_SPELLINGS = ["spells </s> and <|endoftext|> and <s> and <pad> inside the text"]


def _export(tokenizer, folder: Path) -> Path:
    cfg = ModelConfig(vocab_size=padded_vocab_size(tokenizer.vocab_size), hidden_size=16,
                      num_layers=1, num_heads=2)
    return export_hf(build_model(cfg, seed=0).state_dict(), cfg, folder, tokenizer=tokenizer)


def _auto_tokenizer(folder: Path):
    transformers = pytest.importorskip("transformers")
    return transformers.AutoTokenizer.from_pretrained(folder)


def _check_ids_and_text(tokenizer, hf, texts: list[str]) -> None:
    ours = [[int(i) for i in ids] for ids in tokenizer.encode_batch(texts)]
    theirs = hf(texts)["input_ids"]
    for text, mine, other in zip(texts, ours, theirs, strict=True):
        assert other == mine, f"{text!r}: AutoTokenizer {other} != ours {mine}"
        assert hf.decode(mine, skip_special_tokens=True) == tokenizer.decode(mine), text


@pytest.mark.parametrize("fixture", ["tiny_tokenizer", "tiny_byte_bpe", "tiny_tiktoken"])
def test_auto_tokenizer_of_the_export_gives_our_ids(fixture, request, tmp_path):
    """Bug: an export whose tokenizer transformers cannot load, or loads with other ids than the
    run's: a normalizer or dummy prefix not as SentencePiece's (leading spaces), byte fallback
    lost, BOS/EOS added by a post-processor, special-token spellings read differently, a
    tiktoken merge or split pattern wrong; or special ids in config.json not the tokenizer's."""
    if fixture == "tiny_tiktoken":
        pytest.importorskip("tiktoken")
    tokenizer = load_tokenizer(request.getfixturevalue(fixture))
    out = _export(tokenizer, tmp_path / "hf")
    hf = _auto_tokenizer(out)
    _check_ids_and_text(tokenizer, hf, TEXTS + SPECIAL_SPELLINGS)
    special = tokenizer.special_ids
    assert hf.eos_token_id == special["eod"]
    assert (hf.bos_token_id, hf.pad_token_id) == (special.get("bos"), special.get("pad"))
    config = json.loads((out / "config.json").read_text())
    assert (config["bos_token_id"], config["eos_token_id"], config["pad_token_id"]) == (
        special.get("bos"), special["eod"], special.get("pad"))
    files = sorted(p.name for p in out.iterdir())
    assert "tokenizer.json" in files and "tokenizer_config.json" in files
    assert ("tokenizer.model" in files) == (tokenizer.kind == "sentencepiece")
    # the export is a --tokenizer for our own tools too, with the same ids
    again = load_tokenizer(out)
    assert [list(ids) for ids in again.encode_batch(TEXTS)] == [
        list(ids) for ids in tokenizer.encode_batch(TEXTS)]


def test_tokenizer_json_post_processor_kept_and_truncation_dropped(tmp_path, tiny_byte_bpe):
    """Bug: a tokenizer.json that puts BOS before every text (Llama 3 style) exported without
    its post-processor or so that transformers replaces it (no BOS), or the truncation of the
    file exported (our encode never truncates; the tokenizers library would)."""
    from tokenizers import Tokenizer as RustTokenizer
    from tokenizers import processors

    backend = RustTokenizer.from_file(str(tiny_byte_bpe / "tokenizer.json"))
    backend.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", 1)])
    backend.enable_truncation(max_length=8)
    (tmp_path / "tok").mkdir()
    backend.save(str(tmp_path / "tok" / "tokenizer.json"))
    (tmp_path / "tok" / "tokenizer_config.json").write_bytes(
        (tiny_byte_bpe / "tokenizer_config.json").read_bytes())
    tokenizer = load_tokenizer(tmp_path / "tok")
    assert tokenizer.encode_batch(["x"])[0][0] == 1  # BOS, as the file says
    hf = _auto_tokenizer(_export(tokenizer, tmp_path / "hf"))
    _check_ids_and_text(tokenizer, hf, TEXTS)
    assert all(ids[0] == 1 for ids in hf(TEXTS)["input_ids"])
    assert json.loads((tmp_path / "hf" / "tokenizer.json").read_text())["truncation"] is None


@pytest.mark.parametrize("name,endofprompt", [("cl100k_base", 100276), ("o200k_base", 200018)])
def test_tiktoken_patterns_whole_tokens_and_specials(tmp_path, tiny_tiktoken, name,
                                                     endofprompt):
    """Bug: cl100k_base's possessive interval ``\\p{N}{1,3}+`` read by Oniguruma as "groups of
    one to three, repeated" (digits not cut in threes), o200k_base's case classes and
    contractions split otherwise; a token no two tokens merge into (tiktoken takes it whole
    when a regex piece spells it) split into bytes; or the extra special tokens (ids past a
    gap in the ranks) at other ids."""
    pytest.importorskip("tiktoken")
    import base64

    ranks = tiny_tiktoken.read_bytes()
    count = len(ranks.splitlines())
    ranks += b"".join(base64.b64encode(token) + b" %d\n" % (count + i)
                      for i, token in enumerate([b"zqx", b" zqx"]))
    ranks_file = tmp_path / f"{name}.tiktoken"
    ranks_file.write_bytes(ranks)
    tokenizer = load_tokenizer(ranks_file)
    hf = _auto_tokenizer(_export(tokenizer, tmp_path / "hf"))
    _check_ids_and_text(tokenizer, hf, TEXTS + SPECIAL_SPELLINGS + [
        "1234567 and 12 and 9999999999", "it's THEY'LL we've\n\n\n  x  \n", "zqx zqx zqxzqx",
        "CamelCaseWords HTTPServer don'T path/to/file\n/x"])
    assert hf("zqx zqx")["input_ids"] == [count, count + 1]
    assert hf.convert_tokens_to_ids("<|endofprompt|>") == endofprompt


def test_sentencepiece_unigram_gives_our_ids(tmp_path, tiny_byte_bpe):
    """Bug: a unigram model (train-tokenizer --model-type unigram) converted with the wrong
    scores, unknown-piece id or byte fallback.

    Texts that spell a control or byte piece (``</s>``, ``<0x41>``) are left out: a unigram
    model in ``tokenizers`` matches those pieces in the text, SentencePiece never does."""
    corpus = tmp_path / "train.jsonl"
    lines = [f"{line} {i}" for i in range(100) for line in TEXTS[-6:-4]] + UNICODE_TEXTS * 10
    corpus.write_text("".join(json.dumps({"text": t}) + "\n" for t in lines), encoding="utf-8")
    # coverage below 1: the rarer characters take the byte fallback
    model = train_tokenizer([str(corpus)], tmp_path / "uni", vocab_size=380,
                            model_type="unigram", character_coverage=0.98, num_threads=1)
    tokenizer = load_tokenizer(model)
    hf = _auto_tokenizer(_export(tokenizer, tmp_path / "hf"))
    _check_ids_and_text(tokenizer, hf, TEXTS)


def test_sentencepiece_decode_of_generated_pieces(tmp_path, tiny_tokenizer):
    """Bug: a continuation decoded differently from SentencePiece: the dummy prefix's space
    kept after a control token, a control token written out, an ASCII byte next to a broken
    multi-byte sequence turned into U+FFFD, or pieces of a split character lost."""
    tokenizer = load_tokenizer(tiny_tokenizer)
    hf = _auto_tokenizer(_export(tokenizer, tmp_path / "hf"))
    piece = {tokenizer.id_to_piece(i): i for i in range(tokenizer.vocab_size)}
    the, bos, eos = piece["▁the"], piece["<s>"], piece["</s>"]
    cases = [[bos, the, the], [the, eos, the], [piece["<0xE4>"], piece["<0x3C>"], the],
             [the, piece["<0xE4>"], piece["<0xB8>"]], [piece["<0x0A>"], the],
             [piece["<0xF0>"], piece["<0x9F>"], piece["<0x91>"], piece["<0x8D>"], the]]
    for ids in cases:
        assert hf.decode(ids, skip_special_tokens=True) == tokenizer.decode(ids), ids


def test_export_refuses_a_tokenizer_it_cannot_ship(tmp_path, bloom_like_tokenizer):
    """Bug: a tokenizer with more ids than the model's rows, or a SentencePiece model of a kind
    tokenizers cannot run (WORD), exported anyway or leaving a partial folder."""
    import sentencepiece as spm

    cfg = ModelConfig(vocab_size=256, hidden_size=16, num_layers=1, num_heads=2)
    state = build_model(cfg, seed=0).state_dict()
    with pytest.raises(UserError, match="65796 ids, the model's embedding 256 rows"):
        export_hf(state, cfg, tmp_path / "big", tokenizer=load_tokenizer(bloom_like_tokenizer))
    proto = io.BytesIO()
    spm.SentencePieceTrainer.Train(sentence_iterator=iter(TEXTS[5:] * 20), model_writer=proto,
                                   model_type="word", vocab_size=40, minloglevel=2,
                                   num_threads=1)
    (tmp_path / "word.model").write_bytes(proto.getvalue())
    with pytest.raises(UserError, match="word.model: a SentencePiece WORD model cannot"):
        export_hf(state, cfg, tmp_path / "word", tokenizer=load_tokenizer(tmp_path / "word.model"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["word.model"]


# -- end to end: trainer generate vs transformers' generate -----------------------------------
PROMPT = "The quick brown"
NEW_TOKENS = 12


@pytest.fixture(scope="module")
def trained(tmp_path_factory, tiny_tokenizer):
    """A tiny model trained a few steps on a SentencePiece corpus; its embedding (640 rows) has
    rows past the tokenizer's 512 ids and past the byte-level BPE's, which it also serves."""
    from bloomline.trainer.loop import Trainer

    folder = tmp_path_factory.mktemp("generate")
    lines = ["The quick brown fox jumps over the lazy dog.",
             "Return the number of items in the container.", *UNICODE_TEXTS]
    src = folder / "in.jsonl"
    src.write_text("".join(json.dumps({"text": f"{lines[i % 7]} {lines[(i + 1) % 7]}"}) + "\n"
                           for i in range(300)), encoding="utf-8")
    tokenize_corpus([str(src)], str(tiny_tokenizer), str(folder / "corpus" / "docs"),
                    show_progress=False)
    cfg = tiny_config(str(folder / "corpus"), folder / "run", model={"vocab_size": 640},
                      data={"tokenizer": str(tiny_tokenizer)},
                      train={"train_samples": 800, "log_interval": 1000})
    Trainer(cfg, log=lambda *_: None).run()
    (checkpoint,) = (folder / "run" / "checkpoints").iterdir()
    return checkpoint


def _cli(*commands: list) -> list[str]:
    """Run the commands at once (each starts a Python with torch: seconds) and return their
    outputs, in order."""
    running = [subprocess.Popen([str(a) for a in args], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True) for args in commands]
    outputs = []
    for args, process in zip(commands, running, strict=True):
        stdout, stderr = process.communicate(timeout=600)
        assert process.returncode == 0, f"{' '.join(map(str, args))}\n{stdout}\n{stderr}"
        outputs.append(stdout)
    return outputs


def _transformers_continuation(folder: Path) -> str:
    transformers = pytest.importorskip("transformers")
    model = transformers.BloomForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    hf = transformers.AutoTokenizer.from_pretrained(folder)
    prompt = hf(PROMPT, return_tensors="pt")
    with torch.no_grad():
        ids = model.generate(**prompt, max_new_tokens=NEW_TOKENS, do_sample=False)[0].tolist()
    # as trainer generate: the new ids decoded after the prompt's (SentencePiece drops the
    # first piece's space when decoding from the start)
    head = hf.decode(ids[: prompt["input_ids"].shape[1]], skip_special_tokens=True)
    return PROMPT + hf.decode(ids, skip_special_tokens=True)[len(head):]


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["sentencepiece", "byte-bpe"])
def test_transformers_generate_continues_as_trainer_generate(kind, trained, tmp_path,
                                                             tiny_byte_bpe):
    """Bug: the exported tokenizer and model do not work together in transformers: other
    prompt ids, an EOS/BOS id that stops or starts generation elsewhere, padded embedding rows
    that transformers may pick and ours never does, or text decoded otherwise."""
    transformers = pytest.importorskip("transformers")
    tokenizer = [] if kind == "sentencepiece" else ["--tokenizer", tiny_byte_bpe]
    out = tmp_path / "hf"
    said, ours = _cli(
        [BIN / "trainer", "export-hf", trained, out, *tokenizer],
        [BIN / "trainer", "generate", trained, "--prompt", PROMPT, "--max-new-tokens",
         NEW_TOKENS, *tokenizer])
    assert f"wrote {out} (model and " in said and "tokenizer.json" in said
    # the embedding's 640 rows: the 128 past the tokenizer's 512 ids are never generated
    generation = transformers.GenerationConfig.from_pretrained(out)
    assert generation.suppress_tokens == list(range(512, 640))
    ours = ours.removesuffix("\n")
    theirs = _transformers_continuation(out)
    print(f"{kind}: trainer generate {ours!r}\n{kind}: transformers     {theirs!r}")
    assert theirs == ours
    assert len(ours) > len(PROMPT)


@pytest.mark.slow
def test_export_without_a_tokenizer_says_so(corpus, tmp_path):
    """Bug: a checkpoint whose config has no data.tokenizer failing to export, or exporting
    without tokenizer files and without saying so."""
    from bloomline.trainer.loop import Trainer

    checkpoint = Trainer(tiny_config(corpus, tmp_path / "run"), log=lambda *_: None).save()
    out = tmp_path / "hf"
    (said,) = _cli([BIN / "trainer", "export-hf", checkpoint, out])
    assert said == f"wrote {out} (model only: the checkpoint's config has no data.tokenizer; " \
                   "pass --tokenizer to export one)\n"
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors"]
