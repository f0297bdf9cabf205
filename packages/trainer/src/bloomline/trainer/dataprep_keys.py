"""dataprep's settings under the trainer's config keys: how the trainer words dataprep's
``SettingError`` (``--split`` on dataprep's command line is ``data.split`` here).

A dict, not a rewrite of the message: dataprep raises its errors with neutral setting names
(``bloomline.dataprep.setting_names``) and the trainer words them with
``err.named(DATAPREP_KEYS)`` where it calls dataprep (``config.py``'s data checks,
``data/loader.py``'s ``open_splits``). Apart from both callers because they must word the
same settings the same way, and ``config.py`` cannot import the data package (which imports
it). A setting the trainer has no key for (``surplus``) keeps dataprep's flag.
"""

from __future__ import annotations

__all__ = ["DATAPREP_KEYS"]

DATAPREP_KEYS = {
    "seq_length": "data.seq_length",
    "split": "data.split",
    "train_samples": "train.train_samples",
    "weights": "data.weights",
    "weights.ENTRY": "data.weights.{entry}",
    "corpus": "data.corpus",
    "data_path": "data.data_path",
    "data_args_path": "data.data_args_path",
    "per_split_data_args_path": "data.per_split_data_args_path",
    "phases": "data.phases",
    "phases.ENTRY": "data.phases.{entry}",
}
