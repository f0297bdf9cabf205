"""The loader's worker processes: started, tracked, shut down, and dead with the trainer.

Apart from the loader (``loader.py``, which decides what is read and in which order) because
this is process lifecycle, with rules of its own that any loader must keep: the workers ignore
the stop signals meant for the trainer, never outlive it however it dies, and never keep the
run folder's lock.

SLURM signals every process of a job step (and a terminal's Ctrl-C every process of the
foreground group), loader workers included: a worker that died of the SIGTERM, SIGUSR1 or
SIGINT meant for the trainer would fail the batch fetch before the checkpoint, so workers
ignore those three. That makes them immune to ``multiprocessing``'s own last resort, too: at
interpreter exit it SIGTERMs the daemonic children still alive and then joins them without a
timeout. A loader iterator still referenced then (by the traceback of the exception that ends
the run, say) has live workers, which wait for the trainer, which waits for them: the run
printed its traceback and hung. So the trainer shuts its iterators down itself
(``close_loader`` in the loop's ``finally``), an ``atexit`` hook does it for any iterator left
(registered after ``multiprocessing``'s and torch's, it runs before them), and a worker dies
with the trainer however the trainer dies (``init_worker``).
"""

from __future__ import annotations

import atexit
import importlib
import os
import signal
import weakref

from torch.utils.data import DataLoader

from bloomline.trainer.survival.run_folder import close_inherited_locks

__all__ = ["TrackedLoader", "close_loader", "init_worker"]

_LIVE: weakref.WeakSet = weakref.WeakSet()


class TrackedLoader(DataLoader):
    """A ``DataLoader`` whose multi-process iterators are tracked for ``close_loader``."""

    def __iter__(self):
        iterator = super().__iter__()
        if self.num_workers > 0:
            _LIVE.add(iterator)
        return iterator


def close_loader(iterator) -> None:
    """Stop the worker processes of a loader iterator now (None, a single-process iterator or
    one already closed: nothing to do). Torch's shutdown asks each worker to exit and waits
    up to 5 s; a worker still alive after that (stuck in a read) is SIGKILLed: it ignores
    SIGTERM."""
    if iterator is None or not hasattr(iterator, "_shutdown_workers"):
        return
    _LIVE.discard(iterator)
    workers = list(getattr(iterator, "_workers", ()))
    try:
        iterator._shutdown_workers()
    finally:
        for worker in workers:
            if worker.is_alive():
                try:
                    os.kill(worker.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                worker.join(timeout=5)


def _close_live_loaders() -> None:
    for iterator in list(_LIVE):
        close_loader(iterator)


# atexit runs its hooks last registered first: this one must come after multiprocessing's
# (the SIGTERM-and-join) and torch's (which makes its shutdown a no-op at exit)
importlib.import_module("multiprocessing.util")
importlib.import_module("torch.utils.data._utils")
atexit.register(_close_live_loaders)


def init_worker(worker_id: int) -> None:  # noqa: ARG001 - worker_init_fn signature
    """A loader worker ignores the stop signals meant for the trainer and dies with it.

    Death with the trainer: ``prctl(PR_SET_PDEATHSIG, SIGKILL)`` on Linux, rather than a
    parent-pid check. Torch's workers check their parent's pid already, but only between
    batches and every 5 s; the kernel's signal comes the moment the trainer dies however it
    dies (SIGKILL, the OOM killer, the watchdog's ``_exit``), also to a worker blocked in a
    read, and so also releases at once what the worker inherited with the fork: the run
    folder's lock (closed here as well) is held until every copy of its descriptor is closed,
    and a lingering worker would refuse the restart of a killed run. The signal follows the
    thread that started the worker: the trainer starts its loaders from the thread that runs
    the loop, which lives as long as the run. Elsewhere (macOS) torch's check remains."""
    for sig in (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT):
        signal.signal(sig, signal.SIG_IGN)

    close_inherited_locks()
    _die_with_parent()


def _die_with_parent() -> None:
    import multiprocessing

    parent = multiprocessing.parent_process()
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        pr_set_pdeathsig = 1
        if libc.prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0) != 0:
            return
    except (OSError, AttributeError):  # not Linux
        return
    if parent is not None and os.getppid() != parent.pid:  # the trainer died before prctl
        os._exit(1)
