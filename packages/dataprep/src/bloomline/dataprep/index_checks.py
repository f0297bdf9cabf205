"""What loading an index cache entry checks (shapes, dtypes, values in range against the token
files it was built from), and the whole-folder check of ``inspect-data verify``: a cache
written by another tool, or damaged, is refused with the file to delete instead of sending
the loader outside the token files."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from bloomline.common.errors import UserError
from bloomline.dataprep.index_cache import Check, file_identity, read_entry
from bloomline.dataprep.indexed_dataset import IndexedDataset

__all__ = ["blend_index_check", "check_index_cache", "gpt_index_check"]


# Entries per block of the cache checks: the temporaries stay in the CPU cache.
_CHECK_BLOCK = 1 << 16


def _integers(name: str, array: np.ndarray, ndim: int) -> str | None:
    if array.ndim != ndim or array.dtype.kind not in "iu":
        return f"{name}.npy: {array.dtype}{list(array.shape)}, expected {ndim}-D integers"
    return None


def _first_outside(name: str, array: np.ndarray, low: int, high: int, what: str
                   ) -> str | None:
    """The first entry of a 1-D ``array`` outside ``[low, high)``, named, or None."""
    for start in range(0, len(array), _CHECK_BLOCK):
        block = array[start : start + _CHECK_BLOCK]
        if int(block.min()) < low or int(block.max()) >= high:
            at = start + int(np.argmax((block < low) | (block >= high)))
            return (f"{name}.npy: entry {at} is {int(array[at])}, outside {what} "
                    f"[{low}, {high})")
    return None


def gpt_index_check(sequence_lengths: np.ndarray, sequences: range) -> Check:
    """The value checks of a cached GPT index (:func:`bloomline.dataprep.index_cache.
    cached_arrays`) for the split ``sequences`` of a file with ``sequence_lengths``: after
    them no index entry can point outside another array (the compiled gather checks the rest,
    that each sample fills exactly its row)."""

    def check(arrays: dict[str, np.ndarray], metadata: dict) -> str | None:
        docs, rows, order = (arrays["document_index"], arrays["sample_index"],
                             arrays["shuffle_index"])
        problem = (_integers("document_index", docs, 1) or _integers("sample_index", rows, 2)
                   or _integers("shuffle_index", order, 1))
        if problem:
            return problem
        epochs = metadata["epochs"]
        if not isinstance(epochs, int) or epochs < 1 or len(docs) != epochs * len(sequences):
            return (f"document_index.npy: {len(docs)} entries, not {len(sequences)} sequences "
                    f"x {epochs} epochs (description.json)")
        problem = _first_outside("document_index", docs, sequences.start, sequences.stop,
                                 "the split's sequence ids")
        if problem:
            return problem
        if rows.shape[1] != 2 or len(rows) < 2 or rows[0].tolist() != [0, 0]:
            return (f"sample_index.npy: shape {list(rows.shape)} starting "
                    f"{rows[:1].tolist()}, expected (samples + 1, 2) rows from [0, 0]")
        lengths = sequence_lengths
        if len(rows) > len(lengths) // 16:
            # the offsets' check reads a random length per sample: from a private copy rather
            # than through the .idx's memory map (fewer TLB misses)
            lengths = np.array(lengths)
        previous = 0
        for start in range(0, len(rows), _CHECK_BLOCK):
            positions = rows[start : start + _CHECK_BLOCK, 0]
            offsets = rows[start : start + _CHECK_BLOCK, 1]
            bad = (positions < previous) | (positions >= len(docs))
            bad[1:] |= positions[1:] < positions[:-1]
            if bad.any():
                row = start + int(np.argmax(bad))
                return (f"sample_index.npy: row {row} starts at document-index position "
                        f"{int(rows[row, 0])}: positions must not decrease and stay below "
                        f"{len(docs)}")
            previous = int(positions[-1])
            room = lengths[docs[positions]]
            bad = (offsets < 0) | (offsets > room)
            if bad.any():
                row = start + int(np.argmax(bad))
                return (f"sample_index.npy: row {row} starts at token {int(offsets[row - start])} "
                        f"of a sequence of {int(room[row - start])} tokens")
        if len(order) != len(rows) - 1:
            return f"shuffle_index.npy: {len(order)} entries for {len(rows) - 1} samples"
        return _first_outside("shuffle_index", order, 0, len(rows) - 1, "the samples built")

    return check


def blend_index_check(component_sizes: list[int]) -> Check:
    """The value checks of a cached blend of datasets with ``component_sizes`` samples each:
    every entry names an existing dataset and one of its samples."""
    sizes = np.asarray(component_sizes, dtype=np.int64)

    def check(arrays: dict[str, np.ndarray], metadata: dict) -> str | None:
        which, own = arrays["dataset_index"], arrays["dataset_sample_index"]
        problem = (_integers("dataset_index", which, 1)
                   or _integers("dataset_sample_index", own, 1))
        if problem:
            return problem
        if len(which) != len(own) or len(which) != metadata["size"]:
            return (f"dataset_sample_index.npy: {len(own)} entries, dataset_index.npy "
                    f"{len(which)}, description.json {metadata['size']}")
        problem = _first_outside("dataset_index", which, 0, len(sizes), "the datasets")
        if problem:
            return problem
        for start in range(0, len(own), _CHECK_BLOCK):
            block = own[start : start + _CHECK_BLOCK]
            limit = sizes[which[start : start + _CHECK_BLOCK]]
            bad = (block < 0) | (block >= limit)
            if bad.any():
                at = start + int(np.argmax(bad))
                return (f"dataset_sample_index.npy: entry {at} is sample {int(own[at])} of "
                        f"dataset {int(which[at])}, which has {int(sizes[which[at]])}")
        return None

    return check


def check_index_cache(cache_dir: str | os.PathLike, datasets: dict[str, IndexedDataset]
                      ) -> dict:
    """Check every entry of an index cache folder against the token files it was built from
    (``inspect-data verify`` of a corpus folder): what loading checks (description, shapes,
    dtypes, values in range), without building anything. Entries of files that are no longer
    there, or were rewritten since, are stale (counted, not checked: nothing reads them).

    Returns:
        ``{"checked": entries checked, "stale": entries of other inputs}``.

    Raises:
        UserError: the first bad entry, naming its file and what to delete.
    """
    cache_dir = Path(cache_dir)
    result = {"checked": 0, "stale": 0}
    if not cache_dir.is_dir():
        return result
    by_identity = {file_identity(ds.idx_path): ds for ds in datasets.values()}
    samples: dict[str, int] = {}  # gpt entry name -> samples built
    entries = [path for path in sorted(cache_dir.iterdir())
               if path.is_dir() and not path.name.startswith(".")]
    entries.sort(key=lambda path: not path.name.startswith("gpt-"))  # blends need their parts
    for path in entries:
        checks: list[Check] = []

        def check_for(description: dict, checks=checks) -> Check | None:
            if description.get("kind") == "gpt":
                dataset = by_identity.get(description.get("idx"))
                if dataset is None or (description.get("bin_bytes")
                                       != dataset.bin_path.stat().st_size):
                    return None
                start, stop = description["sequences"]
                checks.append(gpt_index_check(dataset.sequence_lengths, range(start, stop)))
            elif description.get("kind") == "blend":
                sizes = [samples.get(name) for name in description.get("components", [])]
                if not sizes or None in sizes:
                    return None
                checks.append(blend_index_check(sizes))
            return checks[0] if checks else None

        _, entry, problem = read_entry(path, check_for)
        if problem is not None:
            raise UserError(f"{path}/{problem}; delete {path} (build-index or the trainer "
                            "rebuilds it)")
        if entry is None or not checks:
            result["stale"] += 1
            continue
        result["checked"] += 1
        if "shuffle_index" in entry.arrays:
            samples[path.name] = len(entry.arrays["shuffle_index"])
    return result
