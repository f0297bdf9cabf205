"""The blend's provenance behind the per-source train loss and the per-dataset validation:
which dataset of a blend each sample comes from.

With several datasets, dataprep's splits are a ``BlendedSampleDataset``: each sample position
maps to (dataset, sample of that dataset) through ``dataset_index`` and
``dataset_sample_index``. At log steps the loop asks the step for each sample's loss and sums
them per dataset (``losses.source_totals``) from the ``sample_sources`` of the step's ids.
"""

from __future__ import annotations

import numpy as np
import torch

__all__ = ["blend_of", "sample_sources"]


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
