"""``inspect-data blend``: what share of training each dataset really gets, and how often
its documents repeat.

Shares come from the blend's ``dataset_index`` (which dataset serves sample i), counted with
``np.bincount`` over prefixes of it: the first 1%, 10%, 50% and all of the split. Repeats come
from the samples each dataset actually serves (its first ``used`` samples in shuffle order,
since the blend draws a dataset's samples in order): a document is seen once per time a
served sample covers any of its tokens. Both are computed over whole arrays in blocks, so a
blend of 100M samples costs seconds, not a Python loop per sample. A blend of several
phases (``dataprep build-index --phase``) also gets each phase's weights and realized shares
(``phase_report``).
"""

from __future__ import annotations

import math

import numpy as np

from bloomline.dataprep.blended_samples import BlendedSampleDataset
from bloomline.dataprep.build_index import BuiltIndex
from bloomline.dataprep.gpt_samples import GPTSampleDataset
from bloomline.tools.phase_report import format_phase_lines, phases_of
from bloomline.tools.samples import split_dataset
from bloomline.tools.tables import format_table

__all__ = ["PROGRESS", "dataset_index_of", "document_repeats", "format_blend", "prefix_counts",
           "summarize_blend"]

PROGRESS = (0.01, 0.1, 0.5, 1.0)  # shares of the split's samples the report looks at
_BLOCK = 1 << 22  # samples or positions per vectorized step: bounded temporaries


def dataset_index_of(split_ds: GPTSampleDataset | BlendedSampleDataset) -> np.ndarray | None:
    """Which dataset serves each sample; None for a single dataset (all of them)."""
    return split_ds.dataset_index if isinstance(split_ds, BlendedSampleDataset) else None


def prefix_counts(dataset_index: np.ndarray | None, num_datasets: int, stops: list[int]
                  ) -> np.ndarray:
    """Samples per dataset among the first ``stop`` samples, for each (increasing) stop.

    Returns:
        int64 array ``(len(stops), num_datasets)``. Each sample is counted once: the counts
        of a prefix are those of the previous prefix plus a bincount of the samples between.
    """
    out = np.zeros((len(stops), num_datasets), dtype=np.int64)
    if dataset_index is None:
        out[:, 0] = stops
        return out
    counts = np.zeros(num_datasets, dtype=np.int64)
    previous = 0
    for row, stop in enumerate(stops):
        for start in range(previous, stop, _BLOCK):
            block = dataset_index[start : min(stop, start + _BLOCK)]
            counts += np.bincount(block, minlength=num_datasets)
        previous = max(previous, stop)
        out[row] = counts
    return out


def _covered_positions(component: GPTSampleDataset, served: np.ndarray) -> np.ndarray:
    """Boolean over the document index: True where a served sample reads a token."""
    index = component.index
    starts = index.sample_index[:, 0]
    covered = np.zeros(len(index.document_index), dtype=bool)
    for block_start in range(0, len(served), _BLOCK):
        built = served[block_start : block_start + _BLOCK]
        first = starts[built].astype(np.int64)
        last = starts[built + 1].astype(np.int64)
        # the last position is read only if the sample takes a token from it: the next
        # sample's offset there, plus the extra token
        takes_last = index.sample_index[built + 1, 1].astype(np.int64) + component.extra > 0
        last = np.where(takes_last, last, last - 1)
        lo, hi = int(first.min()), int(last.max()) + 1
        # difference array over this block's window of positions: +1 at each first, -1 after
        # each last; positions with a positive running sum are covered
        marks = np.bincount(first - lo, minlength=hi - lo + 1)
        marks -= np.bincount(last + 1 - lo, minlength=hi - lo + 1)
        covered[lo:hi] |= np.cumsum(marks[:-1]) > 0
    return covered


def document_repeats(component: GPTSampleDataset, num_served: int) -> dict:
    """How many times the split's documents are seen in the first ``num_served`` samples.

    Returns:
        ``{"max", "mean", "unseen"}``: the most and the mean times a document of the split is
        read (partly or whole), and the share of its documents never read.
    """
    index = component.index
    num_served = min(num_served, len(index))
    # served samples sorted by position: their windows of the document index then advance
    # monotonically, which keeps each block's window small
    served = np.sort(np.asarray(index.shuffle_index[:num_served], dtype=np.int64))
    covered = _covered_positions(component, served) if num_served else None
    sequences = len(component.dataset)
    seen = np.zeros(sequences, dtype=np.int64)
    documents = index.document_index
    for start in range(0, len(documents) if covered is not None else 0, _BLOCK):
        block = documents[start : start + _BLOCK][covered[start : start + _BLOCK]]
        seen += np.bincount(block, minlength=sequences)
    # the split's documents are those its document index holds (each once per epoch)
    in_split = np.zeros(sequences, dtype=bool)
    for start in range(0, len(documents), _BLOCK):
        in_split[documents[start : start + _BLOCK]] = True
    counts = seen[in_split]
    if not counts.size:
        return {"max": 0, "mean": 0.0, "unseen": 1.0}
    return {"max": int(counts.max()), "mean": float(counts.mean()),
            "unseen": float(np.count_nonzero(counts == 0) / counts.size)}


def summarize_blend(built: BuiltIndex, split: str = "train", request_split: str = "") -> dict:
    """Requested weight, realized shares over training and repeats, per dataset of a split."""
    split_ds, names = split_dataset(built, split, request_split)
    info = built.report["splits"][split]
    total = len(split_ds)
    stops = [max(1, math.ceil(share * total)) for share in PROGRESS]
    counts = prefix_counts(dataset_index_of(split_ds), len(names), stops)
    components = (split_ds.datasets if isinstance(split_ds, BlendedSampleDataset)
                  else [split_ds])
    rows = {}
    for number, name in enumerate(names):
        row = info["datasets"][name]
        used = row.get("used", min(total, info["requested"] or total))
        rows[name] = {
            "weight": row.get("weight", 1.0),
            "realized": {f"{share:g}": float(counts[k, number] / stops[k])
                         for k, share in enumerate(PROGRESS)},
            "used": int(used), "built": row["samples"], "epochs": row["epochs"],
            "documents": row["documents"], "tokens_per_epoch": row["tokens"],
            "repeats": document_repeats(components[number], int(used)),
        }
    return {"corpus": built.report["corpus"], "split": split, "samples": total,
            "requested": info["requested"], "blend": "blend" in info,
            "phases": phases_of(built, split), "datasets": rows,
            "left_out": info.get("left_out", [])}


def format_blend(result: dict) -> str:
    """One row per dataset: weight, realized shares at each point of training, repeats."""
    shares = [f"{share:g}" for share in PROGRESS]
    header = ["dataset", "weight", *(f"first {float(s):.0%}" for s in shares[:-1]), "all",
              "used", "epochs", "max seen", "mean seen", "unseen"]
    rows = [header]
    for name, row in result["datasets"].items():
        rows.append([name, f"{row['weight']:.4f}",
                     *(f"{row['realized'][s]:.4f}" for s in shares), f"{row['used']:,}",
                     str(row["epochs"]), str(row["repeats"]["max"]),
                     f"{row['repeats']['mean']:.2f}", f"{row['repeats']['unseen']:.1%}"])
    kind = "blend" if result["blend"] else "single dataset"
    requested = result["requested"]
    if requested is not None and result["samples"] < requested:
        # build-index's rule without weights: one epoch of each dataset, whatever was asked
        kind += f", SHORT of the {requested:,} requested: no weights, one epoch each"
    lines = [f"{result['corpus']}: {result['split']} split, {result['samples']:,} samples "
             f"({kind}); realized share of samples per dataset; documents seen per dataset"]
    left_out = ([f"  left out (weight 0): {', '.join(result['left_out'])}"]  # as build-index
                if result.get("left_out") else [])
    phases = format_phase_lines(result.get("phases", []))
    return "\n".join(lines + format_table(rows) + phases + left_out)
