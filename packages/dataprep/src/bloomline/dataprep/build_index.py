"""``dataprep build-index``: the sample datasets of a corpus folder, per split, in Megatron order.

Mental model::

    CORPUS_DIR/NAME.bin/.idx (all of them, by name)
      -> per dataset and split: GPTDataset indices (gpt_index), cached
      -> per split, when there are several datasets: blend indices (blending), cached
      -> per split: one sample dataset, ds[i] = L+1 int64 tokens

Which sample counts are built follows megatron-core's ``BlendedMegatronDatasetBuilder``:

* one dataset: no blend; the split's dataset is built for the requested samples;
* weights given: dataset d is built for ``ceil(ceil(N * w_d) * (1 + surplus))`` samples and
  the blend has ``sum(ceil(N * w_d))``;
* no weights: each dataset is built for one epoch and weighted by its sample count; the blend
  has ``min(N, sum of counts)`` samples, or all of them (exhaustive) when N is not given.

A split whose sample count is not given (valid and test by default) is built for one epoch of
each dataset, which is what evaluation on "the whole valid split" means. A dataset of weight 0
is left out (nothing is built or read for it; the report names it), for every front end alike.

``phases`` change the train blend's weights at given sample positions, in the one index
(``blend_phases``: the rule, sizes and why valid and test keep the first phase's weights);
``kept_sizes`` keep a train dataset's index (and so its order) while it holds what the
phases draw (``kept_indices``: a resume with other weights).

Every array's size follows from counts alone (``gpt_index.index_shape``), so the whole request
is sized before anything is built: one too large for the machine's memory, or for the cache
folder's free disk, is refused in one line before the first allocation or cache write.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import numpy as np

from bloomline.common.errors import SettingError, UserError
from bloomline.common.machine import available_memory, format_bytes, free_disk
from bloomline.dataprep.blend_phases import (
    BlendPhase,
    PhasePlan,
    check_phases,
    drawn_datasets,
    format_phases,
    phase_plan,
)
from bloomline.dataprep.blended_samples import BlendedSampleDataset
from bloomline.dataprep.blending import (
    MAX_DATASETS,
    add_named_weight,
    blend_component_sizes,
    blended_datasets,
    build_blend_indices,
    build_exhaustive_blend_indices,
    normalize_weights,
)
from bloomline.dataprep.fingerprint import check_same_tokenizer, corpus_prefixes
from bloomline.dataprep.gpt_index import (
    DEFAULT_SPLIT,
    SPLIT_NAMES,
    IndexShape,
    SampleIndex,
    build_sample_index,
    index_shape,
    parse_split,
    split_sequence_ranges,
)
from bloomline.dataprep.gpt_samples import GPTSampleDataset
from bloomline.dataprep.index_cache import CacheEntry, cached_arrays, entry_key, file_identity
from bloomline.dataprep.index_checks import blend_index_check, check_index_cache, gpt_index_check
from bloomline.dataprep.indexed_dataset import IndexedDataset
from bloomline.dataprep.kept_indices import kept_size
from bloomline.dataprep.setting_names import setting_error

__all__ = [
    "DEFAULT_SURPLUS",
    "BlendedSampleDataset",
    "BuiltIndex",
    "IndexRequest",
    "blend_index_check",
    "build_from_datasets",
    "build_sample_datasets",
    "check_index_cache",
    "find_datasets",
    "format_report",
    "gpt_index_check",
    "open_token_files",
    "parse_weights",
]

# megatron-core's mid_level_dataset_surplus: each dataset of a blend is built for this much
# more than the blend takes from it
DEFAULT_SURPLUS = 0.005


@dataclass(frozen=True)
class IndexRequest:
    """Everything the sample order depends on, besides the token files themselves."""

    seq_length: int
    train_samples: int | None
    valid_samples: int | None = None
    test_samples: int | None = None
    split: str = DEFAULT_SPLIT
    seed: int = 1234
    weights: dict[str, float] | None = None
    surplus: float = DEFAULT_SURPLUS
    add_extra_token: bool = True
    # the train blend's later phases (weights from a sample on; ``weights`` is the first)
    phases: tuple[BlendPhase, ...] = ()
    # (name, num_samples) the train split's indices keep while they suffice (kept_indices)
    kept_sizes: tuple[tuple[str, int], ...] = ()

    def samples(self, split: str) -> int | None:
        return {"train": self.train_samples, "valid": self.valid_samples,
                "test": self.test_samples}[split]


@dataclass
class BuiltIndex:
    """The sample dataset of each split present, and the report of how they were made."""

    splits: dict[str, GPTSampleDataset | BlendedSampleDataset]
    report: dict = field(default_factory=dict)


def find_datasets(corpus_dir: str | os.PathLike) -> dict[str, IndexedDataset]:
    """Every ``NAME.idx`` (with its ``.bin``) in the folder, by name.

    Raises:
        UserError: when the folder is missing, holds no ``.idx``, or their token dtypes or
            recorded tokenizers differ (samples of a blend would not share one vocabulary).
    """
    corpus_dir = Path(corpus_dir)
    if not corpus_dir.is_dir():
        raise UserError(f"{corpus_dir}: not a folder (expected a folder of NAME.bin/.idx)")
    prefixes = corpus_prefixes(corpus_dir)
    if not prefixes:
        raise UserError(f"{corpus_dir}: no .idx files (run `dataprep tokenize` first)")
    return open_token_files(prefixes, str(corpus_dir))


def open_token_files(prefixes: Mapping[str, str | os.PathLike], where: str
                     ) -> dict[str, IndexedDataset]:
    """The token files of one blend (name -> ``PREFIX``, of ``PREFIX.bin/.idx``), by name.

    Raises:
        UserError: too many for a blend, or their token dtypes or recorded tokenizers differ
            (samples of a blend would not share one vocabulary).
    """
    if len(prefixes) > MAX_DATASETS:
        raise UserError(f"{where}: {len(prefixes)} datasets; a blend takes at most "
                        f"{MAX_DATASETS}")
    datasets = {name: IndexedDataset(prefix) for name, prefix in prefixes.items()}
    first = next(iter(datasets.values()))
    for dataset in datasets.values():
        if dataset.dtype != first.dtype:
            raise UserError(f"{dataset.idx_path}: tokens are {dataset.dtype}, but "
                            f"{first.idx_path} holds {first.dtype}; datasets used together "
                            "must come from one tokenizer")
    check_same_tokenizer({name: path_prefix(dataset) for name, dataset in datasets.items()})
    return datasets


def path_prefix(dataset: IndexedDataset) -> str:
    """``corpus/NAME`` of a dataset (its ``.idx`` without the suffix)."""
    return str(dataset.idx_path)[: -len(".idx")]


def parse_weights(values: list[str]) -> dict[str, float]:
    """``["wiki=0.3", "code=0.7"]`` -> ``{"wiki": 0.3, "code": 0.7}``; what a weight may be
    is the blend's rule (``blending.blended_datasets``), checked with the request."""
    weights: dict[str, float] = {}
    for value in values:
        add_named_weight(weights, value, partial(_weight_error, value),
                         "expected NAME=WEIGHT, e.g. wiki=0.3")
    return weights


def _weight_error(value: str, problem: str, **values: object) -> SettingError:
    return setting_error("weights", "{setting} {value!r}: " + problem, value=value, **values)


def _check_request(request: IndexRequest, names: list[str]) -> None:
    if request.seq_length < 1:
        raise setting_error("seq_length", "{setting} {value}: must be at least 1",
                            value=request.seq_length)
    for split in SPLIT_NAMES:
        samples = request.samples(split)
        if samples is not None and samples < 1:
            raise setting_error(f"{split}_samples", "{setting} {value}: must be at least 1",
                                value=samples)
    if not (request.surplus >= 0 and math.isfinite(request.surplus)):
        raise setting_error("surplus", "{setting} {value}: must be a non-negative number",
                            value=request.surplus)
    check_phases(request.weights, request.phases, request.train_samples, names)
    if request.weights is None:
        return
    unknown = sorted(set(request.weights) - set(names))
    if unknown:
        raise setting_error("weights", "{setting}: no dataset {name!r} in the corpus (it has: "
                            "{datasets})", entry=unknown[0], name=unknown[0],
                            datasets=", ".join(names))
    missing = [name for name in names if name not in request.weights]
    if missing and len(names) > 1:
        raise setting_error("weights", "{setting}: every dataset needs a weight when any has "
                            "one; missing: {missing}", missing=", ".join(missing))
    blended_datasets(request.weights)


def build_sample_datasets(corpus_dir: str | os.PathLike, request: IndexRequest,
                          cache_dir: str | os.PathLike | None = None) -> BuiltIndex:
    """Build (or load from the cache) the sample dataset of every split.

    Safe to call from every rank at once: one process builds each index, the others wait
    for it and memory-map the result (see :mod:`bloomline.dataprep.index_cache`).

    Raises:
        UserError: naming the file at fault, or (``SettingError``) the setting at fault,
            worded with dataprep's flags (a front end rewords it: ``SettingError.named``).
    """
    corpus_dir = Path(corpus_dir)
    return build_from_datasets(find_datasets(corpus_dir), str(corpus_dir),
                               Path(cache_dir) if cache_dir is not None else corpus_dir / ".index",
                               request)


def build_from_datasets(datasets: dict[str, IndexedDataset], where: str,
                        cache_dir: str | os.PathLike, request: IndexRequest,
                        blend_single: bool = False) -> BuiltIndex:
    """:func:`build_sample_datasets` of opened token files (``find_datasets``,
    ``open_token_files``), named ``where`` in messages; ``blend_single``: a blend even of one
    dataset (megatron-core's for one weighted ``--data-path`` prefix, built with the
    surplus)."""
    cache_dir = Path(cache_dir)
    names = list(datasets)
    _check_request(request, names)
    split_weights = parse_split(request.split)
    blend = len(names) > 1 or blend_single
    weights = None
    left_out: list[str] = []
    if blend and request.weights is not None:
        taken = drawn_datasets(request.weights, request.phases, names)
        left_out = [name for name in names if name not in taken]
        names = list(taken)
        datasets = {name: datasets[name] for name in names}
        weights = normalize_weights(list(taken.values()))
    identities = {name: file_identity(ds.idx_path) for name, ds in datasets.items()}
    ranges_by_split = _split_ranges(datasets, split_weights, request)
    plans = {split: _plan_split(split, ranges, datasets, identities, weights, blend, request)
             for split, ranges in ranges_by_split.items()}
    _check_fits(plans, cache_dir, request)
    splits: dict = {}
    report = {
        "corpus": where, "cache_dir": str(cache_dir),
        "seq_length": request.seq_length, "seed": request.seed, "split": request.split,
        "add_extra_token": request.add_extra_token, "surplus": request.surplus,
        "splits": {},
    }
    for split, plan in plans.items():
        components, entries = [], []
        for name in names:
            entry = _gpt_entry(cache_dir, plan.gpt[name], datasets[name], request)
            components.append(GPTSampleDataset(datasets[name], _sample_index(entry),
                                               request.add_extra_token))
            entries.append(entry)
        split_report = {"requested": plan.requested, "datasets": {}}
        if not blend:
            splits[split] = components[0]
        else:
            blend_entry = _blend_entry(cache_dir, plan, names, components, request)
            splits[split] = BlendedSampleDataset(
                components, names, blend_entry.arrays["dataset_index"],
                blend_entry.arrays["dataset_sample_index"])
            split_report["blend"] = {"cache": str(blend_entry.path),
                                     "status": blend_entry.status,
                                     **blend_entry.metadata}
        split_report["samples"] = len(splits[split])
        if left_out:
            split_report["left_out"] = left_out
        for position, (name, entry) in enumerate(zip(names, entries, strict=True)):
            row = {"cache": str(entry.path), "status": entry.status, **entry.metadata,
                   "samples": len(components[position])}
            if blend:
                row["used"] = split_report["blend"]["counts"][position]
                row["weight"] = split_report["blend"]["weights"][position]
                row["realized"] = row["used"] / max(1, split_report["samples"])
            split_report["datasets"][name] = row
        if plan.requested and split_report["samples"] == 0:  # never a silent empty success
            raise UserError(f"{where}: the {split} split serves 0 samples of the "
                            f"{plan.requested} requested; check the weights and the split")
        report["splits"][split] = split_report
    return BuiltIndex(splits, report)


@dataclass(frozen=True)
class _GptPlan:
    """One dataset's index of one split, before it is built: its cache description and
    the sizes of its arrays."""

    split: str
    name: str
    sequences: range
    num_samples: int | None
    description: dict
    shape: IndexShape

    @property
    def entry_name(self) -> str:  # as index_cache names the entry
        return f"gpt-{self.split}-{_label(self.name)}-{entry_key(self.description)}"


@dataclass(frozen=True)
class _SplitPlan:
    """What one split builds: an index per dataset and, for several datasets, a blend of
    ``blend_size`` positions (None: exhaustive, every built sample once)."""

    split: str
    requested: int | None
    gpt: dict[str, _GptPlan]
    blend_weights: np.ndarray | None = None
    blend_size: int | None = None
    blend_description: dict | None = None
    phases: PhasePlan | None = None  # the blend's phases (blend_phases), None: one plain phase

    @property
    def blend_positions(self) -> int:
        if self.blend_description is None:
            return 0
        if self.blend_size is None:
            return sum(plan.shape.num_built for plan in self.gpt.values())
        return self.blend_size


# bytes per blend position: dataset_index int16, dataset_sample_index int64
_BLEND_BYTES = 2 + 8


def _plan_split(split: str, ranges: dict[str, range], datasets: dict[str, IndexedDataset],
                identities: dict[str, str], weights: np.ndarray | None, blend: bool,
                request: IndexRequest) -> _SplitPlan:
    """The sample counts (megatron-core's rules, see the module docstring) and the cache
    descriptions of a split, from counts alone: nothing is built here."""
    names = list(datasets)
    requested = request.samples(split)
    phases = None if weights is None or requested is None else phase_plan(
        request.weights, request.phases if split == "train" else (), names)
    if phases is not None:  # a dataset no phase of this split draws: one epoch (for eval)
        per_dataset = [size or None for size in phases.component_sizes(requested,
                                                                       request.surplus)]
    elif weights is not None and requested is not None:
        per_dataset = blend_component_sizes(weights.tolist(), requested, request.surplus)
    elif blend:
        per_dataset = [None] * len(names)  # one epoch each
    else:
        per_dataset = [requested]
    kept = dict(request.kept_sizes) if split == "train" else {}
    gpt = {}
    for name, needed in zip(names, per_dataset, strict=True):
        dataset, sequences = datasets[name], ranges[name]
        lengths = dataset.sequence_lengths
        shape_of = partial(
            index_shape, int(lengths[sequences.start : sequences.stop].sum(dtype=np.int64)),
            len(sequences), max(sequences.stop - 1, 0), int(lengths.max(initial=0)),
            request.seq_length, add_extra_token=request.add_extra_token)
        num_samples = kept_size(kept.get(name), needed, shape_of)
        shape = shape_of(num_samples)
        description = {
            "kind": "gpt", "idx": identities[name],
            "bin_bytes": dataset.bin_path.stat().st_size, "split": split,
            "sequences": [sequences.start, sequences.stop], "seq_length": request.seq_length,
            "num_samples": num_samples, "seed": request.seed,
            "add_extra_token": request.add_extra_token,
        }
        gpt[name] = _GptPlan(split, name, sequences, num_samples, description, shape)
    if not blend:
        return _SplitPlan(split, requested, gpt)
    if phases is not None:
        size, blend_weights = phases.size(requested), phases.weights[0]
    elif weights is not None and requested is not None:
        size = sum(blend_component_sizes(weights.tolist(), requested))
        blend_weights = weights
    else:
        # no weights (or no count for this split): each dataset once, in proportion to size
        lengths = [plan.shape.num_built for plan in gpt.values()]
        size = None if requested is None else min(requested, sum(lengths))
        blend_weights = normalize_weights(lengths)
    description = {
        "kind": "blend", "split": split,
        "components": [plan.entry_name for plan in gpt.values()],
        "weights": blend_weights.tolist(), "size": size,
    }
    if phases is not None:
        description["phases"] = phases.description()
    return _SplitPlan(split, requested, gpt, blend_weights, size, description, phases)


def _check_fits(plans: dict[str, _SplitPlan], cache_dir: Path, request: IndexRequest) -> None:
    """Refuse, before anything is built, a request whose missing cache entries need more
    memory to build (the largest one: they are built one at a time) than the machine has
    available, or more disk (all of them) than the cache folder has free."""
    peak, peak_split, disk, disk_by_split = 0, None, 0, {}
    for split, plan in plans.items():
        builds = [(plan.entry_name, plan.shape.build_bytes, sum(plan.shape.array_bytes.values()))
                  for plan in plan.gpt.values()]
        if plan.blend_description is not None:
            size = plan.blend_positions * _BLEND_BYTES
            builds.append((f"blend-{split}-{entry_key(plan.blend_description)}", size, size))
        for entry_name, memory, stored in builds:
            if os.path.lexists(cache_dir / entry_name):
                continue
            if memory > peak:
                peak, peak_split = memory, split
            disk += stored
            disk_by_split[split] = disk_by_split.get(split, 0) + stored
    if peak_split is not None:
        available = available_memory()
        if available is not None and peak > available:
            raise _too_large(request, peak_split, "building its largest index needs {need} "
                             "of memory and this machine has {have} available; lower "
                             "{setting} or build it on a machine with more memory",
                             need=format_bytes(peak), have=format_bytes(available))
    if disk_by_split:
        free = free_disk(cache_dir)
        if free is not None and disk > free:
            split = max(disk_by_split, key=disk_by_split.get)
            raise _too_large(request, split, "the index cache needs {need} of disk in "
                             "{cache} and it has {have} free; lower {setting}, free space "
                             "there or use another cache folder", need=format_bytes(disk),
                             have=format_bytes(free), cache=str(cache_dir))


def _too_large(request: IndexRequest, split: str, problem: str, **values: object
               ) -> SettingError:
    samples = request.samples(split)
    value = f"{samples:,}" if samples is not None else "(one epoch)"
    return setting_error(f"{split}_samples", "{setting} {value}: " + problem, value=value,
                         **values)


def _split_ranges(datasets: dict[str, IndexedDataset], split_weights: tuple[float, ...],
                  request: IndexRequest) -> dict[str, dict[str, range]]:
    """Sequence ids of every (split, dataset), checked before anything is built: each must
    hold at least one sample's worth of tokens."""
    ranges_by_split: dict[str, dict[str, range]] = {}
    for name, dataset in datasets.items():
        for split, ids in split_sequence_ranges(len(dataset), split_weights).items():
            ranges_by_split.setdefault(split, {})[name] = ids
    needed = request.seq_length + int(request.add_extra_token)
    for split, ranges in ranges_by_split.items():
        for name, dataset in datasets.items():
            ids = ranges.get(name)
            if ids is None or len(ids) == 0:
                hint, dropped = _drop_hint(request.split, split)
                raise setting_error(
                    "split", "the {part} split ({value}) gets none of its {sequences} "
                    "sequences; give the split a larger share with {setting}" + hint
                    + " or add data", part=split, value=request.split,
                    sequences=len(dataset), dropped=dropped).within(str(dataset.idx_path))
            tokens = int(dataset.sequence_lengths[ids.start : ids.stop].sum(dtype=np.int64))
            if tokens < needed:
                hint, dropped = _drop_hint(request.split, split)
                raise setting_error(
                    "split", "the {part} split ({setting} {value}) has 0 samples and needs at "
                    "least 1: its {sequences} sequences hold {tokens} tokens, too few for one "
                    "sample of {needed}; lower {seq_length} or give the split a larger share "
                    "with {setting}" + hint, part=split, value=request.split,
                    sequences=len(ids), tokens=tokens, needed=needed,
                    dropped=dropped).within(str(dataset.idx_path))
    # splits in train, valid, test order
    return {split: ranges_by_split[split] for split in SPLIT_NAMES if split in ranges_by_split}


def _drop_hint(split_arg: str, split: str) -> tuple[str, str | None]:
    """How to leave out a valid or test split the data cannot fill: a message template's
    tail naming the user's split with that share 0 (the ``dropped`` value), or none (the train
    split cannot be left out)."""
    shares = [part.strip() for part in split_arg.split(",")]
    position = SPLIT_NAMES.index(split)
    if position == 0 or position >= len(shares):
        return "", None
    shares[position] = "0"
    return " (a 0 share leaves it out: {split} {dropped})", ",".join(shares)


def _gpt_entry(cache_dir: Path, plan: _GptPlan, dataset: IndexedDataset,
               request: IndexRequest) -> CacheEntry:
    split, sequence_range, num_samples = plan.split, plan.sequences, plan.num_samples

    def build():
        try:
            index = build_sample_index(dataset.sequence_lengths, sequence_range,
                                       request.seq_length, num_samples, request.seed,
                                       request.add_extra_token)
        except SettingError as error:  # the setting at fault stays named by the front end
            raise error.within(f"{dataset.idx_path}: {split} split") from None
        except UserError as error:
            raise UserError(f"{dataset.idx_path}: {split} split: {error}") from None
        arrays = {"document_index": index.document_index, "sample_index": index.sample_index,
                  "shuffle_index": index.shuffle_index}
        metadata = {"documents": len(sequence_range), "tokens": index.num_tokens_per_epoch,
                    "epochs": index.num_epochs, "requested": num_samples,
                    "separate_last_epoch": index.separate_last_epoch}
        return arrays, metadata

    return cached_arrays(cache_dir, f"gpt-{split}-{_label(plan.name)}", plan.description, build,
                         gpt_index_check(dataset.sequence_lengths, sequence_range))


def _label(name: str) -> str:
    """A dataset's name as part of a cache entry's (folder) name: ``--data-path`` names
    datasets of equal stems ``code/train``, ``docs/train``."""
    return name.replace("/", "~")


def _sample_index(entry: CacheEntry) -> SampleIndex:
    meta = entry.metadata
    return SampleIndex(entry.arrays["document_index"], entry.arrays["sample_index"],
                       entry.arrays["shuffle_index"], meta["epochs"], meta["tokens"],
                       meta["separate_last_epoch"])


def _blend_entry(cache_dir: Path, plan: _SplitPlan, names: list[str],
                 components: list[GPTSampleDataset], request: IndexRequest) -> CacheEntry:
    split, size, blend_weights = plan.split, plan.blend_size, plan.blend_weights
    lengths = [len(component) for component in components]
    planned = [gpt.shape.num_built for gpt in plan.gpt.values()]
    if lengths != planned:  # the plan's description would name another blend: a bug
        raise AssertionError(f"{split} split: built {lengths} samples, planned {planned}")
    description = plan.blend_description

    def build():
        if size is None:
            dataset_index, dataset_sample_index = build_exhaustive_blend_indices(lengths)
        elif plan.phases is not None:
            dataset_index, dataset_sample_index = plan.phases.build(size)
        else:
            dataset_index, dataset_sample_index = build_blend_indices(blend_weights, size)
        counts = np.bincount(dataset_index, minlength=len(names)).tolist()
        for name, count, length in zip(names, counts, lengths, strict=True):
            if count > length:
                raise setting_error(
                    "weights", "{setting}: the {part} blend draws {count} samples from "
                    "{name!r} but its index holds {length}; raise {surplus} (now {now}), "
                    "e.g. to {suggested:g}", entry=name, part=split, count=count, name=name,
                    length=length, now=request.surplus,
                    suggested=max(0.05, 10 * request.surplus))
        arrays = {"dataset_index": dataset_index, "dataset_sample_index": dataset_sample_index}
        metadata = {"size": len(dataset_index), "counts": counts,
                    "weights": blend_weights.tolist(), "exhaustive": size is None}
        if plan.phases is not None:
            metadata["phases"] = plan.phases.report(dataset_index, names)
        return arrays, metadata

    return cached_arrays(cache_dir, f"blend-{split}", description, build,
                         blend_index_check(lengths))


def format_report(report: dict) -> str:
    """The report as a few aligned lines per split, for people (``--json`` is for scripts)."""
    lines = [f"{report['corpus']}: L={report['seq_length']} seed={report['seed']} "
             f"split={report['split']} cache={report['cache_dir']}"]
    if report.get("datasets"):  # --data-path and the like: which name is which prefix
        lines.append("datasets: " + ", ".join(
            f"{name}={prefix}" for name, prefix in report["datasets"].items()))
    for split, info in report["splits"].items():
        requested = info["requested"]
        head = f"{split}: {info['samples']:,} samples"
        head += " (one epoch of each dataset)" if requested is None else (
            f" (requested {requested:,})")
        if requested is not None and info["samples"] < requested:
            head += f"; SHORT by {requested - info['samples']:,}: no weights, one epoch each"
        if "blend" in info:
            head += f"; blend {info['blend']['status']} {info['blend']['cache']}"
        lines.append(head)
        columns = ["dataset", "documents", "tokens", "epochs", "samples", "sep.last"]
        blend = "blend" in info
        if blend:
            columns += ["used", "weight", "realized"]
        columns.append("index")
        rows = [columns]
        for name, row in info["datasets"].items():
            cells = [name, f"{row['documents']:,}", f"{row['tokens']:,}", str(row["epochs"]),
                     f"{row['samples']:,}", "yes" if row["separate_last_epoch"] else "no"]
            if blend:
                cells += [f"{row['used']:,}", f"{row['weight']:.4f}", f"{row['realized']:.4f}"]
            cells.append(f"{row['status']} {Path(row['cache']).name}")
            rows.append(cells)
        widths = [max(len(r[i]) for r in rows) for i in range(len(columns))]
        for r in rows:
            lines.append("  " + "  ".join(
                cell.ljust(width) if i in (0, len(columns) - 1) else cell.rjust(width)
                for i, (cell, width) in enumerate(zip(r, widths, strict=True))).rstrip())
        if info.get("left_out"):
            lines.append(f"  left out (weight 0): {', '.join(info['left_out'])}")
        if len(info.get("blend", {}).get("phases", ())) > 1:
            lines += format_phases(info["blend"]["phases"])
    return "\n".join(lines)
