"""bloomline.dataprep: raw corpora to Megatron-compatible token files and sample indices.

This package must not import torch: data jobs run on CPU-only machines without it.
"""

from bloomline.dataprep.build_index import (
    BlendedSampleDataset,
    BuiltIndex,
    IndexRequest,
)
from bloomline.dataprep.data_args import DataArgs, data_args

# of a corpus folder, or of Megatron's data arguments (data_args)
from bloomline.dataprep.data_args_build import build_sample_datasets
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
    "DataArgs",
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
    "data_args",
    "load_tokenizer",
    "merge_indexed_datasets",
    "parse_split",
    "split_sequence_ranges",
    "token_dtype_for_vocab",
    "tokenize_corpus",
    "train_tokenizer",
]
