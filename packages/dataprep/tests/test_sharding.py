"""``dataprep tokenize --shard K/N`` and ``dataprep merge``: the N parts of a job, merged in
shard order, are the single run's bytes; the plan tiles every input exactly once and splits
the bytes evenly; line numbers stay the file's; merge refuses parts that do not belong
together, before it writes anything."""

from __future__ import annotations

import importlib
import json
import random
import shutil
from pathlib import Path

import pytest
import zstandard

from bloomline.common import UserError
from bloomline.dataprep import IndexedDataset, load_tokenizer, tokenize_corpus
from bloomline.dataprep.sharding import parse_shard, shard_record_path, shard_sources
from bloomline.dataprep.sources import Source, expand_inputs, read_line_range

WORDS = ("the quick brown fox jumps over a lazy dog return items of the container memory "
         "mapped token files Привет мир 東京 👍🏽 café naïve").split()


def _texts(seed: int, count: int, low: int = 3, high: int = 150) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(low, high)))
            for _ in range(count)]


def _jsonl(texts: list[str]) -> bytes:
    return "".join(json.dumps({"text": t}, ensure_ascii=False) + "\n" for t in texts).encode()


def _write_parquet(path: Path, texts: list[str], row_group_size: int) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"id": list(range(len(texts))), "text": texts}), path,
                   row_group_size=row_group_size)


def _write_mixed_corpus(folder: Path) -> list[Path]:
    """Every kind of unit, in one argument list: Parquet row groups, a plain JSON-lines file
    of ~390 KB (cut by bytes), a whole .zst file, a folder of one-document .txt files (one of
    them empty), a save_to_disk folder (cut by rows), a zero-byte file, a small plain file."""
    import datasets

    datasets.disable_progress_bars()
    folder.mkdir(parents=True)
    _write_parquet(folder / "c.parquet", _texts(3, 600), row_group_size=40)
    (folder / "a.jsonl").write_bytes(_jsonl(_texts(1, 800)))
    (folder / "b.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(
        _jsonl(_texts(2, 60))))
    (folder / "txt").mkdir()
    (folder / "txt" / "t0.txt").write_text("One whole document.\nTwo lines of it.\n")
    (folder / "txt" / "t1_empty.txt").write_bytes(b"")
    (folder / "txt" / "t2.txt").write_text(" ".join(_texts(5, 20)))
    datasets.Dataset.from_dict({"text": _texts(4, 300)}).save_to_disk(str(folder / "d_hf"))
    (folder / "f_empty.jsonl").write_bytes(b"")
    (folder / "g.jsonl").write_bytes(_jsonl(_texts(6, 40)))
    return [folder / name for name in ("c.parquet", "a.jsonl", "b.jsonl.zst", "txt", "d_hf",
                                       "f_empty.jsonl", "g.jsonl")]


def _tokenize(inputs, tokenizer, output, **kwargs):
    return tokenize_corpus([str(p) for p in inputs], str(tokenizer), str(output),
                           show_progress=False, **kwargs)


def _tokenize_parts(inputs, tokenizer, folder: Path, count: int, **kwargs) -> list[Path]:
    prefixes = [folder / f"part{k:02d}" for k in range(count)]
    for k, prefix in enumerate(prefixes):
        _tokenize(inputs, tokenizer, prefix, shard=(k, count), **kwargs)
    return prefixes


def _assert_same_bytes(prefix_a, prefix_b) -> None:
    for suffix in (".bin", ".idx"):
        a, b = Path(f"{prefix_a}{suffix}"), Path(f"{prefix_b}{suffix}")
        assert a.read_bytes() == b.read_bytes(), f"{a} != {b}"


def _documents(prefix) -> list[list[int]]:
    ds = IndexedDataset(prefix)
    ds.verify()
    return [[int(t) for i in range(ds.document_indices[d], ds.document_indices[d + 1])
             for t in ds[i]] for d in range(ds.num_documents)]


def _expected(tokenizer_path, texts: list[str]) -> list[list[int]]:
    tok = load_tokenizer(tokenizer_path)
    return [[int(i) for i in ids] + ([tok.eod_id] if len(ids) else [])
            for ids in tok.encode_batch(texts)]


def _cut_paths(inputs, count: int, txt_per_line: bool = False) -> set[str]:
    """The inputs that more than one shard of ``count`` reads a piece of."""
    sources = expand_inputs([str(p) for p in inputs])
    holders: dict[str, int] = {}
    for k in range(count):
        for part in shard_sources(sources, k, count, txt_per_line):
            holders[part.path] = holders.get(part.path, 0) + 1
    return {path for path, n in holders.items() if n > 1}


def _merge(dataprep, prefixes, output) -> str:
    code, out, err = dataprep("merge", *prefixes, "--output", output)
    assert code == 0, err
    return out


# ----------------------------------------------------------------------------- identity


@pytest.fixture(scope="module")
def mixed(tmp_path_factory, tiny_tokenizer) -> dict:
    """The mixed corpus and its single run (one worker, 16 KiB chunks)."""
    folder = tmp_path_factory.mktemp("mixed")
    inputs = _write_mixed_corpus(folder / "in")
    summary = _tokenize(inputs, tiny_tokenizer, folder / "single", max_chunk_bytes=16 << 10)
    return {"inputs": inputs, "single": folder / "single", "summary": summary}


@pytest.mark.parametrize("count", [1, 2, 3, 7])
def test_parts_merged_in_order_are_the_single_run_bytes(mixed, tiny_tokenizer, tmp_path,
                                                        dataprep, count):
    """Bug: a document lost or duplicated where a shard boundary cuts a JSON-lines file, a
    Parquet file or a dataset folder; a whole-file unit (.zst, one-document .txt, an empty
    one) in no shard or in two; parts that merge out of input order."""
    if count == 7:  # the boundaries really fall inside every kind of cuttable input
        assert {"a.jsonl", "c.parquet", "d_hf"} <= {
            Path(p).name for p in _cut_paths(mixed["inputs"], count)}
    parts = _tokenize_parts(mixed["inputs"], tiny_tokenizer, tmp_path, count,
                            max_chunk_bytes=16 << 10)
    out = _merge(dataprep, parts, tmp_path / "merged")
    _assert_same_bytes(tmp_path / "merged", mixed["single"])
    # 600 Parquet rows + 800 + 60 lines + 3 .txt files (one empty) + 300 rows + 40 lines
    assert IndexedDataset(tmp_path / "merged").num_documents == 1803
    assert mixed["summary"].num_empty == {"text": 1}
    assert f"{count} parts on 1 host(s): 1,803 documents" in out


@pytest.mark.slow
def test_parts_with_other_chunks_match_a_run_with_two_workers(mixed, tiny_tokenizer,
                                                               tmp_path, dataprep):
    """Bug: a part's output that depends on its chunk size, or a plan that differs from the
    chunking of a multi-worker single run (the bytes must depend on neither)."""
    _tokenize(mixed["inputs"], tiny_tokenizer, tmp_path / "single2", workers=2,
              max_chunk_bytes=24 << 10)
    parts = _tokenize_parts(mixed["inputs"], tiny_tokenizer, tmp_path, 3, max_chunk_bytes=5000)
    _merge(dataprep, parts, tmp_path / "merged")
    _assert_same_bytes(tmp_path / "merged", tmp_path / "single2")
    _assert_same_bytes(tmp_path / "merged", mixed["single"])


def test_more_shards_than_units_leaves_empty_parts_that_still_merge(tiny_tokenizer, tmp_path,
                                                                     dataprep):
    """Bug: a shard that owns no unit fails, writes no part (so the job cannot be merged),
    or picks up a neighbour's unit."""
    folder = tmp_path / "in"
    folder.mkdir()
    texts = _texts(7, 6, low=30, high=60)
    (folder / "a.jsonl").write_bytes(_jsonl(texts[:4]))
    (folder / "b.txt").write_text("a single text file")
    _write_parquet(folder / "c.parquet", texts[4:], row_group_size=1)
    inputs = [folder / "a.jsonl", folder / "b.txt", folder / "c.parquet"]
    _tokenize(inputs, tiny_tokenizer, tmp_path / "single", max_chunk_bytes=64)
    parts = _tokenize_parts(inputs, tiny_tokenizer, tmp_path / "parts", 40, max_chunk_bytes=64)
    counts = [IndexedDataset(p).num_documents for p in parts]
    assert counts.count(0) > 20 and sum(counts) == 7
    out = _merge(dataprep, parts, tmp_path / "merged")
    _assert_same_bytes(tmp_path / "merged", tmp_path / "single")
    assert "40 parts on 1 host(s): 7 documents" in out


def test_txt_per_line_file_cut_by_shards(tiny_tokenizer, tmp_path, dataprep):
    """Bug: --txt-per-line .txt files treated as whole files by the plan (one shard gets all)
    or cut without the line rule (a line in two parts, or in none); blank lines and CRLF
    counted differently in a part."""
    folder = tmp_path / "in"
    folder.mkdir()
    lines = _texts(8, 500, high=40)
    lines[10], lines[11] = "", "   "  # blank lines are not documents
    lines[200] += "\r"  # a CRLF line
    (folder / "a.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (folder / "b.jsonl").write_bytes(_jsonl(_texts(9, 30)))
    inputs = [folder / "a.txt", folder / "b.jsonl"]
    assert str(folder / "a.txt") in _cut_paths(inputs, 3, txt_per_line=True)
    _tokenize(inputs, tiny_tokenizer, tmp_path / "single", txt_per_line=True,
              max_chunk_bytes=4096)
    parts = _tokenize_parts(inputs, tiny_tokenizer, tmp_path / "parts", 3, txt_per_line=True,
                            max_chunk_bytes=4096)
    _merge(dataprep, parts, tmp_path / "merged")
    _assert_same_bytes(tmp_path / "merged", tmp_path / "single")
    assert IndexedDataset(tmp_path / "merged").num_documents == 498 + 30


def test_a_line_longer_than_a_chunk_and_a_shard_appears_once(tiny_tokenizer, tmp_path,
                                                               dataprep):
    """Bug: a line that starts in one shard and runs through the next shard's whole range
    read by both shards (or by several chunks), or by none."""
    texts = _texts(10, 30, high=20) + [" ".join(_texts(11, 400))] + _texts(12, 30, high=20)
    (tmp_path / "long.jsonl").write_bytes(_jsonl(texts))
    inputs = [tmp_path / "long.jsonl"]
    long_line = len(_jsonl(texts[30:31]))
    assert long_line > 4 * (tmp_path / "long.jsonl").stat().st_size // 5  # > 4 shard ranges
    _tokenize(inputs, tiny_tokenizer, tmp_path / "single", max_chunk_bytes=4096)
    parts = _tokenize_parts(inputs, tiny_tokenizer, tmp_path / "parts", 5,
                            max_chunk_bytes=4096)
    _merge(dataprep, parts, tmp_path / "merged")
    _assert_same_bytes(tmp_path / "merged", tmp_path / "single")
    assert _documents(tmp_path / "merged") == _expected(tiny_tokenizer, texts)


# ---------------------------------------------------------------------- the plan itself


def _units(source: Source) -> int:
    """How many units the plan cuts ``source`` into positions of (bytes, groups, rows)."""
    if source.format == "parquet":
        import pyarrow.parquet as pq

        return pq.ParquetFile(source.path).metadata.num_row_groups
    if source.format == "hf":
        from bloomline.dataprep.formats.hf_dataset import load_hf_dataset

        return len(load_hf_dataset(source.path))
    return source.size


@pytest.mark.parametrize("count", [1, 2, 3, 7, 13, 100])
def test_plan_tiles_every_source_exactly_once_in_input_order(mixed, count):
    """Bug: byte ranges with a gap or an overlap between shards, a row group or dataset row
    in two shards or none, a whole file in two shards, or a shard whose pieces are not the
    next ones in input order (the merge would reorder documents)."""
    sources = expand_inputs([str(p) for p in mixed["inputs"]])
    order = {s.path: i for i, s in enumerate(sources)}
    plan = [shard_sources(sources, k, count) for k in range(count)]
    flat = [part for parts in plan for part in parts]
    keys = [(order[p.path], p.start) for p in flat]
    assert keys == sorted(set(keys))  # shard 0's pieces, then shard 1's, ... = input order
    assert sum(p.work_bytes for p in flat) == sum(s.size for s in sources)
    for source in sources:
        pieces = [p for p in flat if p.path == source.path]
        cut = source.compression is None and source.format != "txt"
        if not cut:  # .zst and one-document .txt files: whole, in exactly one shard
            assert pieces == [source]
            continue
        if source.size == 0 and source.format == "jsonl":
            assert pieces == []  # nothing to read
            continue
        bounds = [(p.start, p.stop) for p in pieces]
        assert bounds[0][0] == 0 and bounds[-1][1] == _units(source), (source.path, bounds)
        assert all(a[1] == b[0] and a[0] < a[1] for a, b in zip(bounds, bounds[1:],
                                                                 strict=False)), bounds
        assert sum(p.part_bytes for p in pieces) == source.size
        if source.format == "jsonl":  # each line read by exactly one piece, whole
            read = b"".join(read_line_range(source.path, p.start, p.stop)[0] for p in pieces)
            assert read == Path(source.path).read_bytes()


def test_plan_splits_uncompressed_files_evenly(tmp_path):
    """Bug: shards of very different sizes on a corpus of plain files (one machine of the
    SLURM array working far longer than the others), e.g. from cutting at file boundaries
    only or from a wrong offset for the files after the first."""
    files = []
    for name, count in (("a.jsonl", 300), ("b.jsonl", 80), ("c.txt", 500), ("d.json", 150)):
        path = tmp_path / name
        if name.endswith(".txt"):
            path.write_text("\n".join(_texts(count, count, high=30)) + "\n")
        else:
            path.write_bytes(_jsonl(_texts(count, count)))
        files.append(path)
    sources = expand_inputs([str(p) for p in files])
    total = sum(s.size for s in sources)
    starts = []  # (global offset of each line's first byte, line length)
    offset = 0
    for path in files:
        data = path.read_bytes()
        position = 0
        for line in data.splitlines(keepends=True):
            starts.append((offset + position, len(line)))
            position += len(line)
        offset += len(data)
    longest = max(length for _, length in starts)
    for count in (2, 3, 5, 8):
        for k in range(count):
            parts = shard_sources(sources, k, count, txt_per_line=True)
            assert abs(sum(p.part_bytes for p in parts) - total / count) <= 1
            low, high = k * total // count, (k + 1) * total // count
            owned = sum(length for start, length in starts if low <= start < high)
            assert abs(owned - total / count) <= longest + 1, (count, k)


# -------------------------------------------------------------------------- line numbers


def _break_line(data: bytearray, line_start: int) -> None:
    """Make the JSON line at ``line_start`` malformed without changing its length: its
    closing quote becomes a letter (an unterminated string)."""
    end = data.index(b"\n", line_start)
    assert data[end - 2 : end] == b'"}'
    data[end - 2] = ord("x")


def test_bad_line_deep_in_a_part_gets_the_files_line_number(tiny_tokenizer, tmp_path,
                                                            dataprep):
    """Bug: line numbers counted from the start of a shard's range, of a chunk or of the
    inputs laid end to end instead of from the start of the file."""
    lead = tmp_path / "lead.jsonl"
    lead.write_bytes(_jsonl(_texts(13, 100)))
    deep = tmp_path / "deep.jsonl"
    data = bytearray(_jsonl(_texts(14, 1500)))
    inputs = [lead, deep]
    line_starts = [0] + [i + 1 for i, byte in enumerate(data) if byte == ord("\n")][:-1]
    total = lead.stat().st_size + len(data)
    # line A: ~30 KB into shard 1's range (past its first 8 KiB chunks); line B: the first
    # line that shard 2 owns
    low1 = total // 3 - lead.stat().st_size
    low2 = 2 * total // 3 - lead.stat().st_size
    line_a = next(n for n, s in enumerate(line_starts) if s >= low1 + 30_000)
    line_b = next(n for n, s in enumerate(line_starts) if s >= low2)
    assert line_starts[line_a] < low2
    _break_line(data, line_starts[line_a])
    _break_line(data, line_starts[line_b])
    deep.write_bytes(bytes(data))
    where_a, where_b = f"{deep}:{line_a + 1}: malformed JSON", f"{deep}:{line_b + 1}: malformed"
    kwargs = {"max_chunk_bytes": 8192}

    with pytest.raises(UserError, match="malformed JSON") as single:
        _tokenize(inputs, tiny_tokenizer, tmp_path / "single", **kwargs)
    assert str(single.value).startswith(where_a)
    with pytest.raises(UserError, match="malformed JSON") as part1:
        _tokenize(inputs, tiny_tokenizer, tmp_path / "p1", shard=(1, 3), **kwargs)
    assert str(part1.value).startswith(where_a)
    code, _, err = dataprep("tokenize", lead, deep, "--tokenizer", tiny_tokenizer, "--output",
                            tmp_path / "p2", "--shard", "2/3", "--chunk-mb", "0.01", "--quiet",
                            "--workers", "1")
    assert code == 1 and err.startswith(f"error: {where_b}") and err.count("\n") == 1, err
    _tokenize(inputs, tiny_tokenizer, tmp_path / "p0", shard=(0, 3), **kwargs)  # owns neither

    skipped = _tokenize(inputs, tiny_tokenizer, tmp_path / "single", skip_bad_lines=True,
                        **kwargs)
    assert skipped.num_skipped == 2
    assert [m.split(":")[1] for m in skipped.skipped_messages] == [str(line_a + 1),
                                                                   str(line_b + 1)]
    assert skipped.skipped_messages[0].startswith(where_a)
    assert skipped.skipped_messages[1].startswith(where_b)
    for k, where in ((1, where_a), (2, where_b)):
        part = _tokenize(inputs, tiny_tokenizer, tmp_path / f"p{k}", shard=(k, 3),
                         skip_bad_lines=True, **kwargs)
        assert part.num_skipped == 1 and part.skipped_messages[0].startswith(where), k
    assert not any(p.name.startswith(".") for p in tmp_path.iterdir())  # no litter


# -------------------------------------------------------------------- merge refusals


@pytest.fixture(scope="module")
def jobs(tmp_path_factory, tiny_tokenizer) -> dict:
    """Parts of job A (3 shards), of job B (other inputs, 3 shards), of job C (A's inputs,
    2 shards), and a plain token file of A's inputs."""
    folder = tmp_path_factory.mktemp("jobs")
    x = folder / "x.jsonl"
    x.write_bytes(_jsonl(_texts(15, 90)))
    y = folder / "y.jsonl"
    y.write_bytes(_jsonl(_texts(16, 10)))
    made = {"A": _tokenize_parts([x], tiny_tokenizer, folder / "A", 3),
            "B": _tokenize_parts([x, y], tiny_tokenizer, folder / "B", 3),
            "C": _tokenize_parts([x], tiny_tokenizer, folder / "C", 2)}
    _tokenize([x], tiny_tokenizer, folder / "plain")
    made["plain"] = folder / "plain"
    # part A0 whose .bin/.idx were replaced by A1's after it was written
    (folder / "swapped").mkdir()
    made["swapped"] = folder / "swapped" / "part00"
    for suffix in (".bin", ".idx", ".fingerprint.json", ".shard.json"):
        shutil.copy(f"{made['A'][0]}{suffix}", f"{made['swapped']}{suffix}")
    for suffix in (".bin", ".idx"):
        shutil.copy(f"{made['A'][1]}{suffix}", f"{made['swapped']}{suffix}")
    docs = [IndexedDataset(p).num_documents for p in made["A"]]
    assert docs[0] != docs[1], docs  # the swap must show in the count
    made["docs"] = docs
    return made


REFUSALS = {
    # case: (parts given, what the one-line error must say: {A1} etc. name the prefixes)
    "missing": (["A0", "A1"], "merge: 2 parts given for a job of 3 shards (missing shard(s) [2])"),
    "out of order": (["A0", "A2", "A1"], "merge: {A2} is shard 2/3 but given in place 1"),
    "repeated": (["A0", "A1", "A1"], "merge: {A1} is shard 1/3 but given in place 2"),
    "other inputs": (["A0", "B1", "A2"], "merge: {B1} is a part of another job"),
    "other N": (["A0", "C1", "A2"], "merge: {C1} is a part of another job"),
    "other N, given first": (["C0", "C1", "A2"], "merge: {A2} is a part of another job"),
    "a plain token file": (["A0", "plain", "A2"], "merge: {plain} has no plain.shard.json"),
    "replaced by another part": (["swapped", "A1", "A2"],
                                 "merge: {swapped}.idx holds {docs1} documents but its shard "
                                 "record says {docs0}: the part was changed"),
}


@pytest.mark.parametrize("case", list(REFUSALS))
def test_merge_refuses_parts_that_do_not_belong_together(jobs, tmp_path, dataprep, case):
    """Bug: a merge of a missing, repeated, reordered, foreign or altered part that silently
    writes a corpus with documents lost, doubled or out of order; or an error that does not
    name the part, or that leaves a half-written output."""
    names = {f"{job}{k}": str(p) for job in "ABC" for k, p in enumerate(jobs[job])}
    names.update(plain=str(jobs["plain"]), swapped=str(jobs["swapped"]))
    given, message = REFUSALS[case]
    before = {n: Path(f"{names[n]}.shard.json").read_bytes() for n in given if n != "plain"}
    code, out, err = dataprep("merge", *(names[n] for n in given), "--output",
                              tmp_path / "out" / "m")
    expected = message.format(**names, docs0=jobs["docs"][0], docs1=jobs["docs"][1])
    assert code == 1, out
    assert err.count("\n") == 1 and err.startswith(f"error: {expected}"), err
    assert not (tmp_path / "out").exists()  # nothing written, not even a folder or litter
    assert before == {n: Path(f"{names[n]}.shard.json").read_bytes() for n in before}


@pytest.mark.parametrize("text", ["3/3", "a/b", "-1/2", "0/0", "1", "1/2/3", ""])
def test_parse_shard_refuses_what_is_not_k_of_n(text):
    """Bug: an impossible --shard (K >= N, N = 0, negative, not numbers) accepted, making a
    part that no merge can complete, or failing with a traceback."""
    with pytest.raises(UserError, match=f"--shard {text}: "):
        parse_shard(text)


def test_parse_shard_accepts_k_of_n_and_cli_refuses_in_one_line(tmp_path, tiny_tokenizer,
                                                                dataprep):
    """Bug: the usual spellings refused, or the CLI turning a bad --shard into a traceback or
    into a run that writes an output."""
    assert parse_shard("0/1") == (0, 1) and parse_shard(" 7 / 8 ") == (7, 8)
    (tmp_path / "in.jsonl").write_text('{"text": "x"}\n')
    code, _, err = dataprep("tokenize", tmp_path / "in.jsonl", "--tokenizer", tiny_tokenizer,
                            "--output", tmp_path / "out" / "c", "--shard", "3/3")
    assert code == 1 and err.startswith("error: --shard 3/3: K must be in 0..N-1"), err
    assert err.count("\n") == 1 and not (tmp_path / "out").exists()


# ---------------------------------------------------------------------- --overwrite


def _record(prefix) -> dict:
    return json.loads(shard_record_path(prefix).read_text())


def test_overwrite_of_a_part_never_leaves_a_stale_record(tiny_tokenizer, tmp_path,
                                                         monkeypatch):
    """Bug: a part rerun with --overwrite keeping the old PREFIX.shard.json, so that the
    record claims shard/N/document counts of a run the .bin/.idx no longer hold (a plain
    rerun would then still merge as a part, a part of another N as the old one)."""
    good = tmp_path / "good.jsonl"
    good.write_bytes(_jsonl(_texts(17, 60)))
    prefix = tmp_path / "out" / "p"
    _tokenize([good], tiny_tokenizer, prefix, shard=(0, 2))
    assert _record(prefix)["shard"] == 0 and _record(prefix)["num_shards"] == 2

    _tokenize([good], tiny_tokenizer, prefix, shard=(1, 3), overwrite=True)
    record = _record(prefix)
    assert (record["shard"], record["num_shards"]) == (1, 3)
    assert record["num_documents"] == IndexedDataset(prefix).num_documents

    _tokenize([good], tiny_tokenizer, prefix, overwrite=True)  # a plain run: no part
    assert not shard_record_path(prefix).exists()

    # A rerun that fails on a bad line leaves the old, complete part and its record as they
    # were (it fails before replacing anything), and no litter.
    _tokenize([good], tiny_tokenizer, prefix, shard=(0, 2), overwrite=True)
    snapshot = {p.name: p.read_bytes() for p in prefix.parent.iterdir()}
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(_jsonl(_texts(18, 30)) + b"{broken\n")
    with pytest.raises(UserError, match="bad.jsonl:31: malformed JSON"):
        _tokenize([bad], tiny_tokenizer, prefix, shard=(0, 1), overwrite=True)
    assert snapshot == {p.name: p.read_bytes() for p in prefix.parent.iterdir()}
    assert _record(prefix)["num_documents"] == IndexedDataset(prefix).num_documents

    # A rerun that dies after its .bin/.idx are in place but before its record is written
    # must not leave the old record describing the new files.
    # the module, not the function of the same name that the package re-exports
    tokenize_module = importlib.import_module("bloomline.dataprep.tokenize_corpus")

    def die(*args, **kwargs):
        raise OSError("killed before the record was written")

    monkeypatch.setattr(tokenize_module, "write_shard_record", die)
    again = tmp_path / "again.jsonl"  # another file: a file named twice is read once
    again.write_bytes(good.read_bytes())
    with pytest.raises(OSError, match="killed"):
        _tokenize([good, again], tiny_tokenizer, prefix, shard=(0, 1), overwrite=True)
    assert IndexedDataset(prefix).num_documents == 120  # the new run's files
    assert not shard_record_path(prefix).exists()


def test_merge_overwrite_of_a_part_drops_its_record(jobs, tiny_tokenizer, tmp_path,
                                                    dataprep):
    """Bug: `dataprep merge ... --output P --overwrite` over an earlier part P keeping
    P.shard.json: the merged file then passes for shard K of an old job (a later merge takes
    it as that part, or refuses it next to plain files)."""
    prefix = tmp_path / "p"
    (tmp_path / "x.jsonl").write_bytes(_jsonl(_texts(19, 20)))
    _tokenize([tmp_path / "x.jsonl"], tiny_tokenizer, prefix, shard=(0, 2))
    code, _, err = dataprep("merge", jobs["plain"], jobs["plain"], "--output", prefix,
                            "--overwrite")
    assert code == 0, err
    assert IndexedDataset(prefix).num_documents == 2 * IndexedDataset(jobs["plain"]).num_documents
    assert not shard_record_path(prefix).exists(), "a stale shard record survived the merge"



def test_merge_refuses_parts_of_an_input_that_changed_since(tiny_tokenizer, tmp_path,
                                                            dataprep):
    """Bug: parts made before an input grew merged as if complete: the cuts were computed from
    the old size, so the new lines are silently missing from the corpus. The merge must name
    the input whose size changed, and write nothing."""
    x = tmp_path / "x.jsonl"
    x.write_bytes(_jsonl(_texts(15, 60)))
    parts = _tokenize_parts([x], tiny_tokenizer, tmp_path / "parts", 2)
    with open(x, "ab") as fh:
        fh.write(_jsonl(["one more document"]))
    code, out, err = dataprep("merge", *map(str, parts), "--output", tmp_path / "out" / "m")
    assert code == 1, out
    assert err.startswith(f"error: merge: input {x} is ") and "tokenize the parts again" in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("count", [1, 3])
def test_chunks_account_for_every_byte_of_the_job(tmp_path, count):
    """Catches: a progress line stuck below 100% at the end (and an ETA off all along):
    Parquet chunks counted only their column pages, not the footer, and dataset-folder
    chunks a per-row size rounded down, so they summed to less than the job's total."""
    import datasets

    from bloomline.dataprep.sources import iter_chunks

    datasets.disable_progress_bars()
    _write_parquet(tmp_path / "c.parquet", _texts(3, 200), row_group_size=40)
    datasets.Dataset.from_dict({"text": _texts(4, 301)}).save_to_disk(str(tmp_path / "d_hf"))
    sources = expand_inputs([str(tmp_path / "c.parquet"), str(tmp_path / "d_hf")])
    for k in range(count):
        part = shard_sources(sources, k, count) if count > 1 else sources
        chunks = list(iter_chunks(part, max_chunk_bytes=4096))
        assert sum(c.source_bytes for c in chunks) == sum(s.work_bytes for s in part)


def test_a_part_without_input_says_why_and_still_merges(tiny_tokenizer, tmp_path, dataprep):
    """Bug: `tokenize --shard 1/2` of a corpus of one .jsonl.zst writes an empty part without
    a word (the compressed file cannot be split, so shard 0 reads it whole), or writes no
    part so that merge of all parts fails."""
    raw = tmp_path / "x.jsonl.zst"
    raw.write_bytes(zstandard.ZstdCompressor().compress(_jsonl(_texts(13, 20))))
    common = (raw, "--tokenizer", tiny_tokenizer, "--quiet")
    code, _, err0 = dataprep("tokenize", *common, "--output", tmp_path / "p0", "--shard", "0/2")
    assert code == 0 and "warning" not in err0
    code, _, err1 = dataprep("tokenize", *common, "--output", tmp_path / "p1", "--shard", "1/2")
    assert code == 0
    assert (f"warning: shard 1/2 gets no input: {raw} is one compressed file and cannot be "
            "split (shard 0/2 reads it whole); the part is written empty, and merge takes it "
            "(use --shard with more files or uncompressed input)") in err1
    assert IndexedDataset(tmp_path / "p1").num_documents == 0
    _merge(dataprep, [tmp_path / "p0", tmp_path / "p1"], tmp_path / "merged")
    _tokenize([raw], tiny_tokenizer, tmp_path / "single")
    _assert_same_bytes(tmp_path / "merged", tmp_path / "single")


def test_a_part_inside_one_line_names_the_line_rule(tiny_tokenizer, tmp_path, capsys):
    """Bug: a part whose bytes hold no line start (more parts than lines) empty without a
    word."""
    (tmp_path / "a.jsonl").write_bytes(_jsonl(_texts(14, 2, low=40, high=50)))
    _tokenize([tmp_path / "a.jsonl"], tiny_tokenizer, tmp_path / "p1", shard=(1, 8))
    err = capsys.readouterr().err
    assert err.startswith(f"warning: shard 1/8 gets no input: no line of {tmp_path}/a.jsonl "
                          "starts in the bytes of it this part owns"), err
    assert err.rstrip().endswith("(use fewer parts)")
