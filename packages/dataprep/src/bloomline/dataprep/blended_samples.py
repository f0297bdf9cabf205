"""The sample dataset of a blend: samples of several datasets interleaved by the blend indices
(``blending.py`` computes the indices; ``build_index.py`` builds and caches them)."""

from __future__ import annotations

import numpy as np

from bloomline.dataprep.gpt_samples import GPTSampleDataset, out_of_range, sample_ids

__all__ = ["BlendedSampleDataset"]


class BlendedSampleDataset:
    """Samples of several datasets interleaved by the blend indices.

    ``ds[i]`` is sample ``dataset_sample_index[i]`` of dataset ``dataset_index[i]``;
    :meth:`source` says which. :meth:`get_batch` reads many samples in one call.
    """

    def __init__(self, datasets: list[GPTSampleDataset], names: list[str],
                 dataset_index: np.ndarray, dataset_sample_index: np.ndarray) -> None:
        self.datasets = datasets
        self.names = names
        self.dataset_index = dataset_index
        self.dataset_sample_index = dataset_sample_index
        self._plain: tuple[np.ndarray, np.ndarray] | None = None  # for get_batch, per process

    def __len__(self) -> int:
        return len(self.dataset_index)

    def __getitem__(self, i: int) -> np.ndarray:
        return self.datasets[self.dataset_index[i]][int(self.dataset_sample_index[i])]

    def get_batch(self, indices) -> np.ndarray:
        """Samples ``indices`` as one ``(len(indices), L + 1)`` array in the files' token dtype:
        row r holds the values of ``ds[indices[r]]``.

        The batch's samples are grouped by dataset and each group copied by its dataset's
        compiled loop straight into its rows (:meth:`GPTSampleDataset.get_batch`): one call
        per dataset present, no loop over samples.

        Raises:
            IndexError: naming the first index outside ``-len(ds) .. len(ds) - 1``.
        """
        ids = sample_ids(indices)
        first = self.datasets[0]
        batch = np.empty((len(ids), first.sample_length), dtype=first.dataset.dtype)
        if len(ids) == 0:
            return batch
        if self._plain is None:  # indexing a np.memmap costs more per call (subclass hooks)
            self._plain = (np.asarray(self.dataset_index).view(np.ndarray),
                           np.asarray(self.dataset_sample_index).view(np.ndarray))
        try:
            which = self._plain[0][ids]
            own = self._plain[1][ids]
        except IndexError:
            bad = (ids < -len(self)) | (ids >= len(self))
            raise out_of_range(int(ids[bad][0]), len(self)) from None
        if len(ids) == 1 or (which == which[0]).all():  # one dataset: no regrouping
            self.datasets[int(which[0])].batch_reader().gather(own, batch)
            return batch
        order = np.argsort(which, kind="stable")  # the batch's rows grouped by dataset
        start = 0
        for number, count in enumerate(np.bincount(which).tolist()):
            if count:
                rows = order[start : start + count]
                self.datasets[number].batch_reader().gather(own[rows], batch, rows)
                start += count
        return batch

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_plain": None}  # views of the arrays pickled already

    def source(self, i: int) -> tuple[int, int]:
        """(dataset number in ``names``, sample number within that dataset) of sample i."""
        return int(self.dataset_index[i]), int(self.dataset_sample_index[i])
