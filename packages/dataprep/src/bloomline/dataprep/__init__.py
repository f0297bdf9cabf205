"""bloomline.dataprep: raw corpora to Megatron-compatible token files and sample indices.

This package must not import torch: data jobs run on CPU-only machines without it.
"""

from bloomline.dataprep.indexed_dataset import (
    CorruptTokenFileError,
    IndexedDataset,
    IndexedDatasetWriter,
    merge_indexed_datasets,
    token_dtype_for_vocab,
)
from bloomline.dataprep.pipeline import TokenizeSummary, tokenize_corpus
from bloomline.dataprep.tokenizer import Tokenizer, train_tokenizer

__all__ = [
    "CorruptTokenFileError",
    "IndexedDataset",
    "IndexedDatasetWriter",
    "TokenizeSummary",
    "Tokenizer",
    "merge_indexed_datasets",
    "token_dtype_for_vocab",
    "tokenize_corpus",
    "train_tokenizer",
]
