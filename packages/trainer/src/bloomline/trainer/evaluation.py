"""Validation and ``trainer evaluate``: the loss of a split's blend and of each dataset in it,
and the blend's provenance behind the per-source train loss. The loss functions themselves
are ``losses.py``'s.

Mental model:

- With several datasets, dataprep's valid (and test) split is a blend (``BlendedSampleDataset``)
  of each dataset's own split (``blend.datasets[k]``): one epoch of each, interleaved in
  proportion to their sizes. Megatron-LM reports the blend's loss over its first
  ``train.eval_samples`` samples; we report that (``valid_loss``, as with one dataset) and add
  each dataset's loss over the first ``train.eval_samples`` samples *of its own split* (all of
  them when it has fewer): ``valid_loss/NAME``. Each dataset is measured on the same number of
  samples whatever its share of the blend, so a small language is not judged on a handful.
- Every loss is a mean of per-sample losses (each the mean over the sample's L tokens). The
  blend takes each dataset's samples in order, so its first N samples are, per dataset, the
  first few of those the per-dataset losses read: each sample is evaluated once and the blend's
  loss comes from the same per-sample losses (at most K x N forwards, not (K + 1) x N).
- The per-source train loss needs no forward of its own: at log steps the loop asks
  ``train_step`` for each sample's loss (the fused loss computes them anyway, see
  ``model/loss.py``; tp and pp take them from the logits' cross-entropy), sums them per dataset
  of the blend (``sample_sources``: ``dataset_index`` of the step's sample ids) with counts
  (``losses.source_totals``), sums over dp, and on pp takes them from the last stage. The
  count-weighted mean of the per-source losses is the step's loss (equal-length samples).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from bloomline.common.errors import UserError
from bloomline.trainer.checkpoint import load_checkpoint, load_config_of
from bloomline.trainer.config import Config
from bloomline.trainer.data import TokenSamples, open_splits
from bloomline.trainer.losses import per_sample_means
from bloomline.trainer.model import build_model
from bloomline.trainer.precision import Precision, resolve_dtype

__all__ = ["EvalRow", "SplitEvaluation", "batched_sample_losses", "blend_of",
           "evaluate_checkpoint", "evaluate_split", "perplexity", "sample_sources"]

SPLITS = ("valid", "test")


def perplexity(loss: float) -> float:
    """exp(loss), capped (exp(80) ~ 5.5e34) so that a diverged run logs a number, not inf."""
    return math.exp(min(loss, 80.0))


def batched_sample_losses(forward: Callable[[torch.Tensor], torch.Tensor],
                          samples: Sequence[torch.Tensor], micro_batch_size: int
                          ) -> torch.Tensor:
    """Each sample's loss ([len(samples)], fp32, CPU): ``forward(tokens [b, L + 1]) -> [b]``
    over micro-batches of ``micro_batch_size`` (the last one smaller)."""
    out = []
    for first in range(0, len(samples), micro_batch_size):
        ids = range(first, min(first + micro_batch_size, len(samples)))
        out.append(forward(torch.stack([samples[i] for i in ids])).float().cpu())
    return torch.cat(out) if out else torch.zeros(0)


# -- the blend's provenance -----------------------------------------------------------------
def blend_of(samples):
    """The ``BlendedSampleDataset`` behind ``samples`` (a ``TokenSamples`` or the dataset
    itself), or None for one dataset (or a plain list of samples)."""
    inner = getattr(samples, "samples", samples)
    if hasattr(inner, "dataset_index") and hasattr(inner, "datasets"):
        return inner
    return None


def sample_sources(samples, ids: list[list[int]]) -> torch.Tensor | None:
    """The dataset number (in the blend's ``names``) of every sample id of ``ids`` (the
    micro-batches of a step, flattened in order; int64), or None without a blend."""
    blend = blend_of(samples)
    if blend is None:
        return None
    flat = np.asarray([i for batch in ids for i in batch], dtype=np.int64)
    return torch.from_numpy(np.asarray(blend.dataset_index[flat], dtype=np.int64))


# -- evaluating a split ----------------------------------------------------------------------
@dataclass
class EvalRow:
    """One line of an evaluation: a dataset (or the blend), its sample count and mean loss."""

    name: str
    samples: int
    loss: float

    @property
    def ppl(self) -> float:
        return perplexity(self.loss)

    def to_dict(self) -> dict:
        return {"samples": self.samples, "loss": self.loss, "ppl": self.ppl}


@dataclass
class SplitEvaluation:
    """The blend's row (``overall``: the split as the loop evaluates it) and, with several
    datasets, one row per dataset."""

    split: str
    overall: EvalRow
    datasets: list[EvalRow] = field(default_factory=list)

    def record(self) -> dict[str, float]:
        """``{split}_loss``, ``{split}_ppl`` and, with several datasets, ``{split}_loss/NAME``
        and ``{split}_ppl/NAME`` (no per-dataset keys for a single dataset: they would repeat
        the split's)."""
        out = {f"{self.split}_loss": self.overall.loss, f"{self.split}_ppl": self.overall.ppl}
        if len(self.datasets) > 1:
            for row in self.datasets:
                out[f"{self.split}_loss/{row.name}"] = row.loss
                out[f"{self.split}_ppl/{row.name}"] = row.ppl
        return out

    def to_json(self) -> dict:
        rows = self.datasets or [self.overall]
        return {"split": self.split, "datasets": {r.name: r.to_dict() for r in rows},
                "blend": self.overall.to_dict()}

    def table(self) -> str:
        """Aligned columns: dataset, samples, loss, ppl; the blend last (several datasets)."""
        rows = list(self.datasets or [self.overall])
        if len(self.datasets) > 1:
            rows.append(EvalRow("blend", self.overall.samples, self.overall.loss))
        cells = [["dataset", "samples", "loss", "ppl"]] + [
            [r.name, f"{r.samples:,}", f"{r.loss:.4f}", f"{r.ppl:,.2f}"] for r in rows]
        widths = [max(len(line[i]) for line in cells) for i in range(4)]
        return "\n".join("  ".join(cell.ljust(w) if i == 0 else cell.rjust(w)
                                   for i, (cell, w) in enumerate(zip(line, widths, strict=True)))
                         for line in cells)


class _Picked:
    """Samples ``(dataset k, sample j)`` of the blend's component datasets, as one sequence:
    all of an evaluation's forwards in one run of micro-batches (one remainder, not K)."""

    def __init__(self, components: list, pairs: list[tuple[int, int]]) -> None:
        self.components, self.pairs = components, pairs

    def __len__(self) -> int:
        return len(self.pairs)

    def __getitem__(self, i: int) -> torch.Tensor:
        k, j = self.pairs[i]
        return self.components[k][j]


class _First:
    """The first ``count`` samples of ``samples``."""

    def __init__(self, samples, count: int) -> None:
        self.samples, self.count = samples, count

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, i: int) -> torch.Tensor:
        return self.samples[i]


def evaluate_split(sample_losses: Callable[[Sequence[torch.Tensor]], torch.Tensor], samples,
                   num_samples: int, split: str = "valid",
                   name: str = "all") -> SplitEvaluation:
    """The blend's loss over its first ``num_samples`` samples and, for a blend, each
    dataset's over the first ``num_samples`` of its own split (module docstring).

    Args:
        sample_losses: samples -> each one's loss (``Trainer.sample_losses``); collective
            under parallelism, so every rank calls this with the same arguments.
        samples: The split (``TokenSamples``) or a plain sequence of [L + 1] token tensors.
        num_samples: Samples of the blend, and of each dataset, at most.
        split: The keys' prefix (``valid``, ``test``).
        name: The row's name when ``samples`` is a single dataset.
    """
    total = min(num_samples, len(samples))
    blend = blend_of(samples)
    if blend is None:
        losses = sample_losses(_First(samples, total)).double()
        return SplitEvaluation(split, EvalRow(name, total, _mean(losses)))

    seq_length = samples.seq_length
    components = [TokenSamples(ds, seq_length) for ds in blend.datasets]
    wanted = [set(range(min(num_samples, len(c)))) for c in components]
    firsts = [(int(k), int(j)) for k, j in zip(blend.dataset_index[:total],
                                               blend.dataset_sample_index[:total], strict=True)]
    for k, j in firsts:  # in the per-dataset sets already, unless a blend skips samples
        wanted[k].add(j)
    pairs = [(k, j) for k, ids in enumerate(wanted) for j in sorted(ids)]
    losses = sample_losses(_Picked(components, pairs)).double().tolist()
    by_pair = dict(zip(pairs, losses, strict=True))
    rows = []
    for k, dataset_name in enumerate(blend.names):
        count = min(num_samples, len(components[k]))
        rows.append(EvalRow(dataset_name, count,
                            _mean([by_pair[(k, j)] for j in range(count)])))
    overall = EvalRow("blend", total, _mean([by_pair[pair] for pair in firsts]))
    return SplitEvaluation(split, overall, rows)


def _mean(values) -> float:
    values = list(values.tolist() if hasattr(values, "tolist") else values)
    return math.fsum(values) / max(1, len(values))


# -- trainer evaluate ------------------------------------------------------------------------
def evaluate_checkpoint(checkpoint: str | Path, split: str = "valid",
                        num_samples: int | None = None,
                        corpus: str | None = None) -> tuple[SplitEvaluation, int]:
    """Evaluate a checkpoint on a split of its run's data in this process (any saved layout:
    the checkpoint reshards into one process), with its config's precision and micro-batch
    size. Returns the evaluation and the checkpoint's step.

    Args:
        corpus: a corpus folder to read instead of the config's ``data.corpus`` (a copy of
            it); its index is then kept in ``CORPUS/.index``, not the config's cache folder.

    Raises:
        UserError: an unknown split, a corpus that is gone (naming its path), a split the
            index does not have (``data.split`` gives it no share), a bad sample count, or a
            checkpoint that does not load.
    """

    if split not in SPLITS:
        raise UserError(f"--split {split}: expected one of {', '.join(SPLITS)}")
    path = Path(checkpoint)
    cfg = load_config_of(path, Config)
    count = cfg.train.eval_samples if num_samples is None else num_samples
    if count < 1:
        raise UserError(f"--samples {count}: must be at least 1")
    if corpus is not None:
        cfg.data.corpus, cfg.data.cache_dir = corpus, ""
    elif cfg.data.corpus and not Path(cfg.data.corpus).exists():
        raise UserError(f"{checkpoint}: its data.corpus {cfg.data.corpus} no longer exists; "
                        "pass --data with the corpus folder (a copy of it)")
    # the splits first: a missing one is reported before the weights are read
    splits = open_splits(cfg.data.corpus, cfg.data.seq_length, cfg.train.train_samples,
                         None, cfg.data.split, cfg.data.seed, cfg.data.weights,
                         cfg.data.cache_dir)
    if split not in splits:
        raise UserError(f"--split {split}: the index of {cfg.data.corpus} has no {split} split "
                        f"(data.split {cfg.data.split!r} gives it no share); choose "
                        f"{' or '.join(s for s in SPLITS if s in splits) or 'another split'}")
    device = torch.device("cpu")
    model = build_model(cfg.model, device, seed=None)
    state = load_checkpoint(path, model)
    model.eval()
    resolve_dtype(cfg.precision, device)  # "auto" as the run resolved it on this device
    precision = Precision(cfg.precision, device)

    @torch.no_grad()
    def forward(tokens: torch.Tensor) -> torch.Tensor:
        with precision.autocast():
            _, token_losses = model(tokens[:, :-1], labels=tokens[:, 1:], token_losses=True)
        return per_sample_means(token_losses, tokens[:, 1:])

    samples = splits[split]
    name = _single_name(cfg.data.corpus) if blend_of(samples) is None else "blend"
    result = evaluate_split(
        lambda picked: batched_sample_losses(forward, picked, cfg.train.micro_batch_size),
        samples, count, split, name)
    return result, int(state.get("step", 0))


def _single_name(corpus: str) -> str:
    """The name of a one-dataset corpus (its NAME.idx), for the table's row."""
    names = sorted(p.stem for p in Path(corpus).glob("*.idx"))
    return names[0] if len(names) == 1 else "all"
