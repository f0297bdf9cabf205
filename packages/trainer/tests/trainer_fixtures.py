"""Helpers shared by the trainer tests: a tiny corpus of token documents with a learnable
pattern and a config that trains on it in a second (with a given matmul peak: no start-up
timing). A module of its own (not conftest) because
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
    cfg.monitor.activation_stats_interval = 0
    # given, not measured: the start-up matmul timing (mfu.measure_peak_flops) is what only the
    # peak tests (test_mfu_peak.py) read, and they set 0 to measure
    cfg.monitor.peak_flops = 1e12
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


def fake_conditions(other_cores: float, stable: bool = True) -> dict:
    """Measurement conditions as ``mfu.conditions`` records them, with an injected load:
    ``other_cores`` of 2 cores busy with other processes."""
    from bloomline.trainer.reporting.mfu import under_load

    recorded = {"other_cpu_cores": other_cores, "own_cpu_cores": 1.0, "cores": 2,
                "host": "fake-host", "stable": stable, "loadavg_1m": None}
    recorded["under_load"] = under_load(recorded)
    return recorded


class FakeMeasure:
    """A stand-in for ``peak.measure_peak_flops`` that returns ``values`` in turn (the last one
    from then on) and counts its calls. ``loads``: the other processes' cores during each
    call (the last one from then on); idle by default."""

    def __init__(self, *values: float, loads: tuple[float, ...] = (0.0,)) -> None:
        self.values = list(values)
        self.loads = list(loads)
        self.calls = 0

    def __call__(self, device=None, dtype=None):
        from bloomline.trainer.reporting.mfu import PeakMeasurement

        value = self.values[min(self.calls, len(self.values) - 1)]
        load = self.loads[min(self.calls, len(self.loads) - 1)]
        self.calls += 1
        return PeakMeasurement(value, f"fake measurement {self.calls}", fake_conditions(load))


def resolve_peak_twice(run_dir: str) -> list:
    """On a rank of run_distributed: the peak resolved twice in ``run_dir``, rank r measuring
    (r + 1) x 100 GFLOP/s; [flops, source, flops, source, measure calls, cache key]. Here, not
    in the test module: spawned processes import it by name."""
    import torch.distributed as dist

    from bloomline.trainer.reporting.mfu import machine_key, resolve_peak

    dist.init_process_group("gloo")
    rank, cpu = dist.get_rank(), torch.device("cpu")
    measure = FakeMeasure(1e11 * (rank + 1))
    first = resolve_peak(0.0, cpu, torch.float32, run_dir, measure, is_writer=rank == 0)
    again = resolve_peak(0.0, cpu, torch.float32, run_dir, measure, is_writer=rank == 0)
    return [first.flops, first.source, again.flops, again.source, measure.calls,
            machine_key(cpu, torch.float32)]
