"""Run a function in N local CPU processes joined by gloo, the way torchrun would start them.

``run_distributed(nproc, fn, *args)`` sets RANK / LOCAL_RANK / WORLD_SIZE / LOCAL_WORLD_SIZE /
MASTER_ADDR / MASTER_PORT for each spawned process, calls ``fn(*args)`` there, and returns the
list of the values each rank returned, in rank order. Contract:

- ``fn`` and ``args`` must be picklable by reference (``fn`` defined at a module's top level);
  the return values must be picklable and are passed back as plain pickles, never as
  shared-memory tensor handles (those die with the child before the parent opens them);
- each rank runs with one torch thread, so that N ranks on a few cores do not oversubscribe;
- each rank sees the caller's ``os.environ``, ``sys.path`` and working directory as they are
  at the call, although it is forked from a server process started at the first call (below);
- a failure on any rank raises ``AssertionError`` here with that rank's traceback, and the
  other ranks are killed (they are likely blocked in a collective with the failed one);
- a hang is cut after ``timeout`` seconds per awaited result;
- a rank that initialized a process group has it destroyed before exiting.

Why a server process: started fresh, every rank spent seconds importing torch, its
distributed packages and the trainer before calling ``fn``, most of a small run's time. The
ranks are forked from multiprocessing's forkserver, which imports them once per calling
process (``_PRELOAD``) and is single-threaded Python when it forks, as spawn's fresh
interpreter would be (torch's DataLoader forks the same way).

Why a product module: the multi-process tests and the parallelism benchmarks start ranks the
same way, and neither should import the other's code.
"""

from __future__ import annotations

import os
import pickle
import socket
import traceback

import torch.multiprocessing as mp

__all__ = ["forkserver_context", "free_port", "run_distributed"]

# imported once by the forkserver, inherited by every rank it forks: the trainer's loop pulls in
# torch.distributed's pipelining, tensor and checkpoint packages (and through them dynamo)
_PRELOAD = ["torch", "torch.distributed", "bloomline.trainer.loop"]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the OS picks it)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _worker(rank: int, nproc: int, port: int, environ: dict, call: bytes, queue) -> None:
    # the forkserver's environment is the caller's of the first call, not of this one
    os.environ.clear()
    os.environ.update(environ)
    os.environ.update({"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(nproc),
                       "LOCAL_WORLD_SIZE": str(nproc), "MASTER_ADDR": "127.0.0.1",
                       "MASTER_PORT": str(port)})
    import torch

    # nproc processes share a few cores: one thread each keeps them from oversubscribing
    torch.set_num_threads(1)
    try:
        # plain pickle: torch's queue would pass tensors as shared-memory handles, which die
        # with this process before the parent opens them
        fn, args = pickle.loads(call)
        queue.put((rank, True, pickle.dumps(fn(*args))))
    except BaseException:  # noqa: BLE001 - reported to the parent with the traceback
        queue.put((rank, False, traceback.format_exc()))
    finally:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()


def forkserver_context():
    """multiprocessing's forkserver context, its server importing torch, torch.distributed and
    the trainer once (``_PRELOAD``): processes started from it begin with them imported. Also
    for other one-shot workers that need a fresh process per task (``trainer plan``'s
    traced ranks)."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(_PRELOAD)  # takes effect when the server starts (first call)
    return ctx


def run_distributed(nproc: int, fn, *args, timeout: float = 600.0) -> list:
    """``[fn(*args) on rank 0, ..., on rank nproc - 1]``, each rank a forked process (see the
    module docstring for the contract)."""
    ctx = forkserver_context()
    queue = ctx.Queue()
    port = free_port()
    # pickled here, loaded in the rank after its environment is the caller's: an import that
    # unpickling ``fn`` triggers then sees the caller's variables
    call = pickle.dumps((fn, args))
    environ = dict(os.environ)
    procs = [ctx.Process(target=_worker, args=(rank, nproc, port, environ, call, queue))
             for rank in range(nproc)]
    for proc in procs:
        proc.start()
    results: dict[int, object] = {}
    errors = []
    try:
        for _ in range(nproc):
            rank, ok, value = queue.get(timeout=timeout)
            if ok:
                results[rank] = pickle.loads(value)
            else:
                errors.append(f"rank {rank}:\n{value}")
                break  # the others are likely blocked in a collective with the failed rank
    finally:
        for proc in procs:
            proc.join(timeout=5 if errors else timeout)
            if proc.is_alive():
                proc.kill()
    if errors:
        raise AssertionError("distributed run failed on " + "\n".join(errors))
    return [results[rank] for rank in range(nproc)]
