"""The vocabulary checks between the tokenizer, the corpus and the model's embedding rows.

Apart from the loader because they guard the run rather than feed it: the tokenizer's
vocabulary against ``model.vocab_size`` and the corpus's fingerprints before the run starts
(``check_vocabulary``), and each step's batch against the embedding rows (``check_token_ids``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from bloomline.common.errors import UserError
from bloomline.dataprep.fingerprint import check_tokenizer_matches
from bloomline.trainer.config import DataConfig
from bloomline.trainer.data.corpus_vocabulary import check_unfingerprinted
from bloomline.trainer.data.data_source import run_prefixes
from bloomline.trainer.data.run_tokenizer import load_run_tokenizer

__all__ = ["check_token_ids", "check_vocabulary"]


def check_vocabulary(data: DataConfig, model_vocab: int,
                     log: Callable[[str], object] | None = None,
                     fixed_shape: str | None = None) -> int | None:
    """The tokenizer's vocabulary size, checked against the model's embedding rows, and the
    corpus's token files checked against the tokenizer that made them (their fingerprints;
    files without one by their ids and document ends, ``corpus_vocabulary.py``, which
    ``log``s what it checked).

    ``fixed_shape``: what fits a larger vocabulary when the model's shape comes from a
    checkpoint or ``checkpoint.init_from`` (``model_source.vocabulary_advice``); None: the
    recipe's ``model.vocab_size`` can be raised.

    Raises:
        UserError: a vocabulary larger than the model's, or a corpus file another tokenizer
            made (by its fingerprint, or an id beyond the vocabulary).
    """
    tokenizer = load_run_tokenizer(data)
    if tokenizer is None:
        return None
    if tokenizer.vocab_size > model_vocab and fixed_shape:
        raise UserError(f"data.tokenizer {data.tokenizer}: vocabulary of "
                        f"{tokenizer.vocab_size} tokens is larger than the model's "
                        f"{model_vocab} embedding rows; {fixed_shape}")
    if tokenizer.vocab_size > model_vocab:
        raise UserError(f"data.tokenizer {data.tokenizer}: vocabulary of "
                        f"{tokenizer.vocab_size} tokens is larger than model.vocab_size "
                        f"{model_vocab}; raise model.vocab_size (or set it to 0 to size it "
                        "from the tokenizer)")
    prefixes = run_prefixes(data)  # data.corpus's, or data.data_path's
    if prefixes:
        check_tokenizer_matches(prefixes, tokenizer, "data.tokenizer")
        check_unfingerprinted(prefixes, tokenizer.vocab_size,
                              _eod_or_none(tokenizer), f"data.tokenizer {data.tokenizer}", log)
    return tokenizer.vocab_size


def _eod_or_none(tokenizer) -> int | None:
    """The tokenizer's EOD id, or None when it names none (then documents' ends are not
    checked)."""
    try:
        return tokenizer.eod_id
    except UserError:
        return None


def check_token_ids(micro_batches: list[torch.Tensor], vocab_size: int, corpus: str,
                    step: int) -> None:
    """Refuse a step's batch holding a token id the model's vocabulary has no row for."""
    largest = max(int(batch.max()) for batch in micro_batches)
    if largest >= vocab_size:
        raise UserError(f"data.corpus {corpus}: token id {largest} in the batch of step "
                        f"{step} is >= model.vocab_size {vocab_size}: the data's vocabulary "
                        "is larger than the model's")
