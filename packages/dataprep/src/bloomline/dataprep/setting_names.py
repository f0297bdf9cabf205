"""The names dataprep's command line gives the library's settings, and the errors about them.

The library names a setting neutrally (``split``, as ``IndexRequest`` does) and raises a
:class:`~bloomline.common.errors.SettingError` through :func:`setting_error`, worded for its own
command line: ``--split``. Another front end words the same error in its names with
``SettingError.named`` (the trainer: ``data.split``; see ``bloomline.trainer.dataprep_keys``).
Apart from the modules that raise them because every front end must find the library's setting
names in one place.
"""

from __future__ import annotations

from bloomline.common.errors import SettingError

__all__ = ["FLAGS", "setting_error"]

# neutral name -> the `dataprep build-index` (and `inspect-data`) flag; an entry of a mapping
# setting is "SETTING.ENTRY", a format of {entry}
FLAGS = {
    "seq_length": "--seq-length",
    "train_samples": "--train-samples",
    "valid_samples": "--valid-samples",
    "test_samples": "--test-samples",
    "split": "--split",
    "surplus": "--surplus",
    "weights": "--weight",
    "weights.ENTRY": "--weight {entry}=...",
    "phases": "--phase",
    "phases.ENTRY": "--phase {entry}:...",
    # Megatron-LM's data arguments (data_args.py)
    "corpus": "CORPUS_DIR",
    "data_path": "--data-path",
    "data_args_path": "--data-args-path",
    "per_split_data_args_path": "--per-split-data-args-path",
}


def setting_error(setting: str, template: str, /, *, entry: str | None = None,
                  **values: object) -> SettingError:
    """A :class:`SettingError` about ``setting`` (``entry`` of a mapping setting), worded with
    dataprep's flags; ``template``'s fields are as ``SettingError`` says."""
    return SettingError(setting, template, entry=entry, names=FLAGS, **values)
