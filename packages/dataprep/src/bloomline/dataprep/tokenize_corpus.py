"""``dataprep tokenize``: raw corpora to ``.bin``/``.idx`` token files on every core.

Mental model::

    main process:   inputs -> chunks (numbered, in input order) --submit--> worker pool
    worker i:       chunk -> documents -> token ids -> its own shard (a small .bin/.idx)
                    (chunk_worker.py, the same code for pool workers and Ray tasks)
    main process:   shards appended to the output in chunk order as soon as they are ready

No single process writes every token through Python: each worker writes its shards, and the
main process only splices finished shards into the output with in-kernel copies while the
workers go on. The output is the concatenation of chunks in input order, so its bytes do not
depend on the number of workers. At most ``2 * workers`` chunks are in flight, so memory is
bounded however big the corpus is, and no per-document Python list outlives its chunk.

Stopping: everything a run writes before it succeeds lives in one hidden scratch folder next
to the outputs, ``.NAME.XXXXXXXX.partial`` (the workers' shards and the outputs' temporary
files), locked by the run (``flock``) while it lives. SIGINT and SIGTERM make the main process
kill the workers, remove the scratch folder and exit with one line (130 / 143); a full disk
is one line naming the output. Workers die with the main process (``PR_SET_PDEATHSIG``), so
``kill -9`` leaves no orphan writing on; what it leaves, the next run of the same output
removes: scratch folders of exactly that name pattern whose lock no live run holds.

Beyond one machine, the same pieces run on an engine the cluster already has:

- ``--ray [ADDRESS]`` (:mod:`bloomline.dataprep.ray_tasks`): the chunks become Ray tasks on
  the cluster's cores instead of local worker processes; the splice stays here, so the bytes
  are the same.
- ``--shard K/N`` (:mod:`bloomline.dataprep.sharding`): this run does the K-th of N parts of
  the inputs (one SLURM array task per part), and ``dataprep merge`` of the parts in order
  writes the single run's bytes.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import multiprocessing
import os
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from pathlib import Path

from bloomline.common import faults
from bloomline.common.atomic import check_can_write
from bloomline.common.errors import UserError
from bloomline.common.progress import BYTES, Counter, Progress
from bloomline.common.stop_signals import StoppedError, StopSignals, Terminated
from bloomline.dataprep.chunk_worker import (
    ChunkResult,
    init_worker,
    stop_signals_blocked,
    tokenize_chunk,
)
from bloomline.dataprep.documents import DEFAULT_MAX_DOCUMENT_BYTES
from bloomline.dataprep.fingerprint import fingerprint_path, write_fingerprint
from bloomline.dataprep.indexed_dataset import IndexedDatasetWriter
from bloomline.dataprep.ray_tasks import ray_results_in_flight
from bloomline.dataprep.sharding import (
    empty_part_warning,
    shard_record_path,
    shard_sources,
    write_shard_record,
)
from bloomline.dataprep.sources import DEFAULT_CHUNK_BYTES, Chunk, expand_inputs, iter_chunks
from bloomline.dataprep.tokenizer import load_tokenizer

__all__ = [
    "TokenizeSummary",
    "output_prefix",
    "output_prefixes",
    "tokenize_corpus",
]


@dataclass
class TokenizeSummary:
    """What a tokenize run wrote. Counts are per key where keys differ."""

    outputs: dict[str, str]
    num_documents: int = 0
    num_tokens: dict[str, int] = field(default_factory=dict)
    num_empty: dict[str, int] = field(default_factory=dict)
    num_skipped: int = 0
    skipped_messages: list[str] = field(default_factory=list)
    text_bytes: int = 0
    seconds: float = 0.0

    def add(self, result: ChunkResult) -> None:
        self.num_documents += result.num_documents
        self.num_skipped += result.num_skipped
        self.text_bytes += result.text_bytes
        room = 10 - len(self.skipped_messages)
        self.skipped_messages.extend(result.skipped_messages[: max(room, 0)])
        for key in self.outputs:
            self.num_tokens[key] = self.num_tokens.get(key, 0) + result.num_tokens[key]
            self.num_empty[key] = self.num_empty.get(key, 0) + result.num_empty[key]

    def for_output(self, key: str) -> TokenizeSummary:
        """The summary of one output (the token counts of its key only)."""
        return TokenizeSummary(
            {key: self.outputs[key]}, self.num_documents, {key: self.num_tokens.get(key, 0)},
            {key: self.num_empty.get(key, 0)}, self.num_skipped, self.skipped_messages,
            self.text_bytes, self.seconds)

    def format(self) -> str:
        """A human summary, one line per output plus the totals."""
        secs = max(self.seconds, 1e-9)
        lines = []
        for key, prefix in self.outputs.items():
            lines.append(f"wrote {prefix}.bin/.idx: {self.num_documents:,} documents, "
                         f"{self.num_tokens.get(key, 0):,} tokens, "
                         f"{self.num_empty.get(key, 0):,} empty documents")
        total_tokens = sum(self.num_tokens.values())
        lines.append(
            f"{self.num_skipped:,} skipped lines | {self.seconds:.1f} s | "
            f"{self.num_documents / secs:,.0f} docs/s | {self.text_bytes / secs / 1e6:.2f} MB/s | "
            f"{total_tokens / secs:,.0f} tokens/s")
        return "\n".join(lines)


def output_prefix(output: str) -> str:
    """The prefix of a token file pair given as ``corpus/NAME``, ``corpus/NAME.bin`` or
    ``corpus/NAME.idx`` (the writer names the pair so; the fingerprint and shard records and
    the messages must agree)."""
    for suffix in (".bin", ".idx"):
        if output.endswith(suffix) and len(Path(output).name) > len(suffix):
            return output[: -len(suffix)]
    return output


def _check_some_tokens(summary: TokenizeSummary, tokenizer, is_part: bool) -> None:
    """Refuse to write an output of zero tokens: a tokenizer that encodes nothing (every
    document empty), or inputs with no document (all blank, or every line skipped); a
    ``--shard`` part may be empty (more parts than lines), its documents may not."""
    for key, prefix in summary.outputs.items():
        if summary.num_tokens.get(key, 0):
            continue
        if summary.num_documents:
            raise UserError(
                f"{tokenizer.spec}: the tokenizer encoded all {summary.num_documents:,} "
                f"documents of {prefix} into 0 tokens; check --tokenizer (and --json-key)")
        if not is_part:
            skipped = (f" ({summary.num_skipped:,} bad lines skipped)"
                       if summary.num_skipped else "")
            raise UserError(f"{prefix}: the inputs hold no documents{skipped}; nothing to "
                            "tokenize, check the INPUTs and --json-key")


def output_prefixes(output: str, keys: list[str]) -> dict[str, str]:
    """``corpus/NAME`` for one key; ``corpus/NAME_KEY`` for each of several keys."""
    if len(keys) == 1:
        return {keys[0]: output}
    return {key: f"{output}_{key}" for key in keys}


# The exit status of a worker that stopped because it was running the parent's main script
# again (_stop_if_reimporting_main); any status no worker has otherwise would do.
_MAIN_REIMPORT_EXIT = 86
# ...and the file such a worker creates first, named by the parent in this variable (which
# spawned workers inherit): the pool's record of its workers' exit statuses can be cleared
# by its management thread before the parent reads it, the file cannot.
_MAIN_REIMPORT_MARK = "BLOOMLINE_TOKENIZE_REIMPORT_MARK"


def _stop_if_reimporting_main() -> None:
    """Exit at once, with :data:`_MAIN_REIMPORT_EXIT`, when called in a worker process that is
    still importing the parent's main script.

    The spawn start method runs the main script again in every worker (as ``__mp_main__``).
    A script that calls :func:`tokenize_corpus` without an ``if __name__ == "__main__":``
    guard so calls it again in each worker, where it would start a pool of its own (which
    multiprocessing refuses with a page of traceback); the parent would only see its workers
    die. Exiting with a status of our own lets the parent say what happened.
    """
    # multiprocessing's own sign of a process still bootstrapping (what it checks before
    # refusing to start a process there)
    if getattr(multiprocessing.current_process(), "_inheriting", False):
        mark = os.environ.get(_MAIN_REIMPORT_MARK)
        if mark:
            with contextlib.suppress(OSError):
                Path(mark).touch()
        os._exit(_MAIN_REIMPORT_EXIT)  # not SystemExit: the script may catch that


def _main_guard_error() -> UserError:
    main = sys.modules.get("__main__")
    script = getattr(main, "__file__", None) or "the main script"
    return UserError(
        f"tokenize: the worker processes ran {script} again and it called tokenize_corpus "
        "again (the spawn start method imports the main script in every worker): put the "
        'code that calls it under `if __name__ == "__main__":`')


def _worker_exit_codes(pool: ProcessPoolExecutor) -> list[int | None]:
    """Exit statuses of the pool's processes (None: still running), once they are reaped."""
    processes = list((getattr(pool, "_processes", None) or {}).values())
    for process in processes:
        with contextlib.suppress(Exception):
            process.join(timeout=5)
    return [getattr(process, "exitcode", None) for process in processes]


def _results_in_flight(chunks: Iterator[Chunk], workers: int, init_args: tuple
                       ) -> Iterator[ChunkResult]:
    """Yield chunk results as workers finish them, keeping at most 2 * workers queued."""
    if workers == 1:
        previous = os.environ.get("TOKENIZERS_PARALLELISM")
        try:
            init_worker(*init_args, ignore_sigint=False)
            for chunk in chunks:
                yield tokenize_chunk(chunk)
        finally:  # this process is the caller's: leave its setting as it was
            if previous is None:
                os.environ.pop("TOKENIZERS_PARALLELISM", None)
            else:
                os.environ["TOKENIZERS_PARALLELISM"] = previous
        return
    # spawn, not fork: the parent may hold threads (zstd, arrow) that fork would copy locked.
    context = multiprocessing.get_context("spawn")
    pool = ProcessPoolExecutor(workers, mp_context=context, initializer=init_worker,
                               initargs=(*init_args, True, os.getpid()))
    pending: set[Future] = set()
    finished = False
    marks = tempfile.TemporaryDirectory(prefix="bloomline-tokenize-")
    mark = os.path.join(marks.name, "main-reimported")
    previous_mark = os.environ.get(_MAIN_REIMPORT_MARK)
    os.environ[_MAIN_REIMPORT_MARK] = mark  # the workers start at the first submits

    def fill() -> None:
        while len(pending) < 2 * workers:
            chunk = next(chunks, None)
            if chunk is None:
                return
            pending.add(pool.submit(tokenize_chunk, chunk))

    try:
        with stop_signals_blocked():
            fill()  # the pool starts its processes on the first submits
        while pending:
            done, still_running = wait(pending, return_when=FIRST_COMPLETED)
            pending.clear()
            pending.update(still_running)
            for future in done:
                yield future.result()  # re-raises a worker's BadInputError here
            fill()
        finished = True
    except BrokenProcessPool:
        # raised by result() or by submit(), whichever notices first
        if os.path.exists(mark) or _MAIN_REIMPORT_EXIT in _worker_exit_codes(pool):
            raise _main_guard_error() from None
        raise UserError("tokenize: a worker process died (killed, or out of memory); rerun "
                        "with fewer --workers, a smaller --chunk-mb or a lower "
                        "--max-document-mb") from None
    finally:
        # On error, Ctrl-C or SIGTERM: kill the workers (a chunk may take long, or hang) and
        # wait for them, then the caller removes the scratch folder: no worker is left
        # writing into it.
        if not finished:
            _kill_workers(pool)
        pool.shutdown(wait=True, cancel_futures=True)
        if previous_mark is None:
            os.environ.pop(_MAIN_REIMPORT_MARK, None)
        else:
            os.environ[_MAIN_REIMPORT_MARK] = previous_mark
        marks.cleanup()


def _kill_workers(pool: ProcessPoolExecutor) -> None:
    """SIGKILL every worker of ``pool`` and reap it (they ignore SIGINT and SIGTERM)."""
    kill = getattr(pool, "kill_workers", None)  # Python 3.14
    if kill is not None:
        kill()
        return
    processes = list((getattr(pool, "_processes", None) or {}).values())
    for process in processes:
        with contextlib.suppress(Exception):
            process.kill()
    for process in processes:
        with contextlib.suppress(Exception):
            process.join()


def _tokenize_into(writers: dict[str, IndexedDatasetWriter], sources, max_chunk_bytes: int,
                   txt_per_line: bool, workers: int, init_args: tuple,
                   ray_address: str | None, summary: TokenizeSummary,
                   progress: Progress) -> None:
    """Tokenize every chunk (on the workers, or Ray) and splice the shards into ``writers``
    in chunk order."""
    chunks = iter(iter_chunks(sources, max_chunk_bytes, txt_per_line, workers))
    ready: dict[int, ChunkResult] = {}
    next_index = 0
    if ray_address is not None:
        results = ray_results_in_flight(chunks, ray_address, workers, init_args)
    else:
        results = _results_in_flight(chunks, workers, init_args)
    # closing(): an exception raised here, outside the generator (Ctrl-C while splicing),
    # must still run its cleanup, which stops every worker writing into the scratch folder,
    # before that folder is removed. Left to the garbage collector, it ran after the removal,
    # and a late shard recreated the folder.
    with contextlib.closing(results):
        for result in results:
            ready[result.index] = result
            # Splice finished shards into the outputs in chunk order, while workers go on.
            while next_index in ready:
                done = ready.pop(next_index)
                faults.fire("splice", chunk=done.index)  # (a full disk, in the survival tests)
                for key, writer in writers.items():
                    writer.add_index(done.shards[key])
                    for suffix in (".bin", ".idx"):
                        Path(done.shards[key] + suffix).unlink()
                summary.add(done)
                progress.update(docs=done.num_documents, text_bytes=done.text_bytes,
                                tokens=sum(done.num_tokens.values()),
                                source_bytes=done.source_bytes)
                next_index += 1


# A write that fills the disk or the quota: one line naming the output, not a traceback.
_DISK_FULL = (errno.ENOSPC, errno.EDQUOT)
# The scratch folder of output NAME: ``.NAME.`` + tempfile's 8 random characters + ``.partial``
_SCRATCH_RANDOM = "[a-z0-9_]{8}"
_SCRATCH_LOCK = "lock"


@contextlib.contextmanager
def _scratch_folder(out_dir: Path, name: str) -> Iterator[Path]:
    """The run's private scratch folder ``OUT_DIR/.NAME.XXXXXXXX.partial``, locked while the
    run lives and removed on exit whatever happens; stale ones of NAME (left by ``kill -9``, a
    power cut) are removed first.

    Everything the run writes before it succeeds goes inside (shards, the outputs' temporary
    files), so one folder is all a killed run can leave behind. The lock (``flock`` on
    ``lock`` inside, released by the kernel when the process dies) tells a live run's folder
    from a dead one's, also on a filesystem shared by several machines.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    removed = _remove_stale_scratch(out_dir, name)
    if removed:
        print(f"note: removed {len(removed)} partial folder(s) of an earlier {name} run that "
              f"was killed: {', '.join(removed)}", file=sys.stderr)
    while True:
        scratch = Path(tempfile.mkdtemp(prefix=f".{name}.", suffix=".partial", dir=out_dir))
        lock = _lock_scratch(scratch, wait=True)
        if lock is not None:
            break  # else another run's cleanup took it between mkdtemp and the lock: again
    try:
        yield scratch
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        os.close(lock)


def _lock_scratch(scratch: Path, wait: bool) -> int | None:
    """The descriptor holding ``scratch``'s lock, or None when another process holds it (not
    ``wait``) or the folder was removed meanwhile.

    The lock file is created by whoever comes first (a run, or a cleanup looking at a folder
    whose run died before it made one); the inode check catches a lock taken on a file that
    a cleanup removed meanwhile, so at most one process holds the folder's live lock.
    """
    path = scratch / _SCRATCH_LOCK
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except (FileNotFoundError, NotADirectoryError):
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
        held, now = os.fstat(fd), os.stat(path)
        if (held.st_dev, held.st_ino) == (now.st_dev, now.st_ino):
            return fd
    except (BlockingIOError, FileNotFoundError):
        pass
    os.close(fd)
    return None


def _remove_stale_scratch(out_dir: Path, name: str) -> list[str]:
    """Remove the scratch folders of output ``name`` that no live run holds; their names.

    Only folders named exactly ``.NAME.XXXXXXXX.partial`` (``XXXXXXXX`` as ``mkdtemp`` makes
    them) are looked at: other outputs' (``.NAME.more.XXXXXXXX.partial``, ``.NAMEx...``), the
    writer's and the index cache's temporary names never match, and a folder whose lock is
    held belongs to a run still going.
    """
    pattern = re.compile(rf"\.{re.escape(name)}\.{_SCRATCH_RANDOM}\.partial")
    removed = []
    with os.scandir(out_dir) as entries:
        candidates = [Path(entry.path) for entry in entries if pattern.fullmatch(entry.name)
                      and entry.is_dir(follow_symlinks=False)]
    for folder in candidates:
        lock = _lock_scratch(folder, wait=False)
        if lock is None:
            continue  # a live run's
        try:
            shutil.rmtree(folder, ignore_errors=True)
        finally:
            os.close(lock)
        removed.append(folder.name)
    return removed


def tokenize_corpus(
    inputs: list[str],
    tokenizer_path: str,
    output: str,
    keys: list[str] | tuple[str, ...] = ("text",),
    workers: int = 1,
    append_eod: bool = True,
    overwrite: bool = False,
    skip_bad_lines: bool = False,
    txt_per_line: bool = False,
    max_chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    show_progress: bool = True,
    eod_token: str | None = None,
    shard: tuple[int, int] | None = None,
    ray_address: str | None = None,
    max_document_bytes: int = DEFAULT_MAX_DOCUMENT_BYTES,
) -> TokenizeSummary:
    """Tokenize ``inputs`` into ``output.bin/.idx`` (or ``output_KEY`` per key).

    ``max_chunk_bytes`` caps the input bytes per unit of work (see
    :class:`~bloomline.dataprep.sources.ChunkSizer`); it changes only how work is shared,
    never the output bytes.

    ``shard=(K, N)`` tokenizes only the K-th of N parts of the inputs (see
    :mod:`~bloomline.dataprep.sharding`) and records it in ``output.shard.json``.
    ``ray_address`` runs the chunks as tasks on that Ray cluster ("local": a Ray instance
    started here for this job; see :mod:`~bloomline.dataprep.ray_tasks`); ``workers`` is
    then the number of cores of a local instance. A line (file, value) of more than
    ``max_document_bytes`` is a bad line (named, or skipped with ``skip_bad_lines``).
    ``output`` may end in ``.bin`` or ``.idx``: that is the pair's prefix without it.

    With ``workers > 1`` the workers are started with the spawn method, which imports the
    caller's main script in each of them: a script must call this under
    ``if __name__ == "__main__":`` (one that does not gets an error saying so).

    Raises:
        UserError: for bad input (named by file and line), a bad tokenizer model, outputs
            that exist without ``overwrite``, or a calling script without the main guard.
            Nothing is left under the output names then.
    """
    _stop_if_reimporting_main()
    keys = list(keys)
    if not keys or len(set(keys)) != len(keys):
        raise UserError(f"--json-key {keys}: give one or more distinct keys")
    if workers < 1:
        raise UserError(f"--workers {workers}: must be at least 1")
    if max_document_bytes < 1:
        raise UserError(f"--max-document-mb: {max_document_bytes} bytes; must be positive")
    output = output_prefix(output)
    if output.endswith(("/", os.sep)) or Path(output).is_dir():
        raise UserError(f"--output {output}: a folder; give a file prefix like corpus/NAME")
    outputs = output_prefixes(output, keys)
    check_can_write([f"{p}{s}" for p in outputs.values() for s in (".bin", ".idx")], overwrite)
    all_sources = expand_inputs(inputs)
    sources = all_sources if shard is None else shard_sources(all_sources, *shard, txt_per_line)
    total_bytes = sum(s.work_bytes for s in sources)
    tokenizer = load_tokenizer(tokenizer_path, eod_token)
    if append_eod:
        tokenizer.eod_id  # noqa: B018 - raises the one-line error before any work
    summary = TokenizeSummary(outputs)
    progress = Progress(
        "tokenize",
        [Counter("docs", "docs"), Counter("text_bytes", BYTES), Counter("tokens", "tokens")],
        total=total_bytes or None, total_key="source_bytes",
        enabled=show_progress)
    out_dir = Path(output).parent
    started = time.time()
    try:
        with StopSignals() as stop, _scratch_folder(out_dir, Path(output).name) as scratch:
            writers = {key: IndexedDatasetWriter(prefix, tokenizer.token_dtype,
                                                 overwrite=overwrite, temporary_dir=scratch)
                       for key, prefix in outputs.items()}
            try:
                _tokenize_into(writers, sources, max_chunk_bytes, txt_per_line, workers,
                               (tokenizer, keys, append_eod, skip_bad_lines,
                                max_document_bytes, str(scratch)),
                               ray_address, summary, progress)
                _check_some_tokens(summary, tokenizer, shard is not None)
                stop.hold()  # past the point of no return: the outputs go into place now
                for prefix in outputs.values():  # an overwritten output's records go first
                    fingerprint_path(prefix).unlink(missing_ok=True)
                    shard_record_path(prefix).unlink(missing_ok=True)
                for writer in writers.values():
                    writer.finalize()
                for prefix in outputs.values():
                    write_fingerprint(prefix, tokenizer, append_eod)
            except BaseException:
                stop.hold()  # a second signal must not cut the cleanup short
                for writer in writers.values():
                    writer.abort()
                raise
    except Terminated:
        raise StoppedError(
            f"tokenize: stopped by SIGTERM; removed the partial files of {output} (nothing "
            "was written)") from None
    except OSError as error:
        if error.errno not in _DISK_FULL:
            raise
        free = shutil.disk_usage(out_dir).free if out_dir.is_dir() else 0
        raise UserError(
            f"{next(iter(outputs.values()))}.bin: {error.strerror} while writing the token "
            f"files ({free / 1e6:,.1f} MB free in {out_dir}); removed the partial files, "
            "free space and rerun") from None
    progress.close()
    summary.seconds = progress.elapsed
    if shard is not None and not summary.num_documents and not summary.num_skipped:
        print(empty_part_warning(all_sources, *shard, txt_per_line), file=sys.stderr)
    if shard is not None:  # last: its presence says the part is complete
        for key, prefix in outputs.items():
            write_shard_record(prefix, *shard, all_sources, sources, summary.for_output(key),
                               started, workers)
    return summary
