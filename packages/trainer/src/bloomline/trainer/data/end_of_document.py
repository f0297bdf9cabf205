"""The run's end-of-document id, for masking documents apart in packed samples
(``data.reset_attention_mask``, ``data.eod_mask_loss``); the rule between those settings is
``config_rules.py``'s.

Where the id comes from, first found: the run's tokenizer (``data.tokenizer`` with
``data.eod_token``), else the corpus's token files, whose fingerprint records the id of the
tokenizer that made them (``dataprep tokenize --append-eod`` appended exactly that id).
"""

from __future__ import annotations

from pathlib import Path

from bloomline.common.errors import UserError
from bloomline.dataprep.fingerprint import check_same_tokenizer
from bloomline.trainer.config import DataConfig
from bloomline.trainer.data.data_source import run_prefixes
from bloomline.trainer.data.run_tokenizer import load_run_tokenizer

__all__ = ["masks_documents", "missing_eod", "run_eod_id"]


def masks_documents(data: DataConfig) -> bool:
    """Whether the run masks documents apart at all (attention or loss)."""
    return data.reset_attention_mask or data.eod_mask_loss


def run_eod_id(data: DataConfig) -> int | None:
    """The id that ends documents in this run's data (see the module docstring), or None
    when neither the tokenizer (unset, absent here, or without one) nor the corpus says."""
    if data.tokenizer and (data.tokenizer.startswith("tiktoken:")
                           or Path(data.tokenizer).exists()):
        tokenizer = load_run_tokenizer(data)
        if tokenizer.has_eod:
            return tokenizer.eod_id
    prefixes = run_prefixes(data)  # data.corpus's, or data.data_path's
    if prefixes:
        record = check_same_tokenizer(prefixes)
        if record is not None and record["tokenizer"].get("eod_id") is not None:
            return int(record["tokenizer"]["eod_id"])
    return None


def missing_eod(data: DataConfig) -> UserError:
    """The error of a run that masks documents without knowing the EOD id."""
    field = ("data.reset_attention_mask" if data.reset_attention_mask
             else "data.eod_mask_loss")
    return UserError(f"{field} needs the end-of-document token's id, and neither "
                     "data.tokenizer nor the corpus's NAME.fingerprint.json files name one; "
                     "set data.tokenizer (with data.eod_token if it has no end-of-text token)")
