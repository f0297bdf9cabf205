"""What a resume does between restoring a checkpoint's generator states and its first step
draws nothing from the global generators: a draw there changes every dropout mask after it, so
a run with dropout resumed to other losses than the uninterrupted run's (the golden
checkpoints' test found it: ``test_golden_checkpoints.py``)."""

from __future__ import annotations

import random

import numpy as np
import torch

from bloomline.trainer.data.loader import MegatronSampler, make_loader
from bloomline.trainer.reporting.mfu import measure_peak_flops


def _global_states():
    return random.getstate(), np.random.get_state()[1].tolist(), torch.get_rng_state()


def _same(before, after) -> bool:
    return before[0] == after[0] and before[1] == after[1] and torch.equal(before[2], after[2])


def test_loader_iterator_draws_no_global_random_number():
    """Bug: torch's DataLoader draws its workers' base seed from the global torch generator at
    each iterator's start; a resume creates its iterator after restoring the checkpoint's
    states, so the first dropout mask (and every one after it) differed from the
    uninterrupted run's."""
    samples = torch.arange(64).reshape(16, 4)
    sampler = MegatronSampler(16, 4, 2, 0, 1, None)
    loader = make_loader(samples, sampler, num_workers=0, prefetch_factor=2, pin_memory=False)
    before = _global_states()
    batches = iter(loader)
    next(batches)
    assert _same(before, _global_states())


def test_peak_measurement_draws_no_global_random_number():
    """Bug: the matmul peak, measured after a resume has restored the checkpoint's states
    (``monitor.peak_flops = 0`` and no cached measurement), filled its operands with
    ``torch.randn`` from the global generator: the resumed run's dropout masks differed from
    the uninterrupted run's."""
    before = _global_states()
    measure_peak_flops(torch.device("cpu"), torch.float32, seconds=0.01, max_seconds=0.05)
    assert _same(before, _global_states())
