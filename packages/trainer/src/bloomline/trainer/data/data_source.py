"""What a run reads: ``data.corpus`` (a folder, every NAME.bin/.idx in it), or the datasets of
Megatron's data arguments (``data.data_path``, ``data.data_args_path``,
``data.per_split_data_args_path``; ``bloomline.dataprep.data_args``), the same wherever the
trainer opens its data (training, validation, ``trainer evaluate``, the vocabulary checks).
"""

from __future__ import annotations

from bloomline.common.errors import SettingError
from bloomline.dataprep.data_args import DataArgs, data_args
from bloomline.dataprep.fingerprint import corpus_prefixes
from bloomline.trainer.config import DataConfig
from bloomline.trainer.dataprep_keys import DATAPREP_KEYS

__all__ = ["data_source", "run_prefixes", "uses_data_args"]


def uses_data_args(data: DataConfig) -> bool:
    """Whether the run names its datasets by Megatron's arguments instead of data.corpus."""
    return bool(data.data_path or data.data_args_path or data.per_split_data_args_path)


def data_source(data: DataConfig) -> str | DataArgs:
    """``data.corpus``, or the datasets its Megatron arguments name (their files read and
    checked here).

    Raises:
        SettingError: a bad item, a missing token file, an unreadable file, worded with the
            trainer's keys (``data.data_path: item 3 'x': not a number; ...``).
    """
    if not uses_data_args(data):
        return data.corpus
    try:
        return data_args(data.data_path or None, data.data_args_path or None,
                         data.per_split_data_args_path or None)
    except SettingError as err:
        raise err.named(DATAPREP_KEYS) from None


def run_prefixes(data: DataConfig) -> dict[str, str]:
    """name -> prefix of every token file the run reads (none when nothing is set)."""
    source = data_source(data)
    if isinstance(source, DataArgs):
        return source.sources()
    return corpus_prefixes(source) if source else {}
