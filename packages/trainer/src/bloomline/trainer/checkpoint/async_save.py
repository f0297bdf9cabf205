"""Asynchronous checkpoints: the training thread stalls only while the state is copied to
host memory; writing, hashing, the manifest, the rename and the pruning happen in a
background thread while training goes on.

How (torch 2.13): ``torch.distributed.checkpoint.async_save`` stages the state dict (a copy
in CPU memory, made in the calling thread before it returns) and runs DCP's ``save`` on the
copy in a thread of its own; our finalization (``save.finish_save``) runs in one more
thread that waits for that write. Both run collectives: DCP's planning and metadata exchange,
our hashing and barrier. They use a gloo group made for this (as torchtitan does): the default
group belongs to the training thread, whose collectives would otherwise interleave with the
background ones in another order on each rank (a hang or garbled data), and on GPUs the
default group is NCCL, which DCP's CPU-side staging cannot use.

One save in flight: ``save`` first waits for the previous one, so staging buffers and
partial folders never pile up. A crash (SIGKILL) before the manifest leaves only a
``.step_N.partial`` folder: ``latest_checkpoint`` never returns it and the next save removes it.

A save that fails in the background (a full disk) removes its partial folder there
(``failure.py``) and its error reaches the training thread at the next step
(``raise_if_failed``, which the loop calls every step), or at ``save`` / ``wait``, as one
``UserError`` line: the run stops instead of training on without checkpoints.

Without a process group, ``async_save`` works as it is (checked on torch 2.13: it saves in
one process, as ``save`` does), so the same path serves one process and many.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp

from bloomline.trainer.checkpoint.dcp_state import saved_state_dict
from bloomline.trainer.checkpoint.failure import failed_save
from bloomline.trainer.checkpoint.layout import PendingSave
from bloomline.trainer.checkpoint.save import begin_save, finish_save

__all__ = ["AsyncCheckpointer"]


class AsyncCheckpointer:
    """Checkpoints written in the background while training goes on.

    Every rank makes one (its constructor creates a process group, which is collective) and
    calls ``save`` at the same steps, and ``wait`` or ``close`` before the job ends.

    Args:
        run_dir: The run folder; checkpoints go to ``run_dir/checkpoints``.
        keep_last: Complete checkpoints to keep (older ones are deleted after each save).
        is_writer: Whether this rank writes the small files and the manifest (rank 0).
    """

    def __init__(self, run_dir: str | Path, keep_last: int, is_writer: bool = True) -> None:
        self.run_dir = Path(run_dir)
        self.keep_last = keep_last
        self.is_writer = is_writer
        self._group = None
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            self._group = torch.distributed.new_group(backend="gloo")
        # one worker: finalizations run in save order, one at a time
        self._executor = ThreadPoolExecutor(max_workers=1,
                                            thread_name_prefix="bloomline-checkpoint")
        self._in_flight: Future | None = None

    def save(self, step: int, model, optimizer, trainer_state: dict, config) -> Path:
        """Start checkpoint ``step``; return once its state is copied (training may go on and
        change the model). Waits for the previous save first.

        Returns:
            The folder the checkpoint will have once complete (see ``wait``).

        Raises:
            Exception: The previous save failed (its error, re-raised here).
        """
        self.wait()
        pending = begin_save(self.run_dir, step, trainer_state, config, self.keep_last,
                             self.is_writer)
        with failed_save(pending):  # the staging copy, in this thread
            written = dcp.async_save(saved_state_dict(model, optimizer),
                                     checkpoint_id=str(pending.partial),
                                     process_group=self._group)
        self._in_flight = self._executor.submit(self._finish, written, pending)
        return pending.final

    def _finish(self, written: Future, pending: PendingSave) -> Path:
        with failed_save(pending):
            written.result()  # every rank's tensors are on disk (DCP's write ends collectively)
            return finish_save(pending, self._group)

    def raise_if_failed(self) -> None:
        """Raise the error of a save that failed in the background, if one did (cheap: the
        training loop calls it every step); a save still running or complete: nothing.

        Raises:
            Exception: The failed save's error (a ``UserError`` for a full disk).
        """
        if self._in_flight is not None and self._in_flight.done() \
                and self._in_flight.exception() is not None:
            self.wait()

    @property
    def in_flight(self) -> bool:
        """Whether a save has started and is not complete yet (``wait`` would block)."""
        return self._in_flight is not None and not self._in_flight.done()

    def wait(self) -> Path | None:
        """Block until the save in flight is complete (manifest written, folder renamed, old
        checkpoints pruned); return its folder, or None when none was in flight.

        Raises:
            Exception: The save failed in the background (its error).
        """
        if self._in_flight is None:
            return None
        future, self._in_flight = self._in_flight, None
        return future.result()

    def close(self) -> Path | None:
        """``wait``, then stop the background thread; returns what ``wait`` returned."""
        try:
            return self.wait()
        finally:
            self._executor.shutdown(wait=True)

    def __enter__(self) -> AsyncCheckpointer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
