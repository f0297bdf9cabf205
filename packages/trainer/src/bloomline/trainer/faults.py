"""Fault injection for the run-survival tests: a crash, a signal, a hang or a bad batch at a
chosen place of a real run, in a real process, without editing the code under test.

The faults come from the environment, so that a test can put them into processes it starts
through the command line, torchrun or ``run_distributed``::

    BLOOMLINE_FAULTS="kill@step:step=5:rank=1:attempt=0;spike@batch:sample=37"

Each fault is ``ACTION@POINT`` followed by ``:KEY=VALUE`` conditions, all of which must hold:

- points: ``step`` (a training step, its batch in hand, before the forward), ``save`` (after a
  checkpoint's tensors are written, before its manifest makes it complete; also inside an
  async save's background writer), ``batch`` (the ``spike`` action only);
- actions: ``kill`` (SIGKILL to this process: no handler, no cleanup, like a node failure),
  ``term`` / ``usr1`` (SIGTERM / SIGUSR1 to this process: what SLURM sends), ``hang`` (sleep
  forever: a stuck collective or a dead NFS mount), ``exit`` (``os._exit(99)``), and ``spike``
  (the micro-batch holding train sample ``sample`` is replaced by the vocabulary's last two ids
  in turn, which the data never contains: the model has learned to rule them out, and with tied
  embeddings it favours repeating the input token, so the loss jumps, like a garbage batch);
- conditions: ``rank`` (the global RANK), ``attempt`` (torchrun's restart count, 0 on the first
  start), and any keyword the point passes (``step``, ``sample``).

With the variable unset, each call is one dictionary lookup: the points stay in the product
code at no cost.
"""

from __future__ import annotations

import os
import signal
import time
from functools import cache

__all__ = ["fire", "spike_samples", "corrupt_spiked"]

_VARIABLE = "BLOOMLINE_FAULTS"
_ACTIONS = ("kill", "term", "usr1", "hang", "exit", "spike")


@cache
def _parse(spec: str) -> tuple[tuple[str, str, dict[str, str]], ...]:
    faults = []
    for item in filter(None, (part.strip() for part in spec.split(";"))):
        head, *conditions = item.split(":")
        action, _, point = head.partition("@")
        if action not in _ACTIONS or not point:
            raise ValueError(f"{_VARIABLE}: {item!r}: expected ACTION@POINT with ACTION one of "
                             f"{', '.join(_ACTIONS)}")
        where = dict(condition.split("=", 1) for condition in conditions)
        faults.append((action, point, where))
    return tuple(faults)


def _faults() -> tuple[tuple[str, str, dict[str, str]], ...]:
    spec = os.environ.get(_VARIABLE)
    return _parse(spec) if spec else ()


def _holds(where: dict[str, str], context: dict) -> bool:
    here = {"rank": os.environ.get("RANK", "0"),
            "attempt": os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"),
            **{key: str(value) for key, value in context.items()}}
    return all(here.get(key) == value for key, value in where.items())


def fire(point: str, **context) -> None:
    """Carry out the faults configured for ``point`` whose conditions hold here."""
    for action, at, where in _faults():
        if at != point or action == "spike" or not _holds(where, context):
            continue
        # one write(2): ranks share the pipe, and the test reads which fault fired
        os.write(2, f"fault: {action}@{point} {context}\n".encode())
        if action == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        elif action in ("term", "usr1"):
            os.kill(os.getpid(), signal.SIGTERM if action == "term" else signal.SIGUSR1)
        elif action == "hang":
            while True:
                time.sleep(3600)
        elif action == "exit":
            os._exit(99)


def spike_samples() -> set[int]:
    """Train sample ids whose micro-batches the ``spike@batch`` faults corrupt (here)."""
    return {int(where["sample"]) for action, point, where in _faults()
            if action == "spike" and point == "batch"
            and _holds({k: v for k, v in where.items() if k != "sample"}, {})}


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
