"""Validation: the loss of a split's blend and of each dataset in it, for the loop's evaluations
and ``trainer evaluate`` (``evaluate_command.py``). The per-sample forward is the step
runner's (``step/sample_forward.py``), the blend's provenance ``data/blend_sources.py``'s.

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
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from bloomline.trainer.data import TokenSamples, blend_of

__all__ = ["EvalRow", "SplitEvaluation", "evaluate_split", "perplexity"]


def perplexity(loss: float) -> float:
    """exp(loss), capped (exp(80) ~ 5.5e34) so that a diverged run logs a number, not inf."""
    return math.exp(min(loss, 80.0))


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
