"""The run's tokenizer (``data.tokenizer``, ``data.eod_token``), loaded once per process.

Apart from the loader because the samples need no tokenizer (they are token ids already):
the tokenizer serves the checks around them (``vocabulary.py``), ``generate`` and the
export, and its cache is process-wide state of its own.
"""

from __future__ import annotations

import functools

from bloomline.common.errors import UserError
from bloomline.dataprep.tokenizer import load_tokenizer
from bloomline.trainer.config import DataConfig

__all__ = ["load_run_tokenizer"]


def load_run_tokenizer(data: DataConfig):
    """The run's tokenizer (``data.tokenizer``, ``data.eod_token``), or None when unset.

    Loaded once per process: a 250k-entry vocabulary takes a moment, and the run asks for it
    several times (vocabulary size, corpus check, generate).
    """
    if not data.tokenizer:
        return None
    return _load_tokenizer_cached(data.tokenizer, data.eod_token or None)


@functools.lru_cache(maxsize=4)
def _load_tokenizer_cached(spec: str, eod_token: str | None):

    try:
        return load_tokenizer(spec, eod_token)
    except UserError as err:
        raise UserError(f"data.tokenizer: {err}") from None
