"""The rules between config fields, each a UserError of one line naming the fields: what
``run_spec.settle`` checks, once, before anything of a run is built. The fields' own ranges
are declared with the fields (``config.py``) and checked when a config is loaded.
"""

from __future__ import annotations

import re

from bloomline.common.config_loader import check_ranges
from bloomline.common.errors import SettingError, UserError
from bloomline.dataprep import parse_split
from bloomline.dataprep.blending import blended_datasets
from bloomline.dataprep.data_args import check_choice
from bloomline.dataprep.gpt_index import DEFAULT_SPLIT
from bloomline.trainer.blend_phases import configured_phases
from bloomline.trainer.config import Config, DataConfig
from bloomline.trainer.dataprep_keys import DATAPREP_KEYS
from bloomline.trainer.parallel.mesh import Layout
from bloomline.trainer.reporting.wandb_sink import check_wandb_settings

__all__ = ["check_step_microbatches", "parallel_sizes", "pipeline_microbatches",
           "resolve_layout", "validate"]

_DEVICE = re.compile(r"auto|cpu|cuda(:[0-9]+)?")


def validate(cfg: Config, data_parallel: int = 1) -> None:
    """Every field within the range declared next to it (``ranged``), then the rules between
    fields, each a UserError of one line naming them. ``data_parallel``: the dp size once it
    is known; :func:`parallel_sizes` adds the rules that need the world size."""
    check_ranges(cfg)
    t, d, c = cfg.train, cfg.data, cfg.curriculum
    if not _DEVICE.fullmatch(t.device):
        raise UserError(f"train.device = {t.device!r}: expected cpu, cuda, cuda:N or auto")
    if t.rampup_batch_size:
        if len(t.rampup_batch_size) != 3:
            raise UserError("train.rampup_batch_size: expected [start, increment, samples]")
        start, increment, samples = t.rampup_batch_size
        if start < 1 or increment < 1 or samples < 0 or start > t.global_batch_size or (
                (t.global_batch_size - start) % increment):
            raise UserError(f"train.rampup_batch_size {t.rampup_batch_size}: need 1 <= start "
                            "<= global_batch_size, increment >= 1 dividing "
                            "global_batch_size - start")
    if t.profile_steps:
        try:
            a, b = (int(v) for v in t.profile_steps.split(":"))
            assert 0 <= a < b
        except (ValueError, AssertionError):
            raise UserError(f"train.profile_steps {t.profile_steps!r}: expected A:B with "
                            "0 <= A < B") from None
    for index, bounds in enumerate(t.skip_samples):
        if len(bounds) != 2 or not 0 <= bounds[0] < bounds[1]:
            raise UserError(f"train.skip_samples[{index}] = {bounds}: expected [start, end] "
                            "with 0 <= start < end")
    _check_data(d)
    configured_phases(d, t.train_samples)  # data.phases: starts within the run, weights
    check_wandb_settings(cfg.monitor)
    # the schedule: what the LR and the sequence length do over the run
    o, s = cfg.optimizer, cfg.schedule
    if o.min_lr > o.lr:
        raise UserError(f"optimizer.min_lr {o.min_lr:g} is above optimizer.lr {o.lr:g}: the "
                        "decay would raise the learning rate")
    run_tokens = t.train_samples * d.seq_length
    run = (f"train.train_samples {t.train_samples} x data.seq_length {d.seq_length} = "
           f"{run_tokens} tokens")
    if s.unit == "tokens" and s.warmup > run_tokens:
        raise UserError(f"schedule.warmup {s.warmup} tokens (schedule.unit tokens) is longer "
                        f"than the run: {run}")
    if s.unit == "samples" and s.warmup > t.train_samples:
        raise UserError(f"schedule.warmup {s.warmup} samples (schedule.unit samples) is longer "
                        f"than the run: train.train_samples {t.train_samples}")
    if c.seqlen_warmup and c.start_seq_length > d.seq_length:
        raise UserError(f"curriculum.start_seq_length {c.start_seq_length}: must be within "
                        f"[1, data.seq_length = {d.seq_length}]")
    if c.seqlen_warmup and c.warmup_tokens > run_tokens:
        raise UserError(f"curriculum.warmup_tokens {c.warmup_tokens} is longer than the run: "
                        f"{run}")
    sp = cfg.spike
    if sp.min_history > sp.window:
        raise UserError(f"spike.min_history {sp.min_history} exceeds spike.window {sp.window}")
    _check_layout(cfg)
    _check_global_batch(cfg, data_parallel)


def _check_data(d: DataConfig) -> None:

    try:
        parse_split(d.split)
    except SettingError as err:  # dataprep's setting, worded as the trainer's key
        raise err.named(DATAPREP_KEYS) from None
    if d.data_path or d.data_args_path or d.per_split_data_args_path:
        try:  # Megatron's data arguments: one source, no split or weights given twice
            check_choice(d.corpus, None if d.split == DEFAULT_SPLIT else d.split, d.data_path,
                         d.data_args_path, d.per_split_data_args_path, weights=bool(d.weights))
        except SettingError as err:
            raise err.named(DATAPREP_KEYS) from None
    if d.reset_position_ids and not d.reset_attention_mask:
        # Megatron's third document setting: ALiBi has no position ids to reset, and alone it
        # would leave attention crossing documents
        raise UserError("data.reset_position_ids = true: ALiBi has no position ids; the "
                        "within-document distances a reset gives come from "
                        "data.reset_attention_mask = true, set that instead")
    if d.weights:  # the blend's rule, in build-index's words (weight 0 leaves a dataset out)
        try:
            blended_datasets(d.weights)
        except SettingError as err:
            raise err.named(DATAPREP_KEYS) from None


def _check_layout(cfg: Config) -> None:
    """The parallel layout's rules that hold whatever the world size: every tensor-parallel
    rank gets an equal share of heads, MLP columns, vocabulary rows (and, with sequence
    parallelism, tokens); every pipeline stage at least one layer."""
    p, m = cfg.parallel, cfg.model
    tp, pp = p.tensor_parallel, p.pipeline_parallel
    if m.hidden_size % m.num_heads:
        raise UserError(f"model.hidden_size {m.hidden_size} is not divisible by "
                        f"model.num_heads {m.num_heads}")
    if m.num_heads % tp:
        raise UserError(f"model.num_heads {m.num_heads} is not divisible by "
                        f"parallel.tensor_parallel {tp}")
    if m.ffn_size % tp:
        raise UserError(f"model.ffn_hidden_size {m.ffn_size} is not divisible by "
                        f"parallel.tensor_parallel {tp}")
    if m.vocab_size and m.vocab_size % tp:
        raise UserError(f"model.vocab_size {m.vocab_size} is not divisible by "
                        f"parallel.tensor_parallel {tp} (pad it to a multiple of 128 x tp)")
    stages = pp * (p.virtual_stages if p.pipeline_schedule == "interleaved" and pp > 1 else 1)
    if m.num_layers < stages:
        raise UserError(f"model.num_layers {m.num_layers} is fewer than the {stages} pipeline "
                        "stages (parallel.pipeline_parallel x virtual_stages)")
    if p.sequence_parallel and tp == 1:
        raise UserError("parallel.sequence_parallel needs parallel.tensor_parallel > 1")
    # sequence parallelism splits every sequence into tp equal shards (gloo/nccl
    # reduce-scatter of uneven shards fails); the warmup lengths are multiples of the step
    if p.sequence_parallel and cfg.data.seq_length % tp:
        raise UserError(f"data.seq_length {cfg.data.seq_length} is not divisible by "
                        f"parallel.tensor_parallel {tp} (needed by parallel.sequence_parallel)")
    if p.sequence_parallel and cfg.curriculum.seqlen_warmup and (
            cfg.curriculum.seq_length_step % tp):
        raise UserError(f"curriculum.seq_length_step {cfg.curriculum.seq_length_step} is not "
                        f"divisible by parallel.tensor_parallel {tp} (needed by "
                        "parallel.sequence_parallel)")
    if p.zero_engine == "buffers" and (p.zero_stage not in (1, 2)
                                       or cfg.precision.dtype == "fp16"):
        raise UserError(f"parallel.zero_engine = \"buffers\" implements ZeRO-1/2 in bf16 or "
                        f"fp32 (parallel.zero_stage is {p.zero_stage}, precision.dtype "
                        f"{cfg.precision.dtype!r}): use zero_engine = \"fsdp2\" or \"auto\"")
    if p.offload and p.zero_stage != 3:
        raise UserError("parallel.offload needs parallel.zero_stage = 3 (FSDP2 offloads "
                        "sharded parameters and their optimizer state)")


def _check_global_batch(cfg: Config, data_parallel: int) -> None:
    t = cfg.train
    if t.global_batch_size % (t.micro_batch_size * data_parallel):
        raise UserError(f"train.global_batch_size {t.global_batch_size} is not a multiple of "
                        f"train.micro_batch_size {t.micro_batch_size} x data-parallel size "
                        f"{data_parallel}")
    if cfg.parallel.pipeline_parallel > 1:
        _check_pipeline_microbatches(cfg, data_parallel)


def pipeline_microbatches(cfg: Config, data_parallel: int) -> int:
    """The micro-batch count of a pipeline step when the config fixes it (0 when it follows a
    ramped global batch)."""
    if cfg.train.rampup_batch_size and not cfg.parallel.pipeline_microbatches:
        return 0
    samples = cfg.train.global_batch_size // data_parallel
    return cfg.parallel.pipeline_microbatches or samples // cfg.train.micro_batch_size


def check_step_microbatches(count: int, samples: int) -> None:
    """A step's ``samples`` per dp rank split into ``count`` micro-batches: the configured
    count, checked once here, and each step's under a batch-size ramp-up (the pipelined step
    runner). Steps that miss the schedule's own rules run the GPipe order instead
    (``PipelineStages.schedule_kind``)."""
    if samples % count:
        raise UserError(f"parallel.pipeline_microbatches {count}: does not divide the "
                        f"{samples} samples per data-parallel rank of a step "
                        "(train.global_batch_size / dp)")


def _check_pipeline_microbatches(cfg: Config, data_parallel: int) -> None:
    """The configured micro-batch count divides a step's samples and suits the schedule.
    Steps of a batch-size ramp-up that miss the schedule's rules run the GPipe order instead
    (``parallel/pipeline.py``)."""
    count = pipeline_microbatches(cfg, data_parallel)
    if not count:
        return
    check_step_microbatches(count, cfg.train.global_batch_size // data_parallel)
    pp, name = cfg.parallel.pipeline_parallel, cfg.parallel.pipeline_schedule
    if name == "1f1b" and count < pp:
        raise UserError(f"parallel.pipeline_schedule 1f1b needs at least "
                        f"parallel.pipeline_parallel = {pp} micro-batches per step, got "
                        f"{count}: raise train.global_batch_size or "
                        "parallel.pipeline_microbatches")
    if name == "interleaved" and count % max(1, count // pp):
        raise UserError(f"parallel.pipeline_schedule interleaved: {count} micro-batches "
                        f"per step must be a multiple of {max(1, count // pp)} "
                        f"(micro-batches // parallel.pipeline_parallel {pp})")


def parallel_sizes(cfg: Config, world_size: int) -> tuple[int, int, int]:
    """(pp, dp, tp) of a run of ``world_size`` processes, every rule checked: the world size
    against parallel.world_size (when stated) and parallel.*, then :func:`validate` with that
    dp. The launcher calls it before it starts the processes (``trainer pretrain --nproc``),
    each rank before any process group or model exists (``run_spec.settle``)."""
    check_ranges(cfg)  # tp, pp >= 1 before dividing by them
    p = cfg.parallel
    tp, pp = p.tensor_parallel, p.pipeline_parallel
    if p.world_size and p.world_size != world_size:
        # a layout stated for another world: run it there, or say which layout to run here
        dp = p.data_parallel or p.world_size // (tp * pp)
        processes = "1 process" if world_size == 1 else f"{world_size} processes"
        start = ("run 1 process (no --nproc)" if p.world_size == 1 else
                 f"start {p.world_size} (trainer pretrain --nproc ... / torchrun)")
        raise UserError(f"parallel.world_size {p.world_size} (the recipe's layout: pp{pp} x "
                        f"dp{dp} x tp{tp}) but this run has {processes}: {start}, or "
                        f"override parallel.world_size={world_size} with a layout for it")
    if world_size % (tp * pp):
        raise UserError(f"world size {world_size} is not divisible by "
                        f"parallel.tensor_parallel {tp} x parallel.pipeline_parallel {pp}")
    dp = p.data_parallel or world_size // (tp * pp)
    if tp * pp * dp != world_size:
        raise UserError(f"parallel: pp {pp} x dp {dp} x tp {tp} = {pp * dp * tp} processes, "
                        f"but the world size is {world_size}")
    validate(cfg, dp)
    return pp, dp, tp


def resolve_layout(cfg: Config, world_size: int, rank: int = 0) -> Layout:
    """The mesh sizes for ``world_size`` processes and this rank's place in them, every rule
    checked (``parallel_sizes``)."""
    pp, dp, tp = parallel_sizes(cfg, world_size)
    return Layout(pp=pp, dp=dp, tp=tp, rank=rank)

