"""Kept indices: a train dataset's GPT index keeps the sample count it was built with while
that still holds what the blend draws from it.

Megatron's order of one dataset's samples is a function of its index's number of epochs and
whether the last epoch is shuffled apart, both of which follow from the sample count the
index is built for (``gpt_index.index_shape``). Blend phases size each dataset's index by
what all phases draw from it, so a resume that changes the weights would change that count
and, where the epochs change with it, reshuffle the dataset from its first sample: samples
already trained would come again and others never.

``IndexRequest.kept_sizes`` (the trainer passes the counts its checkpoint recorded) keeps a
dataset's count whenever the index of that count builds at least the samples now needed
(the phases' draw with the surplus): the index, and so the dataset's order, stays the same
and the blend goes on with it. Only a dataset that now needs more than its index holds is
sized anew, which no Megatron index can do without reordering it. No kept sizes: the sizes
the phases give, byte for byte as before.
"""

from __future__ import annotations

from collections.abc import Callable

from bloomline.dataprep.gpt_index import IndexShape

__all__ = ["kept_size"]


def kept_size(kept: int | None, needed: int | None,
              shape_of: Callable[[int], IndexShape]) -> int | None:
    """The sample count to build a dataset's index for: ``kept`` (the count its index was
    built with) when the index of that count builds at least ``needed`` samples
    (``shape_of(count).num_built``), else ``needed`` (also when either is None: nothing kept,
    or one epoch asked for)."""
    if kept is None or needed is None:
        return needed
    return kept if shape_of(kept).num_built >= needed else needed
