"""The generated token corpus of ``benchmarks.build_index`` and ``benchmarks.inspect``: random
uint16 tokens in documents of lognormal lengths (mean ``MEAN_DOC``), as three datasets for a
blend (``blend/{a,b,c}``) and their concatenation (``single/all``).

Contract: deterministic (seeded per dataset), cached under :func:`token_corpus_root`, whose
name holds the size; a dataset whose ``.idx`` exists is complete (each file is written
atomically) and is reused.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

__all__ = ["BATCH_DOCS", "MEAN_DOC", "SEED", "SEQ_LENGTH", "SIGMA_DOC", "SINGLE", "VOCAB",
           "WEIGHTS", "generate_token_corpus", "token_corpus_root"]

SEQ_LENGTH = 2048  # the sample length the indices over this corpus are built for
SEED = 1234  # the seed of those indices
WEIGHTS = {"a": 0.5, "b": 0.3, "c": 0.2}  # of the blend of a, b, c
SINGLE = "all"
VOCAB = 65000  # < 65500: uint16 tokens, as Megatron stores them
MEAN_DOC = 500.0
SIGMA_DOC = 1.0  # lognormal sigma: median ~300 tokens, a tail to tens of thousands
BATCH_DOCS = 50_000


def token_corpus_root(cache: Path, tokens: float, docs: float) -> Path:
    """Where :func:`generate_token_corpus` keeps the corpus of that size."""
    return cache / f"build_index_{tokens:g}t_{docs:g}d"


def generate_token_corpus(cfg: dict) -> dict:
    """Under ``cfg["root"]``: three datasets a, b, c of ~1/3 of ``cfg["tokens"]`` tokens and
    ``cfg["docs"]`` documents each (blend/), and their concatenation (single/all); each file is
    written atomically, so an existing .idx is complete and is reused. Returns per dataset its
    tokens, documents, .bin bytes and length statistics."""
    # imported here: benchmarks.build_index's measuring children must start without dataprep
    from bloomline.dataprep import IndexedDataset, IndexedDatasetWriter, merge_indexed_datasets


    root = Path(cfg["root"])
    blend, single = root / "blend", root / "single"
    names = list(WEIGHTS)
    for k, name in enumerate(names):
        if (blend / f"{name}.idx").exists():
            continue
        print(f"generating {blend / name} ...", flush=True)
        rng = np.random.default_rng(1000 + k)
        num_docs, num_tokens = cfg["docs"] // 3, cfg["tokens"] // 3
        raw = rng.lognormal(math.log(MEAN_DOC) - SIGMA_DOC**2 / 2, SIGMA_DOC, num_docs)
        lengths = np.maximum(1, np.round(raw * (num_tokens / raw.sum()))).astype(np.int64)
        with IndexedDatasetWriter(blend / name, np.uint16, overwrite=True) as writer:
            for start in range(0, num_docs, BATCH_DOCS):
                batch = lengths[start : start + BATCH_DOCS]
                writer.add_documents(
                    rng.integers(0, VOCAB, size=int(batch.sum()), dtype=np.uint16), batch)
    if not (single / f"{SINGLE}.idx").exists():
        print(f"concatenating them into {single / SINGLE} ...", flush=True)
        merge_indexed_datasets([blend / n for n in names], single / SINGLE, overwrite=True)
    stats = {}
    for path in [single / SINGLE] + [blend / n for n in names]:
        ds = IndexedDataset(path)
        lengths = np.asarray(ds.sequence_lengths)
        stats[str(path.relative_to(root))] = {
            "tokens": ds.num_tokens, "documents": len(ds), "bin_bytes": ds.bin_path.stat().st_size,
            "mean": float(lengths.mean()), "median": float(np.median(lengths)),
            "max": int(lengths.max())}
    return stats
