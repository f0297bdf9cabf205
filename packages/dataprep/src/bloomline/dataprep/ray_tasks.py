"""``dataprep tokenize --ray [ADDRESS]``: the chunks as Ray tasks on a Ray cluster.

Mental model: exactly the local pipeline with Ray's scheduler in place of the process pool.
This process (the driver) cuts the inputs into chunks and splices finished chunk shards into
the output in chunk order; each chunk is a Ray task, run by any core of the cluster, that
tokenizes it and writes its shard into the job's scratch folder next to the output. So the
bytes are those of the local run, and what Ray adds is what we would otherwise write
ourselves: placing tasks on the nodes' cores, starting and reusing worker processes (the
tokenizer is loaded once per worker process, not once per task) and retrying a task whose
worker or node died (``max_retries``; a retry rewrites the same shard).

What moves: a task's arguments are a chunk descriptor (an uncompressed file's byte range: a
few numbers; a compressed file's decompressed lines: its text) and its result is a few
counts. Inputs, the tokenizer and the scratch folder must be on a filesystem every node sees
at the same path (the output folder's), as for the SLURM recipe; the tokens go from the task
to the shared filesystem and from there into the output once, in the splice.

A bad input line raises the same one-line ``FILE:LINE`` error as a local run: Ray does not
retry errors raised by the task itself, only deaths of its process.
"""

from __future__ import annotations

import logging
import os
import pickle
from collections.abc import Iterator

from bloomline.common.errors import UserError
from bloomline.dataprep.chunk_worker import init_worker, tokenize_chunk, worker_job

__all__ = ["ray_results_in_flight"]

# A task whose process or node dies is run again up to this many times (Ray's own retry).
MAX_RETRIES = 4


def _import_ray():
    try:
        import ray
    except ImportError:
        raise UserError("--ray: Ray is not installed; pip install 'bloomline-dataprep[ray]' "
                        "on every node of the cluster") from None
    return ray


def _run_chunk(job: str, init_blob: bytes, chunk):
    """The Ray task: set up this worker process for the job once, then tokenize the chunk.

    The init args travel pickled, as bytes: Ray hands a task its arguments deserialized, and
    unpickling a Tokenizer loads its file again (a few percent of a chunk's work:
    docs/perf/dataprep-tokenize.md), so only a worker process new to the job unpickles them.
    """
    if worker_job() != job:  # a new job (or a fresh worker process)
        init_worker(*pickle.loads(init_blob), ignore_sigint=False, job=job)
    return tokenize_chunk(chunk)


def _connect(ray, address: str, num_cpus: int) -> None:
    options = dict(logging_level=logging.WARNING, log_to_driver=True,
                   include_dashboard=False, configure_logging=True)
    if os.environ.get("BLOOMLINE_FAULTS"):
        # the survival tests' injected faults reach the tasks as they reach pool workers
        options["runtime_env"] = {"env_vars": {"BLOOMLINE_FAULTS":
                                               os.environ["BLOOMLINE_FAULTS"]}}
    try:
        if address == "local":
            # a fresh instance on this machine for this job, gone when the job ends
            ray.init(address="local", num_cpus=num_cpus, **options)
        else:
            options.pop("include_dashboard")
            ray.init(address=address, **options)
    except (ConnectionError, ValueError, RuntimeError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise UserError(f"--ray {address}: cannot connect to a Ray cluster ({first})") from None


def _cause(ray, err: Exception) -> Exception:
    """The exception a task raised, out of Ray's wrapper."""
    if isinstance(err, ray.exceptions.RayTaskError) and err.cause is not None:
        return err.cause
    return err


def ray_results_in_flight(chunks: Iterator, address: str, workers: int, init_args: tuple
                          ) -> Iterator:
    """Yield chunk results as Ray tasks finish them, keeping twice the cluster's cores busy.

    Args:
        chunks: the job's chunks, in order.
        address: "local" (start a Ray instance here with ``workers`` cores), "auto" (the
            cluster this node belongs to), or a cluster address (``HOST:PORT``,
            ``ray://HOST:PORT``).
        workers: cores of a "local" instance; ignored when joining a cluster.
        init_args: what each worker process needs once (see
            :func:`~bloomline.dataprep.chunk_worker.init_worker`).
    """
    ray = _import_ray()
    if ray.is_initialized():  # e.g. a caller's own session: use it, leave it running
        owned = False
    else:
        _connect(ray, address, workers)
        owned = True
    task = ray.remote(num_cpus=1, max_retries=MAX_RETRIES)(_run_chunk)
    pending: list = []
    try:
        cores = int(ray.cluster_resources().get("CPU", 1))
        in_flight = max(2, 2 * cores)
        # sent to each node once, not with every task; the scratch folder names the job
        job, shared = init_args[-1], ray.put(pickle.dumps(init_args))

        def fill() -> None:
            while len(pending) < in_flight:
                chunk = next(chunks, None)
                if chunk is None:
                    return
                pending.append(task.remote(job, shared, chunk))

        fill()
        while pending:
            done, still = ray.wait(pending, num_returns=1)
            pending[:] = still
            try:
                yield ray.get(done[0])
            except ray.exceptions.RayTaskError as err:
                cause = _cause(ray, err)
                if isinstance(cause, (UserError, OSError)):
                    # a bad input line (the task's one-line message), a full disk (named by
                    # tokenize_corpus as for local workers)
                    raise cause from None
                raise
            except ray.exceptions.WorkerCrashedError:
                raise UserError(f"--ray: a chunk's worker died {MAX_RETRIES + 1} times (killed, "
                                "or out of memory); rerun with a smaller --chunk-mb") from None
            except ray.exceptions.NodeDiedError:
                raise UserError(f"--ray: a chunk's node died {MAX_RETRIES + 1} times; check "
                                "the cluster (`ray status`)") from None
            fill()
    finally:
        # On error or Ctrl-C: stop the queued and running tasks and wait until none is left
        # writing into the scratch folder, which the caller then removes.
        for ref in pending:
            ray.cancel(ref, force=True)
        if pending:
            ray.wait(pending, num_returns=len(pending), timeout=60)
        if owned:
            ray.shutdown()
