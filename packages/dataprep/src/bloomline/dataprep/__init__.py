"""bloomline.dataprep: raw corpora to Megatron-compatible token files and sample indices.

This package must not import torch: data jobs run on CPU-only machines without it.
"""

from bloomline.dataprep.build_index import (
    BlendedSampleDataset,
    BuiltIndex,
    IndexRequest,
    build_sample_datasets,
)
from bloomline.dataprep.gpt_index import (
    SampleIndex,
    build_sample_index,
    parse_split,
    split_sequence_ranges,
)
from bloomline.dataprep.gpt_samples import GPTSampleDataset
from bloomline.dataprep.indexed_dataset import (
    CorruptTokenFileError,
    IndexedDataset,
    IndexedDatasetWriter,
    merge_indexed_datasets,
    token_dtype_for_vocab,
)
from bloomline.dataprep.tokenize_corpus import TokenizeSummary, tokenize_corpus
from bloomline.dataprep.tokenizer import Tokenizer, load_tokenizer, train_tokenizer

__all__ = [
    "BlendedSampleDataset",
    "BuiltIndex",
    "IndexRequest",
    "build_sample_datasets",
    "CorruptTokenFileError",
    "GPTSampleDataset",
    "IndexedDataset",
    "IndexedDatasetWriter",
    "SampleIndex",
    "TokenizeSummary",
    "Tokenizer",
    "build_sample_index",
    "load_tokenizer",
    "merge_indexed_datasets",
    "parse_split",
    "split_sequence_ranges",
    "token_dtype_for_vocab",
    "tokenize_corpus",
    "train_tokenizer",
]
