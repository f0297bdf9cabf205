"""The trainer's config tree. Every field has a default and a docstring (its --help text);
recipes in configs/*.toml override them, ``section.key=value`` arguments override those.

Sample counts are Megatron's units: the run is ``train.train_samples`` long, the LR schedule
and the curriculum count in samples or tokens (``schedule.unit``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from bloomline.common.config import load_config
from bloomline.common.errors import UserError
from bloomline.trainer.model.config import ModelConfig
from bloomline.trainer.model.linear import CPU_FP32_MATMUL_CHOICES

__all__ = ["Config", "DataConfig", "TrainConfig", "PrecisionConfig", "OptimizerConfig",
           "ScheduleConfig", "CurriculumConfig", "CheckpointConfig", "MonitorConfig",
           "SpikeConfig", "WatchdogConfig", "ParallelConfig",
           "load_trainer_config"]


@dataclass
class DataConfig:
    corpus: str = ""
    """Folder of NAME.bin/.idx token files (all used; see dataprep build-index)."""
    tokenizer: str = ""
    """The corpus's tokenizer: a SentencePiece .model, a Hugging Face tokenizer.json (or its
    folder), a tiktoken .tiktoken file or tiktoken:NAME. Sizes the vocabulary (model.vocab_size
    0), is checked against the corpus's fingerprints, decodes for generate, goes with export-hf."""
    eod_token: str = ""
    """The token that ends documents, when the tokenizer does not say (as dataprep tokenize
    --eod-token); empty: the tokenizer's own (eos, or a well-known end-of-text token)."""
    seq_length: int = 2048
    """L of the sample index: samples hold L + 1 tokens. Training uses up to this length."""
    split: str = "969,30,1"
    """train,valid,test shares of each dataset (Megatron's --split)."""
    weights: dict[str, float] = field(default_factory=dict)
    """Blend weight per dataset name; empty: by size, one epoch each (see build-index)."""
    seed: int = 1234
    """Seed of the sample shuffles (Megatron's --seed)."""
    cache_dir: str = ""
    """Index cache; empty: CORPUS/.index."""
    num_workers: int = 2
    """DataLoader worker processes (0: load in the training process)."""
    prefetch_factor: int = 4
    """Batches each worker prepares ahead."""


@dataclass
class TrainConfig:
    micro_batch_size: int = 4
    """Samples per forward/backward on one data-parallel rank."""
    global_batch_size: int = 32
    """Samples per optimizer step over all ranks: micro x data-parallel x accumulation."""
    rampup_batch_size: list[int] = field(default_factory=list)
    """Megatron's batch-size rampup [start, increment, samples]: the global batch grows
    from start by increment, evenly over that many samples. Empty: off."""
    train_samples: int = 100_000
    """Training length in samples (Megatron's --train-samples)."""
    seed: int = 1234
    """Seed of the weight init and dropout."""
    eval_interval: int = 100
    """Evaluate on the valid split every this many steps (0: never)."""
    eval_samples: int = 256
    """Valid samples per evaluation (the same ones every time); with several datasets, the
    blend's and, for each dataset's own valid loss, that many of its own valid split."""
    log_interval: int = 10
    """A console line and a metrics record every this many steps."""
    exit_interval: int = 0
    """Stop (after a checkpoint) once this process has run this many steps; 0: run to the end
    (Megatron's --exit-interval, for job time limits)."""
    max_bad_steps: int = 5
    """Stop after this many consecutive steps with a NaN/inf loss or gradient (each skipped)
    that no rollback could undo (no checkpoint to go back to, or spike.enabled false)."""
    skip_samples: list[list[int]] = field(default_factory=list)
    """Train samples never to train on, as [[start, end], ...] ranges (end excluded) of
    positions in the train split's order (the consumed_samples counter): BLOOM's hand-skipped
    batches. The run's rollbacks add theirs to this list (kept in the checkpoints)."""
    max_wallclock: float = 0.0
    """Seconds this process may run: before they are up (keeping room for a step and a
    checkpoint), save and exit with code 75 for the scheduler to requeue. 0: no limit."""
    run_dir: str = "runs/default"
    """Folder of the run: checkpoints/, metrics.jsonl, tensorboard/, config.toml."""
    compile: bool = False
    """torch.compile the model."""
    device: str = "auto"
    """cpu, cuda, or auto (cuda when available)."""
    profile_steps: str = ""
    """A:B writes a torch.profiler trace of steps A..B-1 into RUN/profile."""
    tune_malloc: bool = True
    """Keep large host tensors in glibc's heap instead of fresh mmaps (see trainer/host.py):
    up to 1.2x faster CPU steps. Off: the allocator's defaults."""
    cpu_fp32_matmul: str = "auto"
    """Kernels of fp32 linear layers on CPU: aten (MKL), onednn, or auto (oneDNN on AMD CPUs,
    where it is ~10% faster, else ATen; see trainer/model/linear.py)."""


@dataclass
class PrecisionConfig:
    dtype: str = "bf16"
    """bf16 (bf16 compute, fp32 master weights and gradient accumulation), fp16 (with dynamic
    loss scaling), fp32, or auto (bf16 where the device computes it natively, else fp32; the
    run's config.toml records the choice)."""
    initial_loss_scale: float = 65536.0
    """fp16: starting loss scale."""
    loss_scale_window: int = 1000
    """fp16: steps without overflow before the scale doubles."""


@dataclass
class OptimizerConfig:
    name: str = "adamw"
    """adamw or lamb."""
    lr: float = 3e-4
    """Peak learning rate."""
    min_lr: float = 3e-5
    """Learning rate at the end of the decay."""
    beta1: float = 0.9
    """Adam beta1."""
    beta2: float = 0.95
    """Adam beta2."""
    eps: float = 1e-8
    """Adam epsilon."""
    weight_decay: float = 0.1
    """Decoupled weight decay; never applied to biases and LayerNorm parameters."""
    clip_grad: float = 1.0
    """Clip the global gradient norm to this (0: off)."""


@dataclass
class ScheduleConfig:
    unit: str = "samples"
    """What warmup and decay count: samples or tokens."""
    warmup: int = 1000
    """Linear warmup length (in unit)."""
    decay: int = 0
    """Decay length after warmup (in unit); 0: to the end of training."""
    style: str = "cosine"
    """cosine, linear or constant."""


@dataclass
class CurriculumConfig:
    seqlen_warmup: bool = False
    """DeepSpeed's sequence-length warmup: train on truncated samples first."""
    start_seq_length: int = 64
    """Sequence length at the start of the warmup."""
    seq_length_step: int = 8
    """The length is rounded down to a multiple of this."""
    warmup_tokens: int = 0
    """Tokens over which the length grows linearly to data.seq_length."""


@dataclass
class CheckpointConfig:
    interval: int = 1000
    """Save every this many steps (and at the end); 0: only at the end."""
    keep_last: int = 3
    """Complete checkpoints kept; older ones are deleted."""
    resume: str = "auto"
    """auto (newest checkpoint of the run whose manifest verifies, if any), none, or a
    checkpoint folder."""
    async_: bool = False
    """Write checkpoints in the background (DCP async save): training goes on after the state
    is copied to host memory; the checkpoint counts once its manifest is written."""


@dataclass
class SpikeConfig:
    enabled: bool = True
    """Detect loss spikes and non-finite losses; roll back to the newest good checkpoint
    before the spike and skip the batches around it."""
    window: int = 100
    """Steps in the running baseline (median and MAD of the loss and gradient norm)."""
    min_history: int = 20
    """Steps needed in the baseline before a finite value can count as a spike."""
    zscore: float = 6.0
    """A spike lies this many robust deviations (1.4826 x MAD) above the median..."""
    loss_rise: float = 0.2
    """...and, for the loss, at least this fraction above the median (both must hold)."""
    grad_norm_factor: float = 10.0
    """...and, for the gradient norm, at least this many times the median (0: ignore the
    gradient norm; clipping absorbs most of its spikes)."""
    skip_before: int = 100
    """Batches before the spike step to skip after the rollback (not before the checkpoint
    rolled back to: those are in its weights already)."""
    skip_after: int = 100
    """Batches after the spike step to skip as well (PaLM skipped 200-500 around a spike)."""
    max_rollbacks: int = 5
    """Stop, with the reason, instead of rolling back more than this many times in a run."""


@dataclass
class WatchdogConfig:
    enabled: bool = True
    """Dump every thread's Python stack to RUN/watchdog/rank_R.txt and exit 1 when a step,
    an evaluation or a checkpoint hangs (a stuck collective, a dead file system)."""
    factor: float = 20.0
    """A step hangs when it takes more than this many times the median step time..."""
    floor_seconds: float = 600.0
    """...and more than this many seconds."""
    startup_seconds: float = 1800.0
    """Limit for the first steps (compilation, warm-up), evaluations and checkpoints."""


@dataclass
class MonitorConfig:
    tensorboard: bool = True
    """Write TensorBoard event files into RUN/tensorboard."""
    thermometer_interval: int = 100
    """Per-layer max attention logit / activations / grad norms every this many steps
    (0: off)."""
    peak_flops: float = 0.0
    """Matmul peak of one device in FLOP/s, what MFU divides by. 0: a known GPU's dense bf16
    peak, else measured at start-up (best of several tries, before the loader workers start)
    and cached per machine and dtype in RUN/peak_flops.json, measured again if a step beats
    it; a number: use it as given. RUN/config.toml records the value used."""


@dataclass
class ParallelConfig:
    tensor_parallel: int = 1
    """tp: Megatron tensor parallelism (heads and MLP columns split over this many ranks)."""
    pipeline_parallel: int = 1
    """pp: pipeline stages."""
    data_parallel: int = 0
    """dp: data-parallel replicas; 0: world size / (tp x pp)."""
    zero_stage: int = 0
    """0: DDP; 1: optimizer state sharded over dp; 2: gradients too; 3: parameters too."""
    offload: bool = False
    """ZeRO-3 with parameters and optimizer state in CPU memory (FSDP2's CPUOffloadPolicy)."""
    sequence_parallel: bool = False
    """Megatron sequence parallelism: LayerNorm/dropout regions sharded over tp by sequence."""
    pipeline_schedule: str = "1f1b"
    """gpipe, 1f1b (PipeDream-flush) or interleaved (interleaved 1F1B)."""
    pipeline_microbatches: int = 0
    """Micro-batches per pipeline step; 0: global batch / (dp x micro_batch_size)."""
    virtual_stages: int = 2
    """Stages per rank of the interleaved schedule."""
    partition: str = "uniform"
    """How layers are split into stages: uniform, parameters, or profile (measured
    forward+backward time per layer, split by dynamic programming)."""
    activation_checkpoint: str = "none"
    """none, full (recompute every block in backward) or selective (recompute attention)."""
    backend: str = "auto"
    """torch.distributed backend: auto (nccl on CUDA, gloo on CPU), gloo or nccl."""


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    precision: PrecisionConfig = field(default_factory=PrecisionConfig)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    curriculum: CurriculumConfig = field(default_factory=CurriculumConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    monitor: MonitorConfig = field(default_factory=MonitorConfig)
    spike: SpikeConfig = field(default_factory=SpikeConfig)
    watchdog: WatchdogConfig = field(default_factory=WatchdogConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)


_CHOICES = {
    "model.attention": ("auto", "sdpa", "flex", "eager"),
    "precision.dtype": ("bf16", "fp16", "fp32", "auto"),
    "train.cpu_fp32_matmul": CPU_FP32_MATMUL_CHOICES,
    "optimizer.name": ("adamw", "lamb"),
    "schedule.unit": ("samples", "tokens"),
    "schedule.style": ("cosine", "linear", "constant"),
    "parallel.pipeline_schedule": ("gpipe", "1f1b", "interleaved"),
    "parallel.partition": ("uniform", "parameters", "profile"),
    "parallel.activation_checkpoint": ("none", "full", "selective"),
    "parallel.backend": ("auto", "gloo", "nccl"),
}


def validate(cfg: Config, data_parallel: int = 1) -> None:
    """Cross-field checks, each a UserError naming the field."""
    for key, choices in _CHOICES.items():
        section, name = key.split(".")
        value = getattr(getattr(cfg, section), name)
        if value not in choices:
            raise UserError(f"{key} = {value!r}: expected one of {', '.join(choices)}")
    m, t = cfg.model, cfg.train
    for key, value in (("model.hidden_size", m.hidden_size), ("model.num_layers", m.num_layers),
                       ("model.num_heads", m.num_heads), ("data.seq_length", cfg.data.seq_length),
                       ("train.micro_batch_size", t.micro_batch_size),
                       ("train.global_batch_size", t.global_batch_size),
                       ("train.train_samples", t.train_samples)):
        if value < 1:
            raise UserError(f"{key} = {value}: must be at least 1")
    if m.hidden_size % m.num_heads:
        raise UserError(f"model.hidden_size {m.hidden_size} is not divisible by "
                        f"model.num_heads {m.num_heads}")
    step = t.micro_batch_size * data_parallel
    if t.global_batch_size % step:
        raise UserError(f"train.global_batch_size {t.global_batch_size} is not a multiple of "
                        f"train.micro_batch_size x data-parallel size = {step}")
    if t.rampup_batch_size:
        if len(t.rampup_batch_size) != 3:
            raise UserError("train.rampup_batch_size: expected [start, increment, samples]")
        start, increment, samples = t.rampup_batch_size
        if start < 1 or increment < 1 or samples < 0 or start > t.global_batch_size or (
                (t.global_batch_size - start) % increment):
            raise UserError(f"train.rampup_batch_size {t.rampup_batch_size}: need 1 <= start "
                            "<= global_batch_size, increment >= 1 dividing "
                            "global_batch_size - start")
    c = cfg.curriculum
    if c.seqlen_warmup and not 1 <= c.start_seq_length <= cfg.data.seq_length:
        raise UserError(f"curriculum.start_seq_length {c.start_seq_length}: must be within "
                        f"[1, data.seq_length = {cfg.data.seq_length}]")
    if c.seq_length_step < 1:
        raise UserError(f"curriculum.seq_length_step {c.seq_length_step}: must be >= 1")
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
    sp = cfg.spike
    for key, value in (("spike.window", sp.window), ("spike.min_history", sp.min_history)):
        if value < 1:
            raise UserError(f"{key} = {value}: must be at least 1")
    if sp.min_history > sp.window:
        raise UserError(f"spike.min_history {sp.min_history} exceeds spike.window {sp.window}")
    for key, value in (("spike.skip_before", sp.skip_before),
                       ("spike.skip_after", sp.skip_after),
                       ("spike.max_rollbacks", sp.max_rollbacks),
                       ("train.max_wallclock", t.max_wallclock),
                       ("monitor.peak_flops", cfg.monitor.peak_flops)):
        if value < 0:
            raise UserError(f"{key} = {value}: must not be negative")
    if not 0.0 <= m.hidden_dropout < 1.0 or not 0.0 <= m.attention_dropout < 1.0:
        raise UserError("model.hidden_dropout / model.attention_dropout: must be in [0, 1)")


def load_trainer_config(path: str | Path | None, overrides: list[str] | None = None) -> Config:
    cfg = load_config(Config, path, overrides)
    validate(cfg)
    return cfg
