"""Tests for the stdlib-docstring demo corpus."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import zstandard

from bloomline.dataprep import demo_corpus
from bloomline.dataprep.demo_corpus import DemoCorpusSummary, write_demo_corpus

SMALL_MB = 0.2


def _read_docs(path: Path) -> list[dict]:
    with path.open("rb") as fh, zstandard.ZstdDecompressor().stream_reader(fh) as reader:
        data = reader.read().decode("utf-8")
    assert data.endswith("\n")
    return [json.loads(line) for line in data.splitlines()]


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> tuple[DemoCorpusSummary, list[dict]]:
    summary = write_demo_corpus(tmp_path_factory.mktemp("demo") / "nested", size_mb=SMALL_MB)
    return summary, _read_docs(summary.path)


def test_output_is_deterministic(
    small: tuple[DemoCorpusSummary, list[dict]], tmp_path: Path
) -> None:
    """Catches nondeterminism (unsorted directory walk, set iteration, timestamps in output)."""
    summary, _ = small
    again = write_demo_corpus(tmp_path, size_mb=SMALL_MB)
    assert again.path.read_bytes() == summary.path.read_bytes()
    assert again == DemoCorpusSummary(again.path, summary.num_documents, summary.num_text_bytes)


def test_stops_right_after_crossing_size_target(
    small: tuple[DemoCorpusSummary, list[dict]],
) -> None:
    """Catches stopping short of the target, overshooting by more than one document, or a
    summary whose byte count disagrees with the file."""
    summary, docs = small
    target = SMALL_MB * 1e6
    sizes = [len(d["text"].encode("utf-8")) for d in docs]
    assert summary.num_text_bytes == sum(sizes)
    assert summary.num_documents == len(docs)
    assert sum(sizes) >= target
    assert sum(sizes) - sizes[-1] < target


def test_lines_are_json_with_sequential_ids(
    small: tuple[DemoCorpusSummary, list[dict]],
) -> None:
    """Catches broken JSONL framing, missing fields, or ids that skip or restart."""
    summary, docs = small
    assert summary.path.name == "stdlib_docs.jsonl.zst"
    assert [d["id"] for d in docs] == list(range(len(docs)))
    assert all(set(d) == {"id", "source", "text"} for d in docs)
    assert len({d["source"] for d in docs}) > 100


def test_texts_are_real_prose(small: tuple[DemoCorpusSummary, list[dict]]) -> None:
    """Catches empty or code-only texts, unapplied length filter, and leaked comment markers."""
    _, docs = small
    assert all(len(d["text"]) >= 40 for d in docs)
    assert any("Return" in d["text"] for d in docs)
    assert any(d["text"].startswith("def ") for d in docs)
    assert any(d["text"].startswith("class ") for d in docs)
    assert not any(d["text"].startswith(("#", "-*-")) for d in docs)
    assert not any(d["text"] != d["text"].rstrip() for d in docs)


FAKE_MODULE = '''#!/usr/bin/env python3
# -*- coding: utf-8 -*-
"""Module docstring that is long enough to keep around."""

# First comment line
# continues here.
#
# Second paragraph after a bare hash.
##########
x = 1  # trailing note about x


class Widget:
    """A widget that is documented at some length here."""

    def spin(self, speed, *, twice=False):
        """
        Spin the widget at the given speed.

            Indented example line.
        """

    def short(self):
        """Too short."""


if x:
    async def fetch(url: str) -> bytes:
        """Fetch a URL asynchronously and return the body."""
'''


def test_fake_stdlib_extraction(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Catches walking into test/idlelib/site-packages/__pycache__, crashing on undecodable or
    invalid files, unsorted file order, and wrong comment/docstring/header formatting."""
    files = {
        "a.py": FAKE_MODULE,
        "pkg/__init__.py": '"""Package docstring which is long enough to be kept."""\n',
        "pkg/tests/t.py": '"""Tests docstring that must never appear in the corpus."""\n',
        "test/x.py": '"""Test-suite docstring that must never appear in output."""\n',
        "idlelib/y.py": '"""IDLE docstring that must never appear in the output."""\n',
        "site-packages/z.py": '"""Third-party docstring that must never appear here."""\n',
        "__pycache__/c.py": '"""Cache docstring that must never appear in the output."""\n',
        "broken.py": '"""Docstring of a file that does not parse at all."""\ndef (\n',
        "README.txt": "not python at all, and long enough to matter if read",
    }
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text, encoding="utf-8")
    (tmp_path / "latin1.py").write_bytes(b'"""Caf\xe9 docstring in latin-1 that is not UTF-8."""\n')
    monkeypatch.setattr("sysconfig.get_paths", lambda: {"stdlib": str(tmp_path)})

    docs = list(demo_corpus.iter_stdlib_documents())
    assert [d["source"] for d in docs] == ["a", "a.Widget", "a.Widget.spin", "a.fetch", "pkg"]
    assert [d["id"] for d in docs] == list(range(5))
    assert docs[0]["text"] == (
        "Module docstring that is long enough to keep around.\n\n"
        "First comment line\ncontinues here.\n\n"
        "Second paragraph after a bare hash.\n\n"
        "trailing note about x"
    )
    assert docs[1]["text"] == "class a.Widget\n\nA widget that is documented at some length here."
    assert docs[2]["text"] == (
        "def a.Widget.spin(self, speed, *, twice=False)\n\n"
        "Spin the widget at the given speed.\n\n    Indented example line."
    )
    assert docs[3]["text"].startswith("async def a.fetch(url: str)\n\nFetch a URL")


def test_refuses_to_overwrite_and_leaves_no_partial(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Catches silently clobbering an existing corpus, and a failed write leaving a .partial
    temp file or a truncated target behind."""
    docs = [{"id": 0, "source": "m.f", "text": "A sentence of documentation. " * 3}]
    monkeypatch.setattr(demo_corpus, "iter_stdlib_documents", lambda: iter(docs))
    first = write_demo_corpus(tmp_path, size_mb=0.0001)
    original = first.path.read_bytes()
    with pytest.raises(FileExistsError, match="--overwrite") as excinfo:
        write_demo_corpus(tmp_path, size_mb=0.0001)
    assert str(first.path) in str(excinfo.value)

    def exploding():
        yield from docs
        raise OSError("disk on fire")

    monkeypatch.setattr(demo_corpus, "iter_stdlib_documents", exploding)
    with pytest.raises(OSError, match="disk on fire"):
        write_demo_corpus(tmp_path, size_mb=1.0, overwrite=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == [first.path.name]
    assert first.path.read_bytes() == original


@pytest.mark.parametrize("size_mb", [0, -1.0, float("nan")])
def test_rejects_non_positive_size(tmp_path: Path, size_mb: float) -> None:
    """Catches a zero/negative/NaN size producing an empty file or looping forever."""
    with pytest.raises(ValueError, match="size_mb"):
        write_demo_corpus(tmp_path / "out", size_mb=size_mb)
    assert not (tmp_path / "out").exists()


def test_multiple_passes_reach_large_sizes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Catches sizes beyond one stdlib pass stopping early, ids restarting, or repeated passes
    not being marked in the source (one real pass is ~4 MB, too slow to exceed here)."""
    docs = [
        {"id": i, "source": f"mod.f{i}", "text": f"Document number {i} explains something. " * 5}
        for i in range(3)
    ]
    monkeypatch.setattr(demo_corpus, "iter_stdlib_documents", lambda: iter(docs))
    per_pass = sum(len(d["text"]) for d in docs)
    summary = write_demo_corpus(tmp_path, size_mb=2.5 * per_pass / 1e6, name="multi")
    out = _read_docs(summary.path)
    assert summary.path == tmp_path / "multi.jsonl.zst"
    assert [d["id"] for d in out] == list(range(8))
    assert [d["source"] for d in out] == [
        "mod.f0", "mod.f1", "mod.f2",
        "pass2:mod.f0", "pass2:mod.f1", "pass2:mod.f2",
        "pass3:mod.f0", "pass3:mod.f1",
    ]  # fmt: skip
    assert [d["text"] for d in out] == [docs[i % 3]["text"] for i in range(8)]
    assert summary.num_text_bytes == 8 * len(docs[0]["text"])


def test_empty_source_raises_instead_of_looping(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Catches an infinite loop when no documents exist (e.g. a stripped-down Python)."""
    monkeypatch.setattr(demo_corpus, "iter_stdlib_documents", lambda: iter([]))
    with pytest.raises(RuntimeError):
        write_demo_corpus(tmp_path, size_mb=0.1)
    assert list(tmp_path.iterdir()) == []
