"""Helpers shared by the trainer tests: a tiny corpus of token documents with a learnable
pattern and a config that trains on it in a second. A module of its own (not conftest) because
the repository root's conftest is imported by name from the dataprep tests."""

from __future__ import annotations

import numpy as np
import torch

from bloomline.dataprep.indexed_dataset import IndexedDatasetWriter
from bloomline.trainer.config import Config

VOCAB = 96


def write_corpus(folder, vocab: int = VOCAB, documents: int = 120, seed: int = 0) -> str:
    """Documents with a learnable pattern (a repeated ramp) so that the loss can fall."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    writer = IndexedDatasetWriter(folder / "toy", np.uint16)
    for _ in range(documents):
        start = int(rng.integers(0, vocab))
        length = int(rng.integers(20, 120))
        tokens = (start + np.arange(length) * int(rng.integers(1, 3))) % (vocab - 1)
        writer.add_document(np.append(tokens, vocab - 1).astype(np.uint16))
    writer.finalize()
    return str(folder)


def tiny_config(corpus: str, run_dir, **sections) -> Config:
    cfg = Config()
    cfg.model.vocab_size = 128
    cfg.model.hidden_size = 32
    cfg.model.num_layers = 2
    cfg.model.num_heads = 4
    cfg.data.corpus = corpus
    cfg.data.seq_length = 32
    cfg.data.split = "90,10,0"
    cfg.data.num_workers = 0
    cfg.train.micro_batch_size = 2
    cfg.train.global_batch_size = 4
    cfg.train.train_samples = 80
    cfg.train.eval_interval = 0
    cfg.train.log_interval = 5
    cfg.train.run_dir = str(run_dir)
    cfg.train.device = "cpu"
    cfg.precision.dtype = "fp32"
    cfg.optimizer.lr = 3e-3
    cfg.schedule.warmup = 8
    cfg.checkpoint.interval = 0
    cfg.monitor.tensorboard = False
    cfg.monitor.thermometer_interval = 0
    for section, values in sections.items():
        for key, value in values.items():
            setattr(getattr(cfg, section), key, value)
    return cfg


def grad_fn_names(t: torch.Tensor) -> set[str]:
    """Type names of every autograd node ``t`` was computed through (which kernels ran)."""
    seen, todo = set(), [t.grad_fn]
    while todo:
        fn = todo.pop()
        if fn is not None and fn not in seen:
            seen.add(fn)
            todo.extend(next_fn for next_fn, _ in fn.next_functions)
    return {type(fn).__name__ for fn in seen}
