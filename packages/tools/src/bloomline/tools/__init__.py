"""bloomline.tools: offline, read-only inspection of token files and their sample orders.

Each subcommand of ``inspect-data`` is a function here that returns a plain dict (what
``--json`` prints); the CLI only parses flags and formats. Nothing here writes to a token file.
"""

from bloomline.tools.blend_report import document_repeats, prefix_counts, summarize_blend
from bloomline.tools.corpus import (
    document_lengths,
    iter_token_chunks,
    open_dataset,
    open_datasets,
    scan_token_range,
)
from bloomline.tools.diff import diff_token_files
from bloomline.tools.documents import show_document
from bloomline.tools.samples import describe_sample, sample_spans
from bloomline.tools.summary import summarize
from bloomline.tools.token_stats import count_tokens, token_histogram
from bloomline.tools.verify import verify_corpus
from bloomline.tools.vocab import Vocabulary

__all__ = [
    "Vocabulary",
    "count_tokens",
    "describe_sample",
    "diff_token_files",
    "document_lengths",
    "document_repeats",
    "iter_token_chunks",
    "open_dataset",
    "open_datasets",
    "prefix_counts",
    "sample_spans",
    "scan_token_range",
    "show_document",
    "summarize",
    "summarize_blend",
    "token_histogram",
    "verify_corpus",
]
