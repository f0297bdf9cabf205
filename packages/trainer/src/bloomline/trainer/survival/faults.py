"""The trainer's fault points on top of :mod:`bloomline.common.faults` (see there for the
``BLOOMLINE_FAULTS`` syntax): ``step`` (a training step, its batch in hand, before the
forward), ``save`` (after a checkpoint's tensors are written, before its manifest makes it
complete; also inside an async save's background writer), ``export`` (``export-hf`` with the
weights written into its scratch folder, before the folder moves into place), ``section`` (a
rank entering a part of its step, with ``section`` and ``step``:
``reporting/step_sections.py``; ``delay`` there makes a straggler, ``stop`` a rank that stops
answering), ``snapshot`` (a peer snapshot's background round of step ``step`` starting:
``snapshots/peer_snapshots.py``), and the ``spike`` action at ``batch``: the micro-batch
holding train sample ``sample`` is replaced by the vocabulary's last two ids in turn, which the
data never contains (the model has learned to rule them out, and with tied embeddings it
favours repeating the input token, so the loss jumps, like a garbage batch); and the ``lose``
action at ``snapshots``: a restarted rank about to look for its peer snapshots finds its node's
folder gone (``node``: the snapshot placement's node), as after the loss of a machine.

The ``bitflip`` action at ``grad`` and ``param`` (silent data corruption: one flipped bit in
a rank's gradient, transient, or in a parameter, persistent) is ``bit_flips.py``'s.
"""

from __future__ import annotations

import os

from bloomline.common.faults import active_faults, condition_holds, fire

__all__ = ["corrupt_spiked", "fire", "lost", "spike_samples"]


def lost(point: str, **context) -> bool:
    """Whether a ``lose`` fault holds at ``point`` here (it is announced on stderr, as
    ``fire`` announces the others)."""
    for action, at, where in active_faults():
        if action == "lose" and at == point and condition_holds(where, context):
            os.write(2, f"fault: lose@{point} {context}\n".encode())
            return True
    return False


def spike_samples() -> set[int]:
    """Train sample ids whose micro-batches the ``spike@batch`` faults corrupt (here)."""
    return {int(where["sample"]) for action, point, where in active_faults()
            if action == "spike" and point == "batch"
            and condition_holds({k: v for k, v in where.items() if k != "sample"}, {})}


def corrupt_spiked(micro_batches: list, sample_ids: list[list[int]], vocab_size: int) -> list:
    """The micro-batches with those holding a spiked sample replaced by the vocabulary's
    last two ids in turn (tensors of [mbs, L + 1])."""
    spiked = spike_samples()
    if not spiked:
        return micro_batches
    return [_garbage(batch, vocab_size) if spiked.intersection(ids) else batch
            for batch, ids in zip(micro_batches, sample_ids, strict=True)]


def _garbage(batch, vocab_size: int):
    garbage = batch.clone().fill_(vocab_size - 1)
    garbage[:, 1::2] = vocab_size - 2
    return garbage
