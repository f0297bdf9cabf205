"""Sample order, LR schedule, curriculum and generation helpers against their definitions."""

from __future__ import annotations

import math

import torch

from bloomline.trainer.config import Config, OptimizerConfig, ScheduleConfig
from bloomline.trainer.curriculum import global_batch_size, sequence_length
from bloomline.trainer.data import MegatronSampler
from bloomline.trainer.generate import sample_next
from bloomline.trainer.optim import learning_rate


def _megatron_sampler(total, consumed, mbs, rank, size):
    """Megatron's MegatronPretrainingSampler.__iter__, transcribed as the reference."""
    batch, out = [], []
    for idx in range(consumed, total):
        batch.append(idx)
        if len(batch) == mbs * size:
            out.append(batch[rank * mbs:(rank + 1) * mbs])
            batch = []
    return out


def test_sampler_matches_megatron_for_every_rank_and_resume_point():
    """Catches: an off-by-one at the resume point or ranks reading overlapping samples."""
    for total, consumed, mbs, size in [(50, 0, 2, 1), (50, 7, 2, 3), (101, 12, 4, 2)]:
        for rank in range(size):
            ours = list(MegatronSampler(total, consumed, mbs, rank, size))
            assert ours == _megatron_sampler(total, consumed, mbs, rank, size)


def test_lr_warmup_then_cosine_to_min():
    """Catches: a schedule that does not reach min_lr at the end or jumps after warmup."""
    opt, sched = OptimizerConfig(lr=1.0, min_lr=0.1), ScheduleConfig(warmup=10)
    assert learning_rate(5, 110, opt, sched) == 0.5
    assert learning_rate(10, 110, opt, sched) == 1.0
    assert math.isclose(learning_rate(60, 110, opt, sched), 0.55)
    assert math.isclose(learning_rate(110, 110, opt, sched), 0.1)
    sched.style = "linear"
    assert math.isclose(learning_rate(60, 110, opt, sched), 0.55)


def test_batch_rampup_is_megatrons():
    """Catches: a rampup that increments per step instead of per consumed samples
    (Megatron: start + floor(consumed / (samples / increments)) * increment)."""
    cfg = Config()
    cfg.train.micro_batch_size, cfg.train.global_batch_size = 1, 32
    cfg.train.rampup_batch_size = [8, 8, 300]  # 3 increments, one per 100 samples
    assert [global_batch_size(cfg, c) for c in (0, 99, 100, 250, 300, 10**6)] == [
        8, 8, 16, 24, 32, 32]


def test_sequence_warmup_is_linear_and_rounded_down_to_the_step():
    cfg = Config()
    cfg.data.seq_length = 256
    cfg.curriculum.seqlen_warmup = True
    cfg.curriculum.start_seq_length, cfg.curriculum.seq_length_step = 16, 16
    cfg.curriculum.warmup_tokens = 1000
    assert [sequence_length(cfg, t) for t in (0, 500, 999, 1000)] == [16, 128, 240, 256]


def test_top_k_and_top_p_only_draw_allowed_tokens():
    """Catches: top-p keeping the token that crosses the mass (or dropping the first)."""
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    generator = torch.Generator().manual_seed(0)
    assert sample_next(logits, 0.0, 0, 1.0, None) == 0
    assert {sample_next(logits, 1.0, 2, 1.0, generator) for _ in range(200)} == {0, 1}
    assert {sample_next(logits, 1.0, 0, 0.8, generator) for _ in range(200)} == {0, 1}
    assert {sample_next(logits, 1.0, 0, 0.4, generator) for _ in range(50)} == {0}


def test_generation_never_draws_a_padding_id():
    """Bug: sampling from the padded vocabulary (model vocab 128 > tokenizer's 100) draws an
    id the tokenizer cannot decode (SentencePiece raises OUT_OF_RANGE)."""
    import torch

    from bloomline.trainer.generate import generate_ids

    class Padded(torch.nn.Module):  # all the probability mass on the padding ids
        def forward(self, ids):
            logits = torch.zeros(1, ids.shape[1], 128)
            logits[..., 100:] = 50.0
            return logits

        def parameters(self):
            return iter([torch.zeros(1)])

    ids = generate_ids(Padded(), [1], 20, temperature=1.0, seed=3, vocab_size=100)
    assert len(ids) == 20 and max(ids) < 100
