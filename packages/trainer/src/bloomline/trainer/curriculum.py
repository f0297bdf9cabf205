"""Curriculum: how long the samples and how large the batch are at a point of training.

- Sequence-length warmup (DeepSpeed's curriculum learning, ``seqlen`` metric, fixed_linear):
  the first tokens train on samples truncated to a length growing linearly from
  ``start_seq_length`` to the full length over ``warmup_tokens`` tokens, rounded down to a
  multiple of ``seq_length_step``. Truncation keeps sample order: sample i is the same
  sample, only its tail is not used.
- Batch-size rampup (Megatron's ``--rampup-batch-size start increment samples``): the
  global batch grows from ``start`` by ``increment`` every samples / ((global - start) /
  increment) consumed samples, rounded down to a multiple of micro-batch x data-parallel.
- The run's length follows: ``total_steps`` counts the global batches until the train
  samples run out, and ``schedule_progress`` places the learning-rate schedule.
"""

from __future__ import annotations

from bloomline.trainer.config import Config

__all__ = ["global_batch_size", "schedule_progress", "sequence_length", "total_steps"]


def sequence_length(cfg: Config, consumed_tokens: int) -> int:
    full = cfg.data.seq_length
    c = cfg.curriculum
    if not c.seqlen_warmup or c.warmup_tokens <= 0 or consumed_tokens >= c.warmup_tokens:
        return full
    length = c.start_seq_length + (full - c.start_seq_length) * consumed_tokens / c.warmup_tokens
    length = int(length) // c.seq_length_step * c.seq_length_step
    return min(full, max(length, c.seq_length_step, 1))


def global_batch_size(cfg: Config, consumed_samples: int, data_parallel: int = 1) -> int:
    final = cfg.train.global_batch_size
    if not cfg.train.rampup_batch_size:
        return final
    start, increment, ramp_samples = cfg.train.rampup_batch_size
    increments = (final - start) // increment
    if increments == 0 or ramp_samples == 0:
        return final
    per_increment = ramp_samples / increments
    size = min(final, start + int(consumed_samples / per_increment) * increment)
    step = cfg.train.micro_batch_size * data_parallel
    return max(step, size // step * step)


def total_steps(cfg: Config, data_parallel: int, skips) -> int:
    """Steps of the whole run: global batches until the train samples run out (samples in
    ``skips``, a ``SkipRanges``, count as consumed)."""
    consumed, steps = 0, 0
    while True:
        size = global_batch_size(cfg, consumed, data_parallel)
        following = skips.advance(consumed, size)
        if following > cfg.train.train_samples:
            return steps
        consumed = following
        steps += 1


def schedule_progress(cfg: Config, state) -> tuple[int, int]:
    """(done, total) of the run in ``schedule.unit`` (tokens or samples), from the trainer's
    counters: where the learning-rate schedule stands."""
    if cfg.schedule.unit == "tokens":
        return state.consumed_tokens, cfg.train.train_samples * cfg.data.seq_length
    return state.consumed_samples, cfg.train.train_samples
