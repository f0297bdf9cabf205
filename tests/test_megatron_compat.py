"""Byte compatibility with megatron-core's IndexedDataset (skipped when it is not installed).

megatron-core is an optional test oracle (requirements-compat.txt); bloomline never imports it.
"""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest

from bloomline.dataprep import IndexedDataset, IndexedDatasetWriter, tokenize_corpus

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    mcore = pytest.importorskip("megatron.core.datasets.indexed_dataset")
torch = pytest.importorskip("torch")

DOCS = [[5, 6, 7], [], [8], [9, 10, 11, 12], [], []]


@pytest.mark.slow
def test_megatron_reads_our_tokenized_files(tmp_path, tiny_tokenizer):
    """Catches: any header, array-order or empty-document difference that makes Megatron
    read other tokens than we wrote."""
    src = tmp_path / "in.jsonl"
    texts = ["Hello world.", "", "Привет 東京 👍", "more text " * 50, ""]
    src.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts), encoding="utf-8")
    tokenize_corpus([str(src)], str(tiny_tokenizer), str(tmp_path / "c"), workers=2,
                    show_progress=False)
    ours = IndexedDataset(tmp_path / "c")
    theirs = mcore.IndexedDataset(str(tmp_path / "c"), mmap=True)
    assert len(theirs) == len(ours)
    np.testing.assert_array_equal(theirs.sequence_lengths, ours.sequence_lengths)
    np.testing.assert_array_equal(theirs.document_indices, ours.document_indices)
    for i in range(len(ours)):
        np.testing.assert_array_equal(theirs[i], ours[i])


@pytest.mark.parametrize("dtype", [np.uint16, np.int32])
def test_our_writer_is_byte_identical_to_megatrons_builder(tmp_path, dtype):
    """Catches: the smallest byte difference from what Megatron's own builder writes."""
    builder = mcore.IndexedDatasetBuilder(str(tmp_path / "m.bin"), dtype=dtype)
    with IndexedDatasetWriter(tmp_path / "b", dtype) as writer:
        for doc in DOCS:
            # Megatron's preprocessing adds one sequence per non-empty document, none for an
            # empty one, then closes the document.
            if doc:
                builder.add_item(torch.tensor(doc))
            builder.end_document()
            writer.add_document(np.array(doc, dtype=np.int64))
    builder.finalize(str(tmp_path / "m.idx"))
    assert (tmp_path / "b.bin").read_bytes() == (tmp_path / "m.bin").read_bytes()
    assert (tmp_path / "b.idx").read_bytes() == (tmp_path / "m.idx").read_bytes()
    # and we read Megatron's files
    ds = IndexedDataset(tmp_path / "m")
    assert [list(ds[i]) for i in range(len(ds))] == [d for d in DOCS if d]
