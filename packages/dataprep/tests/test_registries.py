"""The two registries of dataprep: tokenizer kinds (tokenizer/registry.py) and input formats
(formats/registry.py), and the seams a kind or a format plugs into."""

from __future__ import annotations

import pickle
import shutil

import pytest

from bloomline.dataprep.formats import FORMATS, SUPPORTED_SUFFIXES, format_of_file
from bloomline.dataprep.formats.base import Format
from bloomline.dataprep.tokenizer import (
    KINDS,
    TOKENIZER_SPEC_HELP,
    Tokenizer,
    load_tokenizer,
    tokenizer_kind,
)


def test_every_tokenizer_kind_has_help_detection_and_an_export():
    """Catches: a kind registered without a --tokenizer help text (the nine option helps would
    not name it), without any way to be recognised, or without a Hugging Face export, which
    `trainer export-hf` would only find out at the end of a training run."""
    for name, kind in KINDS.items():
        assert kind.kind == name
        assert kind.spec_help and kind.spec_help in TOKENIZER_SPEC_HELP
        recognised = (kind.suffixes or kind.folder_file
                      or kind.claims_name.__func__ is not Tokenizer.claims_name.__func__
                      or kind.sniff.__func__ is not Tokenizer.sniff.__func__)
        assert recognised, name
        assert kind.to_tokenizer_json is not Tokenizer.to_tokenizer_json, name


def test_a_pickled_tokenizer_reloads_what_the_parent_loaded(tmp_path, tiny_tokenizer,
                                                           tiny_byte_bpe):
    """Catches: Tokenizer.__reduce__ rebuilding from the spec as given instead of the file it
    resolved to (a folder holding a tokenizer.model is no file the SentencePiece class reads),
    or losing the spec that messages and the fingerprint record's name show."""
    folder = tmp_path / "sp_folder"
    folder.mkdir()
    shutil.copy(tiny_tokenizer, folder / "tokenizer.model")
    for spec in (str(folder), str(tiny_byte_bpe)):
        tokenizer = load_tokenizer(spec, "")
        copy = pickle.loads(pickle.dumps(tokenizer))
        assert type(copy) is type(tokenizer)
        assert (copy.spec, copy.target, copy.eod_token) == (spec, tokenizer.target, None)
        assert copy.fingerprint() == tokenizer.fingerprint()
        assert copy.describe() == tokenizer.describe()


def test_a_file_named_like_no_kind_is_told_by_its_first_bytes(tmp_path, tiny_tokenizer,
                                                               tiny_byte_bpe):
    """Catches: the sniffing order changed by the registry (a tokenizer.json renamed must be
    read as JSON, a .model renamed as SentencePiece) and an unreadable file's one-line
    error."""
    model = tmp_path / "model.bin"
    model.write_bytes(tiny_tokenizer.read_bytes())
    as_json = tmp_path / "tok.txt"
    as_json.write_bytes((tiny_byte_bpe / "tokenizer.json").read_bytes())
    assert tokenizer_kind(model) == ("sentencepiece", str(model))
    assert tokenizer_kind(as_json) == ("huggingface", str(as_json))
    junk = tmp_path / "junk.dat"
    junk.write_bytes(b"\x00junk")
    with pytest.raises(Exception, match="not a tokenizer file of a kind we read"):
        tokenizer_kind(junk)


def test_every_format_is_complete_and_suffixes_resolve_to_it():
    """Catches: a format registered without a chunk maker or a document reader (a job with
    its files would fail only in the workers), and a suffix read as another format or
    compression (``x.jsonl.zst`` as plain JSON lines)."""
    for name, fmt in FORMATS.items():
        assert fmt.name == name
        assert type(fmt).chunks is not Format.chunks, name
        assert type(fmt).documents is not Format.documents, name
        for suffix, compression in fmt.suffixes.items():
            assert format_of_file(f"corpus/part-0{suffix.upper()}") == (fmt, compression)
    assert len(set(SUPPORTED_SUFFIXES)) == len(SUPPORTED_SUFFIXES)
    assert format_of_file("corpus/notes.md") is None
