"""INPUT arguments that name one file twice: the file is read once, at its first place, and
a ``warning:`` line names the overlap."""

from __future__ import annotations

import json
import os

import pytest

from bloomline.dataprep import IndexedDataset, tokenize_corpus
from bloomline.dataprep.sources import expand_inputs


@pytest.fixture
def multi(tmp_path, monkeypatch):
    """raw/multi/{more,seeds}.jsonl and a link raw/link.jsonl -> multi/seeds.jsonl, with the
    working directory at tmp_path so that the paths are those a user types."""
    folder = tmp_path / "raw" / "multi"
    folder.mkdir(parents=True)
    for name, count in (("seeds", 3), ("more", 2)):
        (folder / f"{name}.jsonl").write_text(
            "".join(json.dumps({"text": f"{name} document {i}"}) + "\n" for i in range(count)))
    os.symlink("multi/seeds.jsonl", tmp_path / "raw" / "link.jsonl")
    monkeypatch.chdir(tmp_path)
    return folder


CASES = {
    "file after its folder": (["raw/multi", "raw/multi/seeds.jsonl"],
                              "raw/multi/seeds.jsonl: also inside raw/multi; read once"),
    "folder after its file": (["raw/multi/seeds.jsonl", "raw/multi"],
                              "raw/multi/seeds.jsonl: also inside raw/multi; read once"),
    "./x and x": (["raw/multi/seeds.jsonl", "./raw/multi/seeds.jsonl"],
                  "./raw/multi/seeds.jsonl: the same file as raw/multi/seeds.jsonl; read once"),
    "a link and its target": (["raw/multi/seeds.jsonl", "raw/link.jsonl"],
                              "raw/link.jsonl: the same file as raw/multi/seeds.jsonl (a link "
                              "to it); read once"),
    "a folder twice": (["raw/multi", "raw/multi/"],
                       "raw/multi/: all 2 of its files were given before (in raw/multi)"),
    "overlapping globs": (["raw/multi/*.jsonl", "raw/multi/s*.jsonl"],
                          "raw/multi/seeds.jsonl: also inside raw/multi/*.jsonl; read once"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_file_named_twice_is_read_once_with_a_line(multi, capsys, case):
    """Bug: `dataprep tokenize raw/multi raw/multi/seeds.jsonl` (or ./x and x, a link and its
    target, one folder twice) tokenizes the file twice, doubling its documents in the corpus
    without a word."""
    arguments, line = CASES[case]
    sources = expand_inputs(arguments)
    paths = [os.path.realpath(s.path) for s in sources]
    assert len(paths) == len(set(paths))  # each file once
    assert os.path.realpath("raw/multi/seeds.jsonl") in paths
    err = capsys.readouterr().err
    assert err.count("warning:") == 1 and f"warning: {line}" in err, err


def test_the_first_place_is_kept_and_the_corpus_holds_each_document_once(multi, capsys,
                                                                        tiny_tokenizer):
    """Bug: the repeated file's documents written twice into the token file, or the file
    moved to its last place (the output order is the arguments' order)."""
    tokenize_corpus(["raw/multi/seeds.jsonl", "raw/multi"], str(tiny_tokenizer), "out/a",
                    show_progress=False)
    assert [s.path for s in expand_inputs(["raw/multi/seeds.jsonl", "raw/multi"])] == [
        "raw/multi/seeds.jsonl", "raw/multi/more.jsonl"]
    assert IndexedDataset("out/a").num_documents == 5  # 3 seeds + 2 more, not 8
    assert capsys.readouterr().err.startswith(
        "warning: raw/multi/seeds.jsonl: also inside raw/multi; read once")


def test_distinct_files_give_no_warning(multi, capsys):
    """Bug: a warning for files that only share a folder or a name pattern."""
    assert len(expand_inputs(["raw/multi/seeds.jsonl", "raw/multi/more.jsonl"])) == 2
    assert capsys.readouterr().err == ""
