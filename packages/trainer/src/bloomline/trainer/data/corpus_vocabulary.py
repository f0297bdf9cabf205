"""Token files without a tokenizer fingerprint (Megatron's own, or written before bloomline
recorded one) checked against the run's tokenizer by what their tokens say.

A fingerprint (``dataprep/fingerprint.py``) names the tokenizer that made a file; without one
a corpus of another tokenizer would train silently on ids that mean other tokens, or index
past the embedding. Two facts of the tokens themselves catch most of that:

- **every id below the vocabulary size** (the tokenizer's largest id + 1): an id at or above
  it is refused, naming the file, the id and the vocabulary;
- **documents end with the EOD id** (dataprep and Megatron's ``preprocess_data.py`` append it
  to every document): the share of documents whose last token is the tokenizer's EOD is
  reported; a low share (another tokenizer's EOD, or files written without ``--append-eod``)
  is said in the same line.

Cost: the max is taken over the memory-mapped ``.bin`` in chunks, the whole file up to
``FULL_SCAN_TOKENS`` tokens over all unfingerprinted files (a second or two at disk speed);
beyond that over evenly spaced windows of the same total size (the line says "sampled"). The
EOD share reads the last token of at most ``EOD_SAMPLE`` evenly spaced documents. Every rank
checks (the check decides whether a rank starts); only the rank that logs prints the line.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from bloomline.common.errors import UserError
from bloomline.dataprep.fingerprint import read_fingerprint
from bloomline.dataprep.indexed_dataset import IndexedDataset

__all__ = ["EOD_SAMPLE", "FULL_SCAN_TOKENS", "check_unfingerprinted"]

FULL_SCAN_TOKENS = 1 << 28  # 256 Mi tokens (512 MiB of uint16): read whole below this
EOD_SAMPLE = 1 << 20  # documents whose last token is looked at, per file
_CHUNK = 1 << 24  # tokens per numpy max
_WINDOWS = 64  # evenly spaced windows when sampling
_LOW_EOD = 0.5  # below this share of documents ending with EOD, the line says so


@dataclass
class _Scan:
    tokens: int  # tokens read
    total: int  # tokens in the file
    largest: int
    documents: int  # documents looked at
    ending: int  # of those, ending with EOD


def check_unfingerprinted(prefixes: dict[str, str], vocab_size: int, eod_id: int | None,
                          tokenizer: str, log: Callable[[str], object] | None = None) -> None:
    """Check every token file of ``prefixes`` (name -> prefix) that has no fingerprint
    against a vocabulary of ``vocab_size`` and the EOD id ``eod_id`` (None: not checked), and
    ``log`` one line per file saying what was checked.

    Raises:
        UserError: an id at or above ``vocab_size``, naming the file, the id and the
            tokenizer (``tokenizer``, as the user named it).
    """
    bare = {name: prefix for name, prefix in prefixes.items()
            if read_fingerprint(prefix) is None}
    if not bare:
        return
    datasets = {name: IndexedDataset(prefix) for name, prefix in bare.items()}
    share = FULL_SCAN_TOKENS // len(datasets)  # the token budget, shared by the files
    for name, dataset in datasets.items():
        scan = _scan(dataset, share, eod_id)
        where = bare[name]
        if scan.largest >= vocab_size:
            raise UserError(
                f"{where}: no tokenizer fingerprint (written by another tool), and token id "
                f"{scan.largest:,} is not below the vocabulary {vocab_size:,} of {tokenizer}: "
                "the corpus was made by another tokenizer; tokenize it with this one, or set "
                "data.tokenizer to the one that made it")
        if log is not None:
            log(_line(where, scan, vocab_size, eod_id))


def _scan(dataset: IndexedDataset, budget: int, eod_id: int | None) -> _Scan:
    total = dataset.num_tokens
    tokens = dataset.tokens
    if total <= budget:
        spans = [(start, min(total, start + _CHUNK)) for start in range(0, total, _CHUNK)]
    else:  # evenly spaced windows covering ``budget`` tokens
        width = max(1, budget // _WINDOWS)
        starts = np.linspace(0, total - width, _WINDOWS).astype(np.int64)
        spans = [(int(s), int(s) + width) for s in starts]
    largest, read = -1, 0
    for start, stop in spans:
        if stop > start:
            largest = max(largest, int(tokens[start:stop].max()))
            read += stop - start
    documents, ending = _eod_ends(dataset, tokens, eod_id)
    return _Scan(read, total, largest, documents, ending)


def _eod_ends(dataset: IndexedDataset, tokens: np.ndarray, eod_id: int | None
              ) -> tuple[int, int]:
    """(documents looked at, how many of them end with ``eod_id``): the last token of at
    most ``EOD_SAMPLE`` evenly spaced non-empty documents."""
    if eod_id is None or not len(tokens):
        return 0, 0
    ends = np.cumsum(dataset.sequence_lengths, dtype=np.int64)  # end of each sequence
    bounds = np.asarray(dataset.document_indices, dtype=np.int64)
    last_sequence = bounds[1:][bounds[1:] > bounds[:-1]] - 1  # empty documents have none
    lengths = np.asarray(dataset.sequence_lengths)[last_sequence]
    ends = ends[last_sequence][lengths > 0]
    if len(ends) > EOD_SAMPLE:
        ends = ends[np.linspace(0, len(ends) - 1, EOD_SAMPLE).astype(np.int64)]
    return len(ends), int(np.count_nonzero(tokens[ends - 1] == eod_id))


def _line(where: str, scan: _Scan, vocab_size: int, eod_id: int | None) -> str:
    read = (f"{scan.tokens:,} tokens" if scan.tokens == scan.total else
            f"{scan.tokens:,} of {scan.total:,} tokens (sampled)")
    line = (f"{where}: no tokenizer fingerprint (written by another tool); checked: {read} "
            f"all < vocabulary {vocab_size:,}")
    if eod_id is None or not scan.documents:
        return line + ("" if eod_id is not None else "; no EOD id to check documents' ends")
    share = scan.ending / scan.documents
    line += f", EOD {eod_id} ends {share:.0%} of documents"
    if scan.tokens < scan.total:
        line += f" ({scan.documents:,} looked at)"
    if share < _LOW_EOD:
        line = ("warning: " + line + " (another tokenizer's EOD, or documents written without "
                "one)")
    return line
