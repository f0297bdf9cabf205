"""The loader reads each micro-batch with one batched read (``TokenSamples.__getitems__``)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from trainer_fixtures import write_corpus

from bloomline.common.errors import UserError
from bloomline.trainer.data import MegatronSampler, TokenSamples, make_loader, open_splits


def _splits(tmp_path, blend: bool):
    folder = tmp_path / "corpus"
    write_corpus(folder)
    weights = None
    if blend:  # a second and third dataset: the train split is a blend of three
        write_corpus(folder / "more", documents=80, seed=1)
        write_corpus(folder / "again", documents=60, seed=2)
        for sub in ("more", "again"):
            for suffix in (".bin", ".idx"):
                (folder / sub / f"toy{suffix}").rename(folder / f"{sub}{suffix}")
        weights = {"toy": 0.5, "more": 0.3, "again": 0.2}
    return open_splits(str(folder), 32, 300, None, "90,10,0", 1234, weights)


class _Counting:
    """A sample dataset that counts the batched reads."""

    def __init__(self, samples) -> None:
        self.samples, self.calls = samples, 0

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i):
        return self.samples[i]

    def get_batch(self, ids):
        self.calls += 1
        return self.samples.get_batch(ids)


@pytest.mark.parametrize("blend", [False, True], ids=["single", "blend"])
def test_loader_reads_one_batch_per_micro_batch_equal_to_stacked_samples(tmp_path, blend):
    """Bug: the loader reads sample by sample again (``__getitems__`` not called), or its
    batched read differs from the samples ``ds[i]`` gives (other tokens, order within the
    micro-batch, int64 conversion): the losses would change."""
    train = _splits(tmp_path, blend)["train"]
    assert hasattr(train.samples, "dataset_index") == blend
    counting = _Counting(train.samples)
    samples = TokenSamples(counting, train.seq_length)
    sampler = MegatronSampler(len(train), 6, 4, dp_rank=1, dp_size=2)
    batches = list(make_loader(samples, sampler, num_workers=0, prefetch_factor=2,
                               pin_memory=False))
    assert counting.calls == len(batches) == len(sampler)
    for batch, ids in zip(batches, sampler, strict=True):
        assert batch.dtype == torch.int64 and batch.shape == (4, 33)
        assert torch.equal(batch, torch.stack([train[i] for i in ids]))


@pytest.mark.slow
def test_loader_workers_hand_over_the_same_batches(tmp_path):
    """Bug: a batch built in a worker's shared memory that is corrupted, reordered or
    truncated on its way to the trainer."""
    train = _splits(tmp_path, blend=True)["train"]
    sampler = MegatronSampler(len(train), 0, 8)
    expected = list(make_loader(train, sampler, 0, 2, False))
    got = list(make_loader(train, sampler, num_workers=2, prefetch_factor=2, pin_memory=False))
    assert len(got) == len(expected) > 2
    for have, want in zip(got, expected, strict=True):
        assert torch.equal(have, want)


def test_batched_read_names_the_field_for_samples_of_another_length(tmp_path):
    """Bug: an index built for another L served as if it fit data.seq_length."""
    train = _splits(tmp_path, blend=False)["train"]
    with pytest.raises(UserError, match="data.seq_length \\+ 1 = 17"):
        TokenSamples(train.samples, 16).__getitems__([0, 1])
    plain = TokenSamples([np.arange(33), np.arange(33) + 1], 32)  # no get_batch: stacked
    assert torch.equal(plain.__getitems__([1, 0]), torch.stack([plain[1], plain[0]]))
