"""The sample datasets of Megatron's data arguments, as megatron-core's builder makes them.

``--data-path`` / ``--data-args-path`` (megatron-core's ``blend``): the listed token files are one
set, cut into train/valid/test by ``--split`` exactly as a corpus folder is; with weights, even
a single prefix is a blend of one (megatron-core builds it with the surplus, which changes
its sample order against the unweighted prefix).

``--per-split-data-args-path`` (``blend_per_split``): each split is built on its own from the
datasets its list names, each used whole (megatron-core's split matrix ``(0, 1)`` for that
split); ``--split`` is not used (megatron-core refuses it beside ``blend_per_split``). A split
of one prefix is that dataset alone, weighted or not, as megatron-core's builder does. A
weighted split without a sample count (valid and test by default) is one epoch of each of its
datasets blended by size, as for a corpus folder (megatron-core refuses weights without a
count).

:func:`build_sample_datasets` takes a corpus folder or the result of
:func:`bloomline.dataprep.data_args.data_args`.
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import numpy as np

from bloomline.dataprep.build_index import (
    BuiltIndex,
    IndexRequest,
    build_from_datasets,
    open_token_files,
)
from bloomline.dataprep.build_index import build_sample_datasets as build_folder
from bloomline.dataprep.data_args import DataArgs
from bloomline.dataprep.gpt_index import SPLIT_NAMES
from bloomline.dataprep.indexed_dataset import IndexedDataset
from bloomline.dataprep.setting_names import FLAGS, setting_error

__all__ = ["build_sample_datasets", "describe"]


def build_sample_datasets(corpus: str | os.PathLike | DataArgs, request: IndexRequest,
                          cache_dir: str | os.PathLike | None = None) -> BuiltIndex:
    """:func:`bloomline.dataprep.build_index.build_sample_datasets` of a corpus folder, or of
    the datasets Megatron's data arguments name (default cache: ``.index`` beside the first
    prefix).

    Raises:
        UserError, SettingError: as ``build_index``'s, and the weights given both with the
            prefixes and by ``weights`` (or beside a per-split file).
    """
    if not isinstance(corpus, DataArgs):
        return build_folder(corpus, request, cache_dir)
    cache_dir = Path(cache_dir) if cache_dir is not None else corpus.default_cache_dir()
    if request.weights is not None and (corpus.weighted or corpus.per_split is not None):
        raise setting_error("weights", "{setting} and {" + corpus.argument + "}: give the "
                            "weights in one place (W1 PREFIX1 W2 PREFIX2 ...)")
    where = describe(corpus)
    datasets = open_token_files(corpus.sources(), where)
    if corpus.per_split is None:
        if corpus.weighted:
            request = replace(request, weights={s.name: s.weight for s in corpus.blend})
        built = build_from_datasets(datasets, where, cache_dir, request,
                                    blend_single=corpus.weighted)
    else:
        built = _per_split(corpus, datasets, where, cache_dir, request)
    built.report["datasets"] = corpus.sources()
    return built


def describe(args: DataArgs) -> str:
    """``--data-path 0.3 corpus/code 0.7 corpus/docs``: the argument as given, for messages."""
    return f"{FLAGS[args.argument]} {args.text}"


def _per_split(args: DataArgs, datasets: dict[str, IndexedDataset], where: str,
               cache_dir: Path, request: IndexRequest) -> BuiltIndex:
    """Each split of a per-split file built on its own, as the only split of its datasets
    (the split ``0,1,0`` gives valid every sequence, megatron-core's ``(0, 1)``)."""
    splits, report = {}, None
    for position, split in enumerate(SPLIT_NAMES):
        sources = args.per_split.get(split)
        if not sources:
            continue
        chosen = {source.name: datasets[source.name] for source in sources}
        _check_holds_a_sample(split, chosen, request, args)
        shares = ",".join("1" if i == position else "0" for i in range(len(SPLIT_NAMES)))
        weights = ({source.name: source.weight for source in sources}
                   if sources[0].weight is not None and len(sources) > 1 else None)
        built = build_from_datasets(chosen, where, cache_dir,
                                    replace(request, split=shares, weights=weights))
        splits[split] = built.splits[split]
        if report is None:
            report = {**built.report, "split": "per split: each dataset whole", "splits": {}}
        report["splits"][split] = built.report["splits"][split]
    return BuiltIndex(splits, report)


def _check_holds_a_sample(split: str, datasets: dict[str, IndexedDataset],
                          request: IndexRequest, args: DataArgs) -> None:
    """Each dataset of a split holds one sample at least (else the build's own message would
    speak of ``--split`` shares, which a per-split file does not have)."""
    needed = request.seq_length + int(request.add_extra_token)
    for name, dataset in datasets.items():
        tokens = int(dataset.sequence_lengths.sum(dtype=np.int64))
        if tokens < needed:
            raise setting_error(
                "seq_length", "{file} {part!r}: dataset {name} holds {tokens} tokens, too few "
                "for one sample of {needed}; lower {setting} or give the split more data",
                file=args.text, part=split, name=name, tokens=tokens,
                needed=needed).within(str(dataset.idx_path))
