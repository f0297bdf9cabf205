"""The trainer's config tree (the schema). Every field has a default, a declared range and a
docstring (its --help text); recipes in configs/*.toml override them, ``section.key=value``
arguments override those. The rules between fields are ``config_rules.py``'s, applied once
when a run is settled (``run_spec.py``). This module imports no torch: reading and checking a
config needs none.

Sample counts are Megatron's units: the run is ``train.train_samples`` long, the LR schedule
and the curriculum count in samples or tokens (``schedule.unit``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from bloomline.common.config_loader import load_config, path_field, ranged, resolve_paths
from bloomline.dataprep.data_args import absolute_data_path
from bloomline.dataprep.gpt_index import DEFAULT_SPLIT
from bloomline.trainer.kernels.cpu import CPU_FP32_MATMUL_CHOICES
from bloomline.trainer.model.config import ModelConfig

__all__ = ["Config", "DataConfig", "TrainConfig", "PrecisionConfig", "OptimizerConfig",
           "ScheduleConfig", "CurriculumConfig", "CheckpointConfig", "MonitorConfig",
           "SpikeConfig", "WatchdogConfig", "ParallelConfig",
           "load_trainer_config"]


@dataclass
class DataConfig:
    corpus: str = path_field()
    """Folder of NAME.bin/.idx token files (all used; see dataprep build-index); or leave it
    empty and give data.data_path, data.data_args_path or data.per_split_data_args_path."""
    data_path: list[str] | str = field(default_factory=list)
    """Megatron's --data-path: ["PREFIX", ...] or ["W1", "PREFIX1", "W2", "PREFIX2", ...] (or
    one string of those words): PREFIX.bin/.idx anywhere, each dataset named by its file
    stem; cut into splits by data.split. Instead of data.corpus."""
    data_args_path: str = path_field()
    """Megatron's --data-args-path: a file holding data.data_path's words."""
    per_split_data_args_path: str = path_field()
    """Megatron's --per-split-data-args-path: JSON {"train": [...], "valid": [...], "test":
    [...]}, a blend per split (data.data_path's forms), each dataset used whole; data.split
    stays at its default."""
    tokenizer: str = path_field(if_exists=True)
    """The corpus's tokenizer: a SentencePiece .model, a Hugging Face tokenizer.json (or its
    folder), a tiktoken .tiktoken file or tiktoken:NAME. Sizes the vocabulary (model.vocab_size
    0), is checked against the corpus's fingerprints, decodes for generate, goes with export-hf."""
    eod_token: str = ""
    """The token that ends documents, when the tokenizer does not say (as dataprep tokenize
    --eod-token); empty: the tokenizer's own (eos, or a well-known end-of-text token)."""
    reset_attention_mask: bool = False
    """Attention stays within each document of a packed sample: after an end-of-document
    token, later positions do not attend to it or before it (Megatron's
    --reset-attention-mask). Needs the EOD id: data.tokenizer's, or the corpus's token files
    record it. See "Document masking" in the trainer README."""
    eod_mask_loss: bool = False
    """No loss where the input token is the end-of-document token (the prediction across a
    document boundary; Megatron's --eod-mask-loss)."""
    reset_position_ids: bool = False
    """Megatron's --reset-position-ids, accepted for its users: with ALiBi there are no
    position ids, and the within-document distances a reset gives are what
    data.reset_attention_mask gives, so true is allowed only together with it (alone it
    would do nothing)."""
    seq_length: int = ranged(2048, ge=1, le=2**20)
    """L of the sample index: samples hold L + 1 tokens. Training uses up to this length."""
    split: str = DEFAULT_SPLIT
    """train,valid,test shares of each dataset (Megatron's --split)."""
    weights: dict[str, float] = ranged(default_factory=dict, ge=0)
    """Blend weight per dataset name (not all 0); empty: by size, one epoch each (see
    build-index)."""
    phases: dict[str, dict[str, float]] = ranged(default_factory=dict, ge=0)
    """Blend phases after the first (data.weights): train sample -> weights from there on,
    e.g. [data.phases] 5000 = {code = 0.1, web = 0.9} (build-index --phase 5000:code=0.1,...).
    One run, one index; a resume with other weights adds a phase where it resumes."""
    seed: int = ranged(1234, ge=0, le=2**32 - 1)
    """Seed of the sample shuffles (Megatron's --seed; numpy's RandomState takes 32 bits)."""
    cache_dir: str = path_field()
    """Index cache (Megatron's --data-cache-path); empty: CORPUS/.index, or .index beside the
    first prefix of data.data_path (or the data args files')."""
    num_workers: int = ranged(2, ge=0)
    """DataLoader worker processes (0: load in the training process)."""
    prefetch_factor: int = ranged(4, ge=1)
    """Batches each worker prepares ahead (unused with num_workers 0)."""


@dataclass
class TrainConfig:
    micro_batch_size: int = ranged(4, ge=1)
    """Samples per forward/backward on one data-parallel rank."""
    global_batch_size: int = ranged(32, ge=1)
    """Samples per optimizer step over all ranks: micro x data-parallel x accumulation."""
    rampup_batch_size: list[int] = ranged(default_factory=list, ge=0)
    """Megatron's batch-size rampup [start, increment, samples]: the global batch grows
    from start by increment, evenly over that many samples. Empty: off."""
    train_samples: int = ranged(100_000, ge=1, le=2**40)
    """Training length in samples (Megatron's --train-samples). At most 2**40, so that the
    token counts (samples x data.seq_length) stay within 64 bits."""
    seed: int = ranged(1234, ge=0, le=2**32 - 1)
    """Seed of the weight init and dropout."""
    eval_interval: int = ranged(100, ge=0)
    """Evaluate on the valid split every this many steps (0: never)."""
    eval_samples: int = ranged(256, ge=1)
    """Valid samples per evaluation (the same ones every time); with several datasets, the
    blend's and, for each dataset's own valid loss, that many of its own valid split."""
    log_interval: int = ranged(10, ge=1)
    """A console line and a metrics record every this many steps (and at each process's first
    step and the last step); their ``loss`` is the mean over the steps since the previous one
    (Megatron's), skipped steps left out; ``loss_last`` is the step's own."""
    exit_interval: int = ranged(0, ge=0)
    """Stop (after a checkpoint) once this process has run this many steps; 0: run to the end
    (Megatron's --exit-interval, for job time limits)."""
    max_bad_steps: int = ranged(5, ge=0)
    """Stop after this many consecutive steps with a NaN/inf loss or gradient (each skipped)
    that no rollback could undo (no checkpoint to go back to, or spike.enabled false)."""
    skip_samples: list[list[int]] = ranged(default_factory=list, ge=0)
    """Train samples never to train on, as [[start, end], ...] ranges (end excluded) of
    positions in the train split's order (the consumed_samples counter): BLOOM's hand-skipped
    batches. The run's rollbacks add theirs to this list (kept in the checkpoints)."""
    max_wallclock: float = ranged(0.0, ge=0)
    """Seconds this process may run: before they are up (keeping room for a step and a
    checkpoint), save and exit with code 75 for the scheduler to requeue. 0: no limit."""
    run_dir: str = path_field("runs/default")
    """Folder of the run: checkpoints/, metrics.jsonl, tensorboard/, config.toml."""
    compile: bool = False
    """torch.compile the model."""
    device: str = "auto"
    """cpu, cuda (this process's GPU), cuda:N, or auto (cuda when available)."""
    profile_steps: str = ""
    """A:B writes a torch.profiler trace of steps A..B-1 into RUN/profile."""
    tune_malloc: bool = True
    """Keep large host tensors in glibc's heap instead of fresh mmaps (see trainer/malloc.py):
    faster CPU steps. Off: the allocator's defaults."""
    cpu_fp32_matmul: str = ranged("auto", choices=CPU_FP32_MATMUL_CHOICES)
    """Kernels of fp32 linear layers on CPU: aten (MKL), onednn, or auto (oneDNN on AMD CPUs,
    where it is faster, else ATen; see trainer/kernels/cpu/linear.py)."""


@dataclass
class PrecisionConfig:
    dtype: str = ranged("bf16", choices=("bf16", "fp16", "fp32", "auto"))
    """bf16 (bf16 compute, fp32 master weights and gradient accumulation), fp16 (with dynamic
    loss scaling), fp32, or auto (bf16 where the device computes it natively, else fp32; the
    run's config.toml records the choice)."""
    initial_loss_scale: float = ranged(65536.0, gt=0, le=2.0**64)
    """fp16: starting loss scale."""
    loss_scale_window: int = ranged(1000, ge=1)
    """fp16: steps without overflow before the scale doubles."""


@dataclass
class OptimizerConfig:
    name: str = ranged("adamw", choices=("adamw", "lamb"))
    """adamw or lamb."""
    lr: float = ranged(3e-4, gt=0)
    """Peak learning rate."""
    min_lr: float = ranged(3e-5, ge=0)
    """Learning rate at the end of the decay; at most optimizer.lr."""
    beta1: float = ranged(0.9, ge=0, lt=1)
    """Adam beta1."""
    beta2: float = ranged(0.95, ge=0, lt=1)
    """Adam beta2."""
    eps: float = ranged(1e-8, gt=0)
    """Adam epsilon."""
    weight_decay: float = ranged(0.1, ge=0)
    """Decoupled weight decay; never applied to biases and LayerNorm parameters."""
    clip_grad: float = ranged(1.0, ge=0)
    """Clip the global gradient norm to this (0: off)."""


@dataclass
class ScheduleConfig:
    unit: str = ranged("samples", choices=("samples", "tokens"))
    """What warmup and decay count: samples or tokens (train.train_samples x data.seq_length
    in a run)."""
    warmup: int = ranged(1000, ge=0)
    """Linear warmup length (in unit); not longer than the run."""
    decay: int = ranged(0, ge=0)
    """Decay length after warmup (in unit); 0: to the end of training. It may run past the
    end (BLOOM decayed over more samples than it trained on): the LR then stops above
    optimizer.min_lr."""
    style: str = ranged("cosine", choices=("cosine", "linear", "constant"))
    """cosine, linear or constant."""


@dataclass
class CurriculumConfig:
    seqlen_warmup: bool = False
    """DeepSpeed's sequence-length warmup: train on truncated samples first."""
    start_seq_length: int = ranged(64, ge=1)
    """Sequence length at the start of the warmup; at most data.seq_length."""
    seq_length_step: int = ranged(8, ge=1)
    """The length is rounded down to a multiple of this."""
    warmup_tokens: int = ranged(0, ge=0)
    """Tokens over which the length grows linearly to data.seq_length."""


@dataclass
class CheckpointConfig:
    interval: int = ranged(1000, ge=0)
    """Save every this many steps (and at the end); 0: only at the end."""
    keep_last: int = ranged(3, ge=0)
    """Complete checkpoints kept; older ones are deleted. 0: keep all."""
    resume: str = path_field("auto", names=("auto", "none"))
    """auto (newest checkpoint of the run whose manifest verifies, if any), none, or a
    checkpoint folder."""
    init_from: str = path_field()
    """Start a new run from a model: a transformers BLOOM folder or a bloomline checkpoint
    (any layout). Weights only: its model settings replace the recipe's [model], the optimizer
    starts fresh at step 0 and the samples from the start. Ignored once the run folder holds a
    checkpoint (the run then resumes from it)."""
    async_: bool = False
    """Write checkpoints in the background (DCP async save): training goes on after the state
    is copied to host memory; the checkpoint counts once its manifest is written."""
    snapshot_interval: int = ranged(10, ge=0)
    """Every this many steps, copy each rank's training state into host memory on its own node
    and on a peer node (in the background after a copy to a staging buffer); a job that
    torchrun restarts after a failure (--max-restarts) goes on from the newest snapshot every
    rank still has, without reading the checkpoints. Taken only where a restart can use it
    (--max-restarts > 0). 0: off."""
    snapshot_wait: str = ranged("auto", choices=("auto", "step", "round"))
    """When a snapshot's background round is waited for: step (after the next step: a failure
    loses at most snapshot_interval steps, and the step waits for what of the round outlasts
    it), round (before the next round: no stall while a round takes less than the interval,
    up to 2 x snapshot_interval - 1 steps lost), auto (step while a round takes less than a
    step, else round, said in a line)."""
    snapshot_dir: str = path_field("/dev/shm")
    """Where a node keeps snapshots: a tmpfs (host memory that outlives the processes)."""
    snapshot_ranks_per_node: int = ranged(0, ge=0)
    """Ranks per node for placing snapshot copies; 0: torchrun's (LOCAL_WORLD_SIZE). Lower
    it only to make one machine's processes act as several nodes (tests)."""


@dataclass
class SpikeConfig:
    enabled: bool = True
    """Detect loss spikes and non-finite losses; roll back to the newest good checkpoint
    before the spike and skip the batches around it."""
    window: int = ranged(100, ge=1)
    """Steps in the running baseline (median and MAD of the loss and gradient norm)."""
    min_history: int = ranged(20, ge=1)
    """Steps needed in the baseline before a finite value can count as a spike; at most
    spike.window."""
    zscore: float = ranged(6.0, ge=0)
    """A spike lies this many robust deviations (1.4826 x MAD) above the median..."""
    loss_rise: float = ranged(0.2, ge=0)
    """...and, for the loss, at least this fraction above the median (both must hold)."""
    grad_norm_factor: float = ranged(10.0, ge=0)
    """...and, for the gradient norm, at least this many times the median (0: ignore the
    gradient norm; clipping absorbs most of its spikes)."""
    skip_before: int = ranged(100, ge=0)
    """Batches before the spike step to skip after the rollback (not before the checkpoint
    rolled back to: those are in its weights already)."""
    skip_after: int = ranged(100, ge=0)
    """Batches after the spike step to skip as well (PaLM skipped 200-500 around a spike)."""
    max_rollbacks: int = ranged(5, ge=0)
    """Stop, with the reason, instead of rolling back more than this many times in a run."""
    recompute: bool = True
    """Before rolling back from a spike or a non-finite loss, compute the step again on the
    same samples (before the optimizer steps): the same result blames the data (the rollback
    follows); another names the ranks whose own results differ as suspect hardware (console,
    metrics.jsonl, RUN/suspect_hosts.txt) and goes on with the recomputed step. Costs one
    step per suspect step, and at dp > 1 on the buffers engine a read of each gradient bucket
    before its reduction."""


@dataclass
class WatchdogConfig:
    enabled: bool = True
    """Dump every thread's Python stack to RUN/watchdog/rank_R.txt and exit 1 when a step,
    an evaluation or a checkpoint hangs (a stuck collective, a dead file system)."""
    factor: float = ranged(20.0, gt=0, le=1000)
    """A step hangs when it takes more than this many times the median step time..."""
    floor_seconds: float = ranged(600.0, gt=0, le=1e8)
    """...and more than this many seconds."""
    startup_seconds: float = ranged(1800.0, gt=0, le=1e8)
    """Limit for the first steps (compilation, warm-up), evaluations and checkpoints. The
    limits are timers: to have none, set watchdog.enabled false."""
    silent_seconds: float = ranged(60.0, ge=0, le=1e8)
    """Name a rank that has not answered for this many seconds (its heartbeat, published
    every silent_seconds/10 s, at most 1 s, into torchrun's store, stopped: a stopped, dead or
    frozen process), or that has stayed this long in one part of a step while other ranks are
    past it (they wait for it): rank 0 says which rank, its host and pid, on the console and
    in metrics.jsonl, long before the collective times out (NCCL: 10 min, gloo: 30 min) or
    floor_seconds ends the step. Nothing stops: the run goes on if the rank answers again.
    Keep it above the longest part of a step. 0: no heartbeat (independent of enabled)."""


@dataclass
class MonitorConfig:
    tensorboard: bool = True
    """Write TensorBoard event files into RUN/tensorboard."""
    activation_stats_interval: int = ranged(100, ge=0)
    """Activation stats (per-layer max attention logit / activations / grad norms) every this
    many steps (0: off)."""
    peak_flops: float = ranged(0.0, ge=0)
    """Matmul peak of one device in FLOP/s, what MFU divides by. 0: a known GPU's dense bf16
    peak, else measured at start-up (best of several tries, before the loader workers start)
    and cached per machine and dtype in RUN/peak_flops.json, measured again if a step beats
    it; a number: use it as given. RUN/config.toml records the value used."""
    fingerprint_interval: int = ranged(100, ge=0)
    """Every this many steps the data-parallel replicas compare a digest of the parameters
    they must hold bitwise alike; a mismatch names the differing ranks (console,
    metrics.jsonl; those outside a majority in RUN/suspect_hosts.txt). 0: off; nothing to
    compare without dp, or under ZeRO-2/3 on FSDP2 (every replica holds another shard)."""
    wandb: bool = False
    """Also log to Weights & Biases (the wandb extra: pip install 'bloomline-trainer[wandb]'):
    the scalars TensorBoard gets, under the same names and steps, and the run's config; rank 0
    only. One W&B run per run folder: its id is kept in RUN/wandb_run_id.txt and a resume
    continues it."""
    wandb_project: str = "bloomline"
    """W&B project of the run (no / \\ # ? % :)."""
    wandb_entity: str = ""
    """W&B team or user that owns the project; empty: the default entity of the API key."""
    wandb_run_name: str = ""
    """Display name of the W&B run; empty: the run folder's name."""
    wandb_mode: str = ranged("auto", choices=("auto", "online", "offline"))
    """online (upload as it runs), offline (files in RUN/wandb, uploaded later with wandb
    sync), or auto (the WANDB_MODE environment variable, else online)."""
    straggler_factor: float = ranged(1.5, ge=0, le=1000)
    """At each log step, name a rank (with its host and pid, on the console and as a straggler
    record in metrics.jsonl) that fell behind the other ranks in a part of the step (data
    wait, forward, backward, the reductions, the optimizer) and spent more than this many
    times the ranks' median time there, over the log interval. 0: name nobody (the train
    record still has each part's median and maximum time)."""
    straggler_min_seconds: float = ranged(0.05, ge=0, le=1e6)
    """...and fell behind by at least this many seconds per step (noise on short steps, a
    rank 0 that logs, is not named)."""


@dataclass
class ParallelConfig:
    tensor_parallel: int = ranged(1, ge=1)
    """tp: Megatron tensor parallelism (heads and MLP columns split over this many ranks)."""
    pipeline_parallel: int = ranged(1, ge=1)
    """pp: pipeline stages."""
    data_parallel: int = ranged(0, ge=0)
    """dp: data-parallel replicas; 0: world size / (tp x pp)."""
    world_size: int = ranged(0, ge=0)
    """The processes this layout is for, tp x pp x dp; 0: any world, dp = world / (tp x pp).
    A recipe for a cluster states it, and `trainer pretrain` refuses another world."""
    zero_stage: int = ranged(0, choices=(0, 1, 2, 3))
    """0: DDP; 1: optimizer state sharded over dp; 2: gradients too; 3: parameters too."""
    zero_engine: str = ranged("auto", choices=("auto", "buffers", "fsdp2"))
    """What implements ZeRO-1/2: buffers (Megatron's distributed optimizer: parameters in the
    compute dtype used directly by the model, gradients accumulated in contiguous fp32
    buffers, reduce-scattered once per step in buckets, the fp32 master and Adam's moments
    sharded over dp, the updated parameters all-gathered) or fsdp2 (FSDP2's replicate /
    fully_shard with fp32 parameters). auto: buffers for bf16 and fp32 runs at ZeRO-1/2 with
    dp > 1, fsdp2 otherwise (ZeRO-0/3, fp16's loss scaling, offload). At dp 1 neither
    applies: nothing is sharded."""
    bucket_size: int = ranged(40_000_000, ge=1)
    """Elements per gradient bucket of the buffers engine (Megatron's --ddp-bucket-size):
    each bucket is reduced by one reduce-scatter and gathered by one all-gather."""
    offload: bool = False
    """ZeRO-3 with parameters and optimizer state in CPU memory (FSDP2's CPUOffloadPolicy)."""
    sequence_parallel: bool = False
    """Megatron sequence parallelism: LayerNorm/dropout regions sharded over tp by sequence."""
    pipeline_schedule: str = ranged("1f1b", choices=("gpipe", "1f1b", "interleaved"))
    """gpipe, 1f1b (PipeDream-flush) or interleaved (interleaved 1F1B)."""
    pipeline_microbatches: int = ranged(0, ge=0)
    """Micro-batches per pipeline step; 0: global batch / (dp x micro_batch_size)."""
    virtual_stages: int = ranged(2, ge=1)
    """Stages per rank of the interleaved schedule."""
    partition: str = ranged("uniform", choices=("uniform", "parameters", "profile"))
    """How layers are split into stages: uniform, parameters, or profile (measured
    forward+backward time per layer, split by dynamic programming)."""
    activation_checkpoint: str = ranged("none", choices=("none", "full", "selective"))
    """none, full (recompute every block in backward) or selective (recompute attention)."""
    backend: str = ranged("auto", choices=("auto", "gloo", "nccl"))
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

    # Keys renamed since a release: recipes and checkpoints that use the old name still load
    # (common.config_loader moves the value and says so). Not a field: no annotation.
    RENAMED_KEYS = {"monitor.thermometer_interval": "monitor.activation_stats_interval"}

    # Other toolkits' names (Megatron-LM, transformers, nanoGPT) of our fields: an unknown key
    # ending in one gets these suggested ("did you mean optimizer.lr?"), never applied.
    KEY_SYNONYMS = {
        "learning_rate": ("lr",), "lr_min": ("min_lr",), "min_learning_rate": ("min_lr",),
        "batch_size": ("global_batch_size", "micro_batch_size"),
        "seq_len": ("seq_length",), "max_seq_len": ("seq_length",),
        "max_seq_length": ("seq_length",), "sequence_length": ("seq_length",),
        "context_length": ("seq_length",), "block_size": ("seq_length",),
        "n_layer": ("num_layers",), "num_hidden_layers": ("num_layers",),
        "n_head": ("num_heads",), "num_attention_heads": ("num_heads",),
        "n_embd": ("hidden_size",), "d_model": ("hidden_size",),
        "intermediate_size": ("ffn_hidden_size",), "ffn_dim": ("ffn_hidden_size",),
        "dropout": ("hidden_dropout", "attention_dropout"),
        "warmup_steps": ("warmup",), "warmup_samples": ("warmup",),
        "lr_warmup_samples": ("warmup",), "lr_decay_samples": ("decay",),
        "lr_decay_style": ("style",), "train_iters": ("train_samples",),
        "max_steps": ("train_samples",), "eval_iters": ("eval_samples",),
        "save_interval": ("interval",), "save": ("run_dir",), "output_dir": ("run_dir",),
        "load": ("resume",), "grad_clip": ("clip_grad",), "max_grad_norm": ("clip_grad",),
        "adam_beta1": ("beta1",), "adam_beta2": ("beta2",), "adam_eps": ("eps",),
        "adam_epsilon": ("eps",), "tokenizer_model": ("tokenizer",), "data_cache_path":
        ("cache_dir",),
        "tensor_model_parallel_size": ("tensor_parallel",),
        "pipeline_model_parallel_size": ("pipeline_parallel",),
        # Megatron's flags as typed on its command line
        "reset-attention-mask": ("reset_attention_mask",), "eod-mask-loss": ("eod_mask_loss",),
        "reset-position-ids": ("reset_position_ids",),
    }


def load_trainer_config(path: str | Path | None, overrides: list[str] | None = None) -> Config:
    """The config of ``path`` with ``overrides``, every field within its range and its paths
    absolute (``resolve_paths``: relative to the working directory, as the user meant them).
    What the run settles from: ``run_spec.settle`` decides the model, the vocabulary, the
    precision and the layout and checks the rules between fields."""
    cfg = load_config(Config, path, overrides or [])
    # relative to where the command runs: the saved config then works from anywhere
    resolve_paths(cfg)
    if cfg.data.data_path:  # its prefixes too (its weights kept)
        cfg.data.data_path = absolute_data_path(cfg.data.data_path, Path.cwd())
    return cfg
