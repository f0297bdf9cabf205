"""Samples from dataprep's index into micro-batches, in Megatron's order.

The order is a pure function of the index (built by ``bloomline.dataprep``) and
``consumed_samples``: the sampler walks the train split from there in blocks of
micro_batch_size x data-parallel size and hands each data-parallel rank its contiguous slice,
exactly as Megatron's ``MegatronPretrainingSampler``. Resuming needs only the counter; a
different data-parallel size sees the same samples in the same global order.

This module's one job is what is read and in which order; the worker processes' lifecycle is
``workers.py``'s, the tokenizer and the vocabulary checks around the samples are
``run_tokenizer.py``'s and ``vocabulary.py``'s.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Sampler, get_worker_info

from bloomline.common.errors import SettingError, UserError
from bloomline.dataprep import IndexRequest, build_sample_datasets
from bloomline.trainer.blend_phases import phase_requests
from bloomline.trainer.config import Config
from bloomline.trainer.data.workers import TrackedLoader, close_loader, init_worker
from bloomline.trainer.dataprep_keys import DATAPREP_KEYS
from bloomline.trainer.survival import faults
from bloomline.trainer.survival.sample_skips import SkipRanges

__all__ = ["MegatronSampler", "StepBatches", "TokenSamples", "make_loader", "open_splits",
           "open_step_batches"]


class TokenSamples(Dataset):
    """A dataprep sample dataset as int64 tensors of L + 1 tokens (picklable: workers reopen
    the memory maps instead of copying them).

    The loader reads a whole micro-batch in one call: torch's DataLoader calls
    ``__getitems__`` with the batch sampler's ids, which reads them with dataprep's
    vectorized ``get_batch`` (in the file's token dtype) and converts once, straight into
    the tensor the worker hands over; ``make_loader``'s collate keeps that tensor as it is.
    """

    def __init__(self, samples, seq_length: int) -> None:
        self.samples = samples
        self.seq_length = seq_length
        # the train split's: each dataset's index sample count (TrainState.data_index_samples)
        self.index_samples: dict[str, int] = {}
        self.index_report: dict | None = None  # the train split's: dataprep's build report

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> torch.Tensor:
        tokens = self.samples[index]
        if len(tokens) != self.seq_length + 1:  # an index built for another L
            raise UserError(f"sample {index} has {len(tokens)} tokens, expected "
                            f"data.seq_length + 1 = {self.seq_length + 1}")
        return torch.from_numpy(np.asarray(tokens, dtype=np.int64))

    def __getitems__(self, indices: list[int]) -> torch.Tensor:
        """Samples ``indices`` as one [len(indices), L + 1] int64 tensor."""
        get_batch = getattr(self.samples, "get_batch", None)
        if get_batch is None:  # a plain sequence of samples (tests, tools)
            tokens = np.stack([np.asarray(self.samples[i]) for i in indices])
        else:
            tokens = get_batch(indices)  # (b, L + 1), uint16 or int32
        if tokens.shape[1:] != (self.seq_length + 1,):  # an index built for another L
            raise UserError(f"samples have {tokens.shape[1]} tokens, expected "
                            f"data.seq_length + 1 = {self.seq_length + 1}")
        batch = _int64_batch(tokens.shape)
        np.copyto(batch.numpy(), tokens, casting="safe")  # int64 tokens, converted once
        return batch


def _int64_batch(shape: tuple[int, int]) -> torch.Tensor:
    """An empty int64 tensor; in a loader worker, in shared memory: default_collate's trick,
    which spares the copy into shared memory that sending a tensor to the trainer costs."""
    if get_worker_info() is None:
        return torch.empty(shape, dtype=torch.int64)
    numel = shape[0] * shape[1]
    storage = torch.empty(0, dtype=torch.int64)._typed_storage()._new_shared(numel)
    return torch.empty(0, dtype=torch.int64).new(storage).view(shape)


def _keep_batch(batch: torch.Tensor) -> torch.Tensor:
    """The loader's collate: ``__getitems__`` returns the micro-batch tensor already."""
    return batch


class MegatronSampler(Sampler[list[int]]):
    """Micro-batches of sample ids for one data-parallel rank, from ``consumed_samples`` on.

    Megatron's ``MegatronPretrainingSampler``: ids are taken in order in blocks of
    ``micro_batch_size * dp_size``; rank r gets ``block[r * mbs : (r + 1) * mbs]``. An
    incomplete last block is dropped. Positions in ``skip`` (``SkipRanges``) are never taken:
    the blocks are made of the ids around them, in the same order.
    """

    def __init__(self, total_samples: int, consumed_samples: int, micro_batch_size: int,
                 dp_rank: int = 0, dp_size: int = 1, skip: SkipRanges | None = None) -> None:
        if consumed_samples >= total_samples:
            raise UserError(f"consumed samples {consumed_samples} >= the {total_samples} "
                            "samples of the train split: the run is complete")
        self.total = total_samples
        self.consumed = consumed_samples
        self.micro_batch_size = micro_batch_size
        self.dp_rank = dp_rank
        self.dp_size = dp_size
        self.skip = skip or SkipRanges()

    def __len__(self) -> int:
        if self.skip:
            return sum(1 for _ in self)
        return (self.total - self.consumed) // (self.micro_batch_size * self.dp_size)

    def __iter__(self) -> Iterator[list[int]]:
        block = self.micro_batch_size * self.dp_size
        mine = slice(self.dp_rank * self.micro_batch_size,
                     (self.dp_rank + 1) * self.micro_batch_size)
        if not self.skip:  # the common case, without walking every position
            start = self.consumed + mine.start
            for first in range(start, self.total - block + 1 + mine.start, block):
                yield list(range(first, first + self.micro_batch_size))
            return
        ids: list[int] = []
        for position in self.skip.positions(self.consumed, self.total):
            ids.append(position)
            if len(ids) == block:
                yield ids[mine]
                ids = []


def open_splits(corpus: str, seq_length: int, train_samples: int, valid_samples: int | None,
                split: str, seed: int, weights: dict[str, float] | None,
                cache_dir: str | None = None, phases: list | None = None,
                kept_sizes: dict[str, int] | None = None) -> dict[str, TokenSamples]:
    """The train (and valid, when the split has one) samples, building the index if missing
    (one process builds under a file lock; the others wait and map it). ``phases``: the
    run's blend phases (``blend_phases.py``), in place of ``weights`` when given;
    ``kept_sizes``: the train indices' sample counts to keep while they suffice
    (``dataprep.kept_indices``; the train samples' ``index_samples`` say the counts used)."""
    if not corpus:
        raise UserError("data.corpus: not set; give the folder of NAME.bin/.idx files "
                        "(made by dataprep tokenize), or their prefixes with data.data_path")
    request = IndexRequest(seq_length=seq_length, train_samples=train_samples,
                           valid_samples=valid_samples, test_samples=None, split=split,
                           seed=seed, weights=weights or None)
    if phases:
        first, later = phase_requests(phases)
        request = replace(request, weights=first, phases=later)
    if kept_sizes:
        request = replace(request, kept_sizes=tuple(kept_sizes.items()))
    try:
        built = build_sample_datasets(corpus, request, cache_dir=cache_dir or None)
    except SettingError as err:  # dataprep's settings, worded as the trainer's keys
        raise err.named(DATAPREP_KEYS) from None
    if "train" not in built.splits:
        raise UserError(f"data.split {split!r}: gives the train split no documents")
    splits = {name: TokenSamples(ds, seq_length) for name, ds in built.splits.items()}
    rows = built.report["splits"]["train"]["datasets"]
    splits["train"].index_samples = {name: row["requested"] for name, row in rows.items()
                                     if row["requested"] is not None}
    splits["train"].index_report = built.report  # which were built: the start-up's line
    return splits


def make_loader(samples: TokenSamples, sampler: MegatronSampler, num_workers: int,
                prefetch_factor: int, pin_memory: bool) -> DataLoader:
    """Worker processes assemble whole micro-batches ahead of the step (prefetch), each with
    one batched read (``TokenSamples.__getitems__``); pinned memory makes the host-to-GPU
    copy asynchronous. Its iterators are shut down by ``close_loader`` (the trainer does it
    when a run ends or fails), else when the process exits."""
    kwargs = {}
    if num_workers > 0:
        kwargs = {"prefetch_factor": prefetch_factor, "persistent_workers": False,
                  "worker_init_fn": init_worker}
    # a generator of its own for the seed torch draws at each iterator's start (its workers'):
    # from the global one, a resume drew it after restoring the checkpoint's RNG states, and
    # every dropout mask after it differed from the uninterrupted run's
    return TrackedLoader(samples, batch_sampler=sampler, num_workers=num_workers,
                         collate_fn=_keep_batch, pin_memory=pin_memory,
                         generator=torch.Generator(), **kwargs)


class StepBatches:
    """The micro-batches of each training step from a position of the train split, and the
    sample ids of each micro-batch when ``with_ids`` (a blend's per-source losses) or when
    ``spike@batch`` faults are injected: their micro-batches come corrupted here
    (``survival/faults.py``), so the loop never sees the test hook.

    Owns the loader's worker processes: ``close`` (or a new ``StepBatches`` after a rollback)
    ends them.
    """

    def __init__(self, sampler: MegatronSampler, loader: DataLoader, with_ids: bool,
                 vocab_size: int) -> None:
        self._batches = iter(loader)
        self.vocab_size = vocab_size
        wants_ids = with_ids or bool(faults.spike_samples())
        # the sampler again, in this process: the ids of the micro-batches the workers read
        self._ids = iter(sampler) if wants_ids else None

    def next_step(self, count: int, length: int
                  ) -> tuple[list[torch.Tensor], list[list[int]] | None]:
        """The next ``count`` micro-batches cut to ``length`` + 1 tokens ([mbs, L + 1]), and
        their sample ids (None unless asked for or needed by a fault)."""
        micro = [next(self._batches)[:, : length + 1] for _ in range(count)]
        ids = [next(self._ids) for _ in micro] if self._ids is not None else None
        if ids is not None:  # unchanged unless spike faults are injected
            micro = faults.corrupt_spiked(micro, ids, self.vocab_size)
        return micro, ids

    def close(self) -> None:
        close_loader(self._batches)


def open_step_batches(train: TokenSamples, cfg: Config, consumed_samples: int, dp_rank: int,
                      dp: int, skips: SkipRanges, pin_memory: bool,
                      with_ids: bool) -> StepBatches:
    """This data-parallel rank's micro-batches of the train split from ``consumed_samples``
    on, in Megatron's order with ``skips`` left out: the sampler, its loader and their
    ``StepBatches`` (``with_ids``: also each micro-batch's sample ids). The caller closes the
    previous ``StepBatches`` first, so that two loaders' workers never run at once."""
    sampler = MegatronSampler(cfg.train.train_samples, consumed_samples,
                              cfg.train.micro_batch_size, dp_rank, dp, skips)
    loader = make_loader(train, sampler, cfg.data.num_workers, cfg.data.prefetch_factor,
                         pin_memory)
    return StepBatches(sampler, loader, with_ids, cfg.model.vocab_size)
