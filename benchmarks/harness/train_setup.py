"""The model, batch and ``Trainer`` setup the training-step benchmarks share
(``benchmarks.train``, ``benchmarks.step_parts``).

Contract: one model shape (6 layers, hidden 384, 6 heads, vocabulary 8064 = 8000 padded to a
multiple of 128, no dropout, tied embeddings), micro-batch ``MBS`` of ``SEQ`` tokens, the
optimizer hyperparameters both contestants use, and the step functions: ``ours_step`` (what the
training loop runs per step) and ``hf_step`` (transformers' BloomForCausalLM with a stock AdamW).
Why shared: the step-parts breakdown must time exactly the step the throughput benchmark
reports.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable

import torch

from bloomline.trainer.config import Config
from bloomline.trainer.loop import Trainer

__all__ = ["BETAS", "CLIP", "COMPILED", "DATA_VOCAB", "DIAG_SDPA", "DTYPES", "EPS", "HEADS", "HF",
           "HIDDEN", "LAYERS", "LR", "MBS", "SEED", "SEQ", "TRAIN_SAMPLES", "TUNE_MALLOC", "VOCAB",
           "WEIGHT_DECAY", "decay_groups", "dp_engine_setup", "hf_step", "ours_step",
           "random_tokens", "trainer_config"]

LAYERS, HIDDEN, HEADS, SEQ, VOCAB, MBS = 6, 384, 6, 256, 8064, 8
LR, BETAS, EPS, WEIGHT_DECAY, CLIP = 3e-4, (0.9, 0.95), 1e-8, 0.1, 1.0
DATA_VOCAB = 8000  # the ids drawn: the tokenizer's vocabulary before padding
SEED = 1234
TRAIN_SAMPLES = 20_000  # the demo's train split (make demo builds this many)
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
HF = "transformers"
COMPILED = "ours, torch.compile"
DIAG_SDPA = "ours, attention=sdpa"
TUNE_MALLOC = [True]  # --default-malloc clears it before any contestant is built


def random_tokens(generator: torch.Generator | None = None) -> torch.Tensor:
    """One micro-batch of random ids < ``DATA_VOCAB``, [MBS, SEQ + 1] int64 (inputs and the
    shifted labels); drawn from ``generator``, else from torch's global one."""
    return torch.randint(0, DATA_VOCAB, (MBS, SEQ + 1), generator=generator)


def trainer_config(precision: str, compile_model: bool = False) -> Config:
    """The benchmark model's ``Config`` on CPU in ``precision``; no data is opened and the run
    folder is never written (only ``train_step`` runs)."""
    cfg = Config()
    model = cfg.model
    model.vocab_size, model.hidden_size = VOCAB, HIDDEN
    model.num_layers, model.num_heads = LAYERS, HEADS
    model.hidden_dropout = model.attention_dropout = 0.0
    cfg.data.tokenizer, cfg.data.seq_length = "", SEQ
    cfg.train.micro_batch_size = cfg.train.global_batch_size = MBS
    cfg.train.device, cfg.train.seed, cfg.train.compile = "cpu", SEED, compile_model
    cfg.train.run_dir = tempfile.gettempdir()  # never written: only train_step runs
    cfg.precision.dtype = precision
    cfg.monitor.tensorboard = False
    opt = cfg.optimizer
    opt.name, opt.lr, (opt.beta1, opt.beta2), opt.eps = "adamw", LR, BETAS, EPS
    opt.weight_decay, opt.clip_grad = WEIGHT_DECAY, CLIP
    return cfg


def dp_engine_setup(dp: int, stage: int, engine: str, precision: str, micro_batches: int,
                    tune_malloc: bool = True):
    """``benchmarks.parallel_engines``' case on this model: ``trainer_config(precision)`` over
    ``dp`` ranks with ``parallel.zero_stage`` ``stage`` on ``parallel.zero_engine`` ``engine``,
    ``micro_batches`` of ``MBS`` x ``SEQ`` per rank per step, and those micro-batches (random
    ids, the same on every rank and step)."""
    cfg = trainer_config(precision)
    cfg.train.global_batch_size = MBS * dp * micro_batches
    cfg.train.tune_malloc = tune_malloc
    cfg.parallel.zero_stage, cfg.parallel.zero_engine = stage, engine
    generator = torch.Generator().manual_seed(SEED)
    return cfg, [random_tokens(generator) for _ in range(micro_batches)]


def ours_step(precision: str, tokens: torch.Tensor, compile_model: bool = False,
              attention: str = "") -> Callable[[], float]:
    """``step() -> loss``: one ``Trainer.train_step`` on ``tokens``, as the training loop runs
    it (``attention`` overrides ``model.attention`` when given)."""
    cfg = trainer_config(precision, compile_model)
    cfg.model.attention = attention or cfg.model.attention
    cfg.train.tune_malloc = TUNE_MALLOC[0]
    trainer = Trainer(cfg, log=lambda *_: None)
    lr = trainer.cfg.optimizer.lr

    def step() -> float:
        return trainer.train_step([tokens], lr)["loss"]
    return step


def decay_groups(model: torch.nn.Module) -> list[dict]:
    """Weight decay on the matrices only (Linear weights, embedding), as ours."""
    params = [p for p in model.parameters() if p.requires_grad]
    return [{"params": [p for p in params if p.ndim >= 2], "weight_decay": WEIGHT_DECAY},
            {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}]


def hf_step(precision: str, tokens: torch.Tensor) -> Callable[[], float]:
    """``step() -> loss``: transformers' BloomForCausalLM of the same shape with fp32
    parameters, a stock AdamW with the same hyperparameters and decay groups, autocast to bf16
    in ``bf16``."""
    from transformers import BloomConfig, BloomForCausalLM

    torch.manual_seed(SEED)
    model = BloomForCausalLM(BloomConfig(
        vocab_size=VOCAB, hidden_size=HIDDEN, n_layer=LAYERS, n_head=HEADS,
        hidden_dropout=0.0, attention_dropout=0.0)).train()
    # stock torch.optim.AdamW with our hyperparameters (torch picks the implementation)
    optimizer = torch.optim.AdamW(decay_groups(model), lr=LR, betas=BETAS, eps=EPS)
    input_ids = tokens[:, :SEQ]  # labels = input_ids: the model shifts them itself

    def step() -> float:
        if precision == "bf16":
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = model(input_ids=input_ids, labels=input_ids).loss
        else:
            loss = model(input_ids=input_ids, labels=input_ids).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return float(loss.detach())
    return step
