"""Hostile inputs and tokenizer files: refused in one line naming the file (and line), never a
crash, a hang, an empty output that looks fine, or ids wrapped into other tokens' ids."""

from __future__ import annotations

import base64
import json
import os

import numpy as np
import pytest

from bloomline.common import UserError
from bloomline.dataprep import IndexedDataset, load_tokenizer, tokenize_corpus
from bloomline.dataprep.chunk_worker import encode_documents
from bloomline.dataprep.documents import BadInputError
from conftest import tiktoken_ranks, write_tiktoken_file

GOOD = b'{"text": "The quick brown fox jumps over the lazy dog."}\n'


def _tokenize(tmp_path, inputs, tokenizer, **options):
    options.setdefault("show_progress", False)
    return tokenize_corpus([str(i) for i in inputs], str(tokenizer),
                           str(tmp_path / "out" / "c"), **options)


def _one_line(err: pytest.ExceptionInfo) -> str:
    message = str(err.value)
    assert "\n" not in message, message
    return message


# -- FIFOs and devices among the inputs -------------------------------------------------------
def test_a_fifo_named_as_input_is_refused(tmp_path, tiny_tokenizer):
    """Bug: a FIFO named on the command line has size 0, so it read as an empty input (0
    documents, exit 0), or, compressed, blocked forever in open()."""
    os.mkfifo(tmp_path / "pipe.jsonl")
    with pytest.raises(UserError) as err:
        _tokenize(tmp_path, [tmp_path / "pipe.jsonl"], tiny_tokenizer)
    assert "pipe.jsonl: the input is a FIFO (named pipe)" in _one_line(err)


def test_a_fifo_found_walking_a_folder_is_refused(tmp_path, tiny_tokenizer):
    """Bug: a FIFO named like an input inside a folder was taken as an empty input (or blocked
    the reader) instead of being named."""
    (tmp_path / "raw").mkdir()
    (tmp_path / "raw" / "a.jsonl").write_bytes(GOOD)
    os.mkfifo(tmp_path / "raw" / "b.jsonl.zst")
    with pytest.raises(UserError) as err:
        _tokenize(tmp_path, [tmp_path / "raw"], tiny_tokenizer)
    assert "b.jsonl.zst: the input is a FIFO (named pipe)" in _one_line(err)


def test_a_fifo_input_on_the_command_line_exits_1_with_one_line(tmp_path, tiny_tokenizer, cli):
    """Bug: `dataprep tokenize PIPE.jsonl` exited 0 having written an empty corpus."""
    os.mkfifo(tmp_path / "pipe.jsonl")
    result = cli("tokenize", tmp_path / "pipe.jsonl", "--tokenizer", tiny_tokenizer,
                 "--output", tmp_path / "out" / "c", "--workers", "1", "--quiet")
    assert result.returncode == 1, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "FIFO" in lines[0]
    assert not (tmp_path / "out" / "c.bin").exists()


# -- JSON that Python's parser cannot hold ------------------------------------------------------
HOSTILE_JSON = {
    "arrays nested 100k deep": b'{"text": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
    "objects nested 100k deep": b'{"text": "x", "a": ' + b'{"a": ' * 100_000 + b"1"
                                + b"}" * 100_001,
    "a 100,001-digit number": b'{"text": "x", "n": ' + b"7" * 100_001 + b"}",
}


@pytest.mark.parametrize("case", list(HOSTILE_JSON))
def test_unparsable_json_is_a_named_bad_line(tmp_path, tiny_tokenizer, case):
    """Bug: a line nested 100k deep raised RecursionError, a 100,001-digit number ValueError
    (Python's int digit limit): a traceback from the worker, also with --skip-bad-lines."""
    (tmp_path / "bad.jsonl").write_bytes(GOOD + HOSTILE_JSON[case] + b"\n" + GOOD)
    with pytest.raises(BadInputError) as err:
        _tokenize(tmp_path, [tmp_path / "bad.jsonl"], tiny_tokenizer)
    assert _one_line(err).startswith(f"{tmp_path / 'bad.jsonl'}:2: ")
    summary = _tokenize(tmp_path, [tmp_path / "bad.jsonl"], tiny_tokenizer,
                        skip_bad_lines=True)
    assert summary.num_documents == 2 and summary.num_skipped == 1
    assert summary.skipped_messages[0].startswith(f"{tmp_path / 'bad.jsonl'}:2: ")


# -- a line too big to tokenize -------------------------------------------------------------------
def _big_inputs(tmp_path):
    """(file, what the message names) of a document of 3,000 bytes in each kind of input."""
    big = "y" * 3000
    (tmp_path / "a.jsonl").write_bytes(GOOD + json.dumps({"text": big}).encode() + b"\n")
    (tmp_path / "lines.txt").write_text(f"short line\n{big}\n")
    (tmp_path / "whole.txt").write_text(big)
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"text": ["short", big]}), tmp_path / "t.parquet")
    return [("a.jsonl", "a.jsonl:2: a line of 3,01"), ("lines.txt", "lines.txt:2: a line of 3,000"),
            ("whole.txt", "whole.txt: a file of 3,000"),
            ("t.parquet", "t.parquet: row 1: column 'text': a value of 3,000")]


def test_a_document_over_the_limit_is_named_before_it_is_tokenized(tmp_path, tiny_tokenizer):
    """Bug: a single 1 GB line went to the tokenizer, which died of std::bad_alloc, killing the
    worker with advice (--chunk-mb) that did not apply and no word of the file or line."""
    for name, message in _big_inputs(tmp_path):
        with pytest.raises(BadInputError) as err:
            _tokenize(tmp_path, [tmp_path / name], tiny_tokenizer, max_document_bytes=1000,
                      txt_per_line=name == "lines.txt")
        assert message in _one_line(err), name
        assert "--max-document-mb" in str(err.value)


def test_a_document_over_the_limit_is_skipped_with_skip_bad_lines(tmp_path, tiny_tokenizer):
    """Bug: with --skip-bad-lines an oversized line still reached the tokenizer (or killed the
    run) instead of being counted and skipped like any bad line."""
    inputs = [tmp_path / name for name, _ in _big_inputs(tmp_path) if name != "lines.txt"]
    summary = _tokenize(tmp_path, inputs, tiny_tokenizer, max_document_bytes=1000,
                        skip_bad_lines=True)
    assert summary.num_skipped == 3 and summary.num_documents == 2


def test_max_document_mb_on_the_command_line(tmp_path, tiny_tokenizer, cli):
    """Bug: the limit per document could not be set from the command line, and an oversized
    line was not one `error: FILE:LINE` line with exit 1."""
    (tmp_path / "a.jsonl").write_bytes(GOOD + b'{"text": "' + b"z" * 3000 + b'"}\n')
    result = cli("tokenize", tmp_path / "a.jsonl", "--tokenizer", tiny_tokenizer, "--output",
                 tmp_path / "out" / "c", "--workers", "1", "--quiet", "--max-document-mb",
                 "0.001")
    assert result.returncode == 1, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {tmp_path / 'a.jsonl'}:2: a line")


# -- outputs of zero tokens ---------------------------------------------------------------------
@pytest.fixture
def encodes_nothing(tmp_path):
    """A tokenizer.json whose BPE has no token for any letter (and no unk): every text
    encodes to no ids."""
    from tokenizers import Tokenizer, models

    folder = tmp_path / "nothing"
    folder.mkdir()
    Tokenizer(models.BPE(vocab={"</s>": 0}, merges=[])).save(str(folder / "tokenizer.json"))
    return folder


def test_a_tokenizer_that_encodes_nothing_is_an_error(tmp_path, encodes_nothing):
    """Bug: a tokenizer that encodes nothing gave '0 tokens, N empty documents' and exit 0."""
    (tmp_path / "a.jsonl").write_bytes(GOOD * 5)
    with pytest.raises(UserError) as err:
        _tokenize(tmp_path, [tmp_path / "a.jsonl"], encodes_nothing)
    assert _one_line(err).startswith(f"{encodes_nothing}: the tokenizer encoded all 5 documents")
    assert not (tmp_path / "out" / "c.bin").exists()


def test_inputs_without_documents_are_an_error(tmp_path, tiny_tokenizer):
    """Bug: inputs of blank lines only (or every line skipped) wrote an empty corpus, exit 0."""
    (tmp_path / "a.jsonl").write_bytes(b"\n\n")
    with pytest.raises(UserError) as err:
        _tokenize(tmp_path, [tmp_path / "a.jsonl"], tiny_tokenizer)
    assert "the inputs hold no documents" in _one_line(err)


def test_ids_outside_the_vocabulary_are_never_wrapped(tiny_tokenizer):
    """Bug: ids were cast to the token dtype unchecked: an id of 70,000 from a uint16
    vocabulary became 4,464, another token, silently."""
    tokenizer = load_tokenizer(tiny_tokenizer)

    class Wild(type(tokenizer)):
        def encode_batch(self, texts):
            return [np.array([1, 70_000], dtype=np.int32) for _ in texts]

    wild = Wild(str(tiny_tokenizer), None)
    with pytest.raises(UserError) as err:
        encode_documents(wild, ["a", "b"], append_eod=True)
    assert "gave id 70,000, outside its vocabulary [0, 512)" in _one_line(err)


# -- tokenizer files ------------------------------------------------------------------------------
def _ranks_file(tmp_path, extra: bytes = b"", keep: bool = True):
    folder = tmp_path / "tk"
    folder.mkdir(exist_ok=True)
    path = write_tiktoken_file(folder / "r50k_base.tiktoken", tiktoken_ranks(["hello"]))
    path.write_bytes((path.read_bytes() if keep else b"") + extra)
    return path


@pytest.mark.parametrize(("extra", "keep", "message"), [
    (b"", False, "r50k_base.tiktoken: holds no ranks"),
    (base64.b64encode(b"hel") + b" 300\n", True, "r50k_base.tiktoken:261: token b'hel' again "
                                                 "(first on line 258)"),
    (base64.b64encode(b"zz") + b" 258\n", True, "r50k_base.tiktoken:261: rank 258 again "
                                                "(first on line 259)"),
    (base64.b64encode(b"zz") + b" %d\n" % 2**40, True, "r50k_base.tiktoken:261: rank "
                                                        "1099511627776 is outside"),
    (base64.b64encode(b"zz") + b" -3\n", True, "r50k_base.tiktoken:261: rank -3 is outside"),
    (base64.b64encode(b"zz") + b" 50256\n", True, "rank 50256 is also the id of r50k_base's "
                                                  "special token '<|endoftext|>'"),
])
def test_a_bad_tiktoken_file_is_one_line(tmp_path, extra, keep, message):
    """Bug: an empty ranks file raised a bare ValueError, a rank of 2**40 an OverflowError, and a
    repeated token or rank (or one on a special token's id) loaded silently with ids that
    mean something else."""
    pytest.importorskip("tiktoken")
    with pytest.raises(UserError) as err:
        load_tokenizer(_ranks_file(tmp_path, extra, keep))
    assert message in _one_line(err)


@pytest.mark.parametrize("token_id", [2**31, -1])
def test_a_tokenizer_json_id_beyond_int32_is_one_line(tmp_path, token_id):
    """Bug: a tokenizer.json id of 2**31 loaded (the library reads ids as u32) and would wrap
    to a negative id in int32 token files."""
    from tokenizers import Tokenizer, models

    tokenizer = Tokenizer(models.WordLevel(vocab={"a": 0, "</s>": 1, "<unk>": 2},
                                           unk_token="<unk>"))
    content = json.loads(tokenizer.to_str())
    content["model"]["vocab"]["far"] = token_id
    (tmp_path / "tokenizer.json").write_text(json.dumps(content, indent=1))
    with pytest.raises(UserError) as err:
        load_tokenizer(tmp_path / "tokenizer.json")
    message = _one_line(err)
    assert message.startswith(f"{tmp_path / 'tokenizer.json'}: ")
    assert ("token 'far' has id 2,147,483,648" in message if token_id > 0
            else "integer `-1`" in message)


# -- output prefixes given with a suffix --------------------------------------------------------
def test_tokenize_output_with_a_suffix_is_the_prefix(tmp_path, tiny_tokenizer):
    """Bug: --output corpus/c.bin wrote c.bin/c.idx beside c.bin.fingerprint.json, and said
    it wrote c.bin.bin/.idx."""
    (tmp_path / "a.jsonl").write_bytes(GOOD)
    summary = tokenize_corpus([str(tmp_path / "a.jsonl")], str(tiny_tokenizer),
                              str(tmp_path / "out" / "c.bin"), show_progress=False)
    assert summary.outputs == {"text": str(tmp_path / "out" / "c")}
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "c.bin", "c.fingerprint.json", "c.idx"]


def test_merge_output_with_a_suffix_is_the_prefix(tmp_path, tiny_tokenizer, cli):
    """Bug: `dataprep merge --output X.idx` said it wrote X.idx.bin/.idx and left
    X.idx.fingerprint.json beside X.bin/X.idx."""
    (tmp_path / "a.jsonl").write_bytes(GOOD)
    _tokenize(tmp_path, [tmp_path / "a.jsonl"], tiny_tokenizer)
    result = cli("merge", tmp_path / "out" / "c", "--output", tmp_path / "m" / "all.idx")
    assert result.returncode == 0, result.stderr
    assert f"writing {tmp_path / 'm' / 'all'}.bin/.idx" in result.stderr
    assert f"wrote {tmp_path / 'm' / 'all'}.bin/.idx" in result.stdout
    assert sorted(p.name for p in (tmp_path / "m").iterdir()) == [
        "all.bin", "all.fingerprint.json", "all.idx"]
    assert len(IndexedDataset(tmp_path / "m" / "all")) == 1
