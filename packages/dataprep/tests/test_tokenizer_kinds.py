"""The tokenizers users already have: Hugging Face tokenizer.json and tiktoken, beside
SentencePiece. Ids must be the library's own, files must record which tokenizer made them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from bloomline.common import UserError
from bloomline.dataprep import IndexedDataset, load_tokenizer, tokenize_corpus
from bloomline.dataprep.build_index import find_datasets
from bloomline.dataprep.fingerprint import read_fingerprint
from bloomline.dataprep.indexed_dataset import merge_indexed_datasets
from conftest import UNICODE_TEXTS

# documents that also spell special tokens, hold control characters, leading and repeated
# whitespace, and a long repetitive run
DOCUMENTS = [*UNICODE_TEXTS, "  leading spaces, trailing newline\n", "tabs\t\tand\r\nCRLF",
             "spells </s> and <|endoftext|> and <s> inside the text", "x" * 3000,
             "Return the number of items in the container. 12345 + 678 = 13023", "é"]


def _write_jsonl(path, texts):
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts), encoding="utf-8")
    return path


def _library_ids(tokenizer_json, texts):
    from tokenizers import Tokenizer as RustTokenizer

    library = RustTokenizer.from_file(str(tokenizer_json))
    return [library.encode(t).ids for t in texts]


# -- Hugging Face tokenizer.json --------------------------------------------------------------
@pytest.mark.parametrize("fixture", ["tiny_byte_bpe", "bloom_like_tokenizer"])
def test_tokenizer_json_ids_are_the_librarys_own_encode(fixture, request):
    """Catches: ids that differ from tokenizers' encode (offsets/special-token handling, a
    truncation or padding setting in the file, a dtype that wraps ids above 65,535)."""
    spec = request.getfixturevalue(fixture)
    tok = load_tokenizer(spec)
    tokenizer_json = spec / "tokenizer.json" if spec.is_dir() else spec
    ours = tok.encode_batch(DOCUMENTS)
    assert [list(map(int, ids)) for ids in ours] == _library_ids(tokenizer_json, DOCUMENTS)
    # text without special-token spellings round-trips exactly (byte-level: nothing is lost)
    for text, ids in zip(DOCUMENTS, ours, strict=True):
        if "<" not in text:
            assert tok.decode(ids) == text
    assert tok.kind == "huggingface" and tok.eod_id == 2
    assert tok.special_ids == {"unk": 0, "bos": 1, "eod": 2, "pad": 3}


@pytest.mark.slow
def test_bloom_like_corpus_is_int32_megatron_readable_and_identical_over_workers(
        tmp_path, bloom_like_tokenizer):
    """Catches: ids above 65,535 written as uint16 (BLOOM's vocabulary wraps), per-worker
    differences in the tokenizer's threads, documents out of order, a missing EOD, and token
    files Megatron's IndexedDataset reads differently."""
    src = _write_jsonl(tmp_path / "in.jsonl", DOCUMENTS * 3)
    for workers in (1, 2):
        tokenize_corpus([str(src)], str(bloom_like_tokenizer), str(tmp_path / f"w{workers}"),
                        workers=workers, show_progress=False, max_chunk_bytes=4096)
    assert (tmp_path / "w1.bin").read_bytes() == (tmp_path / "w2.bin").read_bytes()
    assert (tmp_path / "w1.idx").read_bytes() == (tmp_path / "w2.idx").read_bytes()
    ours = IndexedDataset(tmp_path / "w2")
    assert ours.dtype == np.int32
    expected = [ids + [2] for ids in _library_ids(bloom_like_tokenizer, DOCUMENTS * 3)]
    assert [list(map(int, ours[i])) for i in range(len(ours))] == expected
    assert max(max(ids) for ids in expected) > 65_535
    record = read_fingerprint(tmp_path / "w2")
    assert record["tokenizer"]["kind"] == "huggingface"
    assert record["tokenizer"]["vocab_size"] == 65_796 and record["tokenizer"]["eod_id"] == 2

    mcore = pytest.importorskip("megatron.core.datasets.indexed_dataset")
    theirs = mcore.IndexedDataset(str(tmp_path / "w2"), mmap=True)
    assert len(theirs) == len(ours)
    for i in range(len(ours)):
        np.testing.assert_array_equal(theirs[i], ours[i])


def test_train_byte_bpe_layout_round_trip_and_no_clobber(tmp_path, tiny_byte_bpe):
    """Catches: special tokens at other ids than BLOOM's (the trainer and export rely on
    them), a tokenizer that loses characters it never saw, and a second run overwriting."""
    from bloomline.dataprep import train_tokenizer

    config = json.loads((tiny_byte_bpe / "tokenizer_config.json").read_text())
    assert config["eos_token"] == "</s>" and config["pad_token"] == "<pad>"
    tok = load_tokenizer(tiny_byte_bpe)
    assert tok.vocab_size == 512
    assert [tok.id_to_piece(i) for i in range(4)] == ["<unk>", "<s>", "</s>", "<pad>"]
    unseen = "Runes ᚠᚢᚦ, math 𝔘𝔫𝔦𝔠𝔬𝔡𝔢, fullwidth ＡＢＣ,   three spaces"
    for text in [*UNICODE_TEXTS, unseen]:
        ids = tok.encode_batch([text])[0]
        assert 0 not in ids and tok.decode(ids) == text
    src = _write_jsonl(tmp_path / "in.jsonl", ["some text"])
    with pytest.raises(UserError, match="output exists; pass --overwrite"):
        train_tokenizer([str(src)], tiny_byte_bpe, 300, kind="byte-bpe")
    with pytest.raises(UserError, match="--kind wordpiece: expected one of"):
        train_tokenizer([str(src)], tmp_path / "x", 300, kind="wordpiece")


# -- tiktoken ---------------------------------------------------------------------------------
def _tiktoken_reference(ranks_file):
    import tiktoken
    from tiktoken.load import load_tiktoken_bpe
    from tiktoken_ext.openai_public import r50k_pat_str

    return tiktoken.Encoding("reference", pat_str=r50k_pat_str,
                             mergeable_ranks=load_tiktoken_bpe(str(ranks_file)),
                             special_tokens={"<|endoftext|>": 50256})


def test_tiktoken_file_ids_are_encode_ordinary(tiny_tiktoken):
    """Catches: ids other than tiktoken's, a special-token spelling inside a document turned
    into the special id (or raising), and the wrong EOD or vocabulary size."""
    pytest.importorskip("tiktoken")
    tok = load_tokenizer(tiny_tiktoken)
    reference = _tiktoken_reference(tiny_tiktoken)
    ours = tok.encode_batch(DOCUMENTS)
    assert [list(map(int, ids)) for ids in ours] == [reference.encode_ordinary(t)
                                                     for t in DOCUMENTS]
    assert tok.kind == "tiktoken" and tok.eod_id == 50256 and tok.vocab_size == 50257
    assert all(tok.decode(ids) == text for text, ids in zip(DOCUMENTS, ours, strict=True))
    assert tok.decode([*ours[0], 50256]) == DOCUMENTS[0]  # EOD decodes to nothing


def _run_dataprep(args, env):
    return subprocess.run([sys.executable, "-m", "bloomline.dataprep.cli", *map(str, args)],
                          capture_output=True, text=True, env=env, timeout=120)


@pytest.mark.slow
def test_tiktoken_name_loads_from_the_cache_and_never_downloads(tmp_path, tiny_tiktoken):
    """Catches: a tiktoken name that goes to the network (hangs or fails on offline nodes)
    instead of tiktoken's cache, and a missing cache entry failing with a traceback."""
    pytest.importorskip("tiktoken")
    import hashlib

    # a tiktoken plugin encoding, as a company's own encodings are shipped: ranks at a URL,
    # fetched through tiktoken's cache
    url = "https://encodings.invalid/bloomline_test.tiktoken"
    data = tiny_tiktoken.read_bytes()
    plugin = tmp_path / "plugin" / "tiktoken_ext"
    plugin.mkdir(parents=True)
    (plugin / "bloomline_test.py").write_text(textwrap.dedent(f'''
        from tiktoken.load import load_tiktoken_bpe
        from tiktoken_ext.openai_public import r50k_pat_str

        def bloomline_test():
            return {{"name": "bloomline_test", "pat_str": r50k_pat_str,
                     "mergeable_ranks": load_tiktoken_bpe({url!r},
                         expected_hash={hashlib.sha256(data).hexdigest()!r}),
                     "special_tokens": {{"<|endoftext|>": 50256}}}}

        ENCODING_CONSTRUCTORS = {{"bloomline_test": bloomline_test}}
        '''))
    cache = tmp_path / "cache"
    cache.mkdir()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path / "plugin"),
                                                      os.environ.get("PYTHONPATH", "")]),
               TIKTOKEN_CACHE_DIR=str(cache), PYTHONWARNINGS="ignore")
    src = _write_jsonl(tmp_path / "in.jsonl", DOCUMENTS)
    missing = _run_dataprep(["tokenize", src, "--tokenizer", "tiktoken:bloomline_test",
                             "--output", tmp_path / "out" / "c", "--workers", "1"], env)
    assert missing.returncode == 1
    assert missing.stderr.count("\n") == 1 and "not in tiktoken's cache" in missing.stderr
    assert not (tmp_path / "out" / "c.bin").exists()

    (cache / hashlib.sha1(url.encode()).hexdigest()).write_bytes(data)
    cached = _run_dataprep(["tokenize", src, "--tokenizer", "tiktoken:bloomline_test",
                            "--output", tmp_path / "out" / "c", "--workers", "2"], env)
    assert cached.returncode == 0, cached.stderr
    reference = _tiktoken_reference(tiny_tiktoken)
    ds = IndexedDataset(tmp_path / "out" / "c")
    assert [list(map(int, ds[i])) for i in range(len(ds))] == [
        reference.encode_ordinary(t) + [50256] for t in DOCUMENTS]


# -- bad input and fingerprints ---------------------------------------------------------------
def test_unknown_tokenizer_files_fail_with_one_line(tmp_path):
    """Catches: a file of no known kind reaching a library (a protobuf or serde traceback)."""
    (tmp_path / "vocab.bin").write_bytes(bytes(range(256)))
    (tmp_path / "empty").mkdir()
    (tmp_path / "other.json").write_text('{"vocab": {}}')
    (tmp_path / "bad.tiktoken").write_text("aGVsbG8= 0\nnot base64 at all\n")
    (tmp_path / "cl100k_base.tiktoken").write_text("aGVsbG8= 0\nnot base64 at all\n")
    cases = {
        "vocab.bin": "not a tokenizer file of a kind we read",
        "empty": "a folder without tokenizer.json or tokenizer.model",
        "other.json": "not a tokenizer.json the tokenizers library reads",
        "bad.tiktoken": "the file name must be an encoding tiktoken knows",
        "cl100k_base.tiktoken": "cl100k_base.tiktoken:2: not a tiktoken ranks line",
        "nothing-here": "tokenizer not found",
    }
    for name, message in cases.items():
        with pytest.raises(UserError, match=message) as info:
            load_tokenizer(tmp_path / name)
        assert "\n" not in str(info.value)


def _tokenizer_without_end_of_text(path):
    from tokenizers import Tokenizer, models, pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tokenizer = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.add_special_tokens(["<|sep|>"])
    tokenizer.save(str(path))
    return path


@pytest.mark.slow
def test_tokenizer_json_without_end_of_text_needs_eod_token(tmp_path, cli):
    """Catches: documents silently written without an EOD (or with id 0) when the tokenizer
    has no end-of-text token, and --eod-token not taken."""
    spec = _tokenizer_without_end_of_text(tmp_path / "tokenizer.json")
    src = _write_jsonl(tmp_path / "in.jsonl", ["one document", "two"])
    result = cli("tokenize", src, "--tokenizer", spec, "--output", tmp_path / "out" / "c")
    assert result.returncode == 1 and result.stderr.count("\n") == 1
    assert "no end-of-text token" in result.stderr and "--eod-token TOKEN" in result.stderr
    assert not (tmp_path / "out" / "c.bin").exists()
    result = cli("tokenize", src, "--tokenizer", spec, "--output", tmp_path / "out" / "c",
                 "--eod-token", "<|sep|>", "--workers", "1")
    assert result.returncode == 0, result.stderr
    sep = load_tokenizer(spec).backend.token_to_id("<|sep|>")
    ds = IndexedDataset(tmp_path / "out" / "c")
    assert [int(ds[i][-1]) for i in range(len(ds))] == [sep, sep]
    assert read_fingerprint(tmp_path / "out" / "c")["tokenizer"]["eod_id"] == sep
    with pytest.raises(UserError, match="--eod-token '<eos>' is not in its vocabulary"):
        load_tokenizer(spec, eod_token="<eos>")


def test_fingerprint_follows_the_vocabulary_not_the_file(tmp_path, tiny_byte_bpe,
                                                         tiny_tokenizer):
    """Catches: a re-saved tokenizer.json (other formatting) taken for another tokenizer, or
    two different vocabularies taken for the same one."""
    original = load_tokenizer(tiny_byte_bpe)
    resaved = tmp_path / "tokenizer.json"
    resaved.write_text(json.dumps(json.loads((tiny_byte_bpe / "tokenizer.json").read_text())))
    assert resaved.read_bytes() != (tiny_byte_bpe / "tokenizer.json").read_bytes()
    assert load_tokenizer(resaved).fingerprint() == original.fingerprint()
    assert load_tokenizer(tiny_tokenizer).fingerprint() != original.fingerprint()


def test_blends_and_merges_refuse_files_of_different_tokenizers(tmp_path, tiny_tokenizer,
                                                                tiny_byte_bpe):
    """Catches: two corpora tokenized with different 512-entry tokenizers (same uint16 dtype,
    so only the fingerprint tells them apart) blended or merged into nonsense."""
    src = _write_jsonl(tmp_path / "in.jsonl", DOCUMENTS)
    corpus = tmp_path / "corpus"
    tokenize_corpus([str(src)], str(tiny_tokenizer), str(corpus / "sp"), show_progress=False)
    tokenize_corpus([str(src)], str(tiny_byte_bpe), str(corpus / "bpe"), show_progress=False)
    with pytest.raises(UserError, match="tokenized with .* token files used together must "
                                        "come from one tokenizer") as info:
        find_datasets(corpus)
    assert "sentencepiece tiny.model" in str(info.value) and "huggingface tok" in str(
        info.value)
    with pytest.raises(UserError, match="must come from one tokenizer"):
        merge_indexed_datasets([corpus / "sp", corpus / "bpe"], tmp_path / "merged")
    assert not list(tmp_path.glob("merged*"))
    merged = merge_indexed_datasets([corpus / "sp", corpus / "sp"], tmp_path / "merged")
    assert len(merged) == 2 * len(DOCUMENTS)
    assert read_fingerprint(tmp_path / "merged") == read_fingerprint(corpus / "sp")
