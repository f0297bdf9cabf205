"""What every input format shares: sources, chunks, chunk sizes, the document collector, and
the :class:`Format` record each format module fills in.

A *source* is one input file or dataset folder with its format (or the part of one that a
``--shard`` owns). A *chunk* is a slice of a source small enough to tokenize in seconds;
chunks are numbered in input order and the output is their concatenation in that order.
A format answers four questions about its sources (see :class:`Format`): which names are
its own, how a source is cut into chunks, how a chunk becomes documents, and which part of a
source a ``--shard`` owns. :mod:`bloomline.dataprep.formats.registry` lists the formats.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from bloomline.common.errors import UserError

__all__ = [
    "DEFAULT_CHUNK_BYTES",
    "DEFAULT_MAX_DOCUMENT_BYTES",
    "MIN_CHUNK_BYTES",
    "BadInputError",
    "Chunk",
    "ChunkDocuments",
    "ChunkSizer",
    "DocumentCollector",
    "Format",
    "Source",
    "units_in_range",
]

DEFAULT_CHUNK_BYTES = 8 << 20
MIN_CHUNK_BYTES = 256 << 10
# The most bytes one line (one document) may hold. A tokenizer needs many times a text's size
# in memory: a 1 GB line made SentencePiece die with std::bad_alloc, killing the worker with
# no word of which line. Real documents (books, source files, articles) are far below this.
DEFAULT_MAX_DOCUMENT_BYTES = 64 << 20
_MAX_REPORTED = 5  # skipped-line messages kept per chunk for the final summary


@dataclass(frozen=True)
class Source:
    """One input: a file with a known format, or a dataset folder."""

    path: str
    format: str  # a name in formats.registry.FORMATS: "jsonl" | "txt" | "parquet" | "hf"
    compression: str | None = None
    size: int = 0  # bytes on disk, for progress and ETA
    # The part of the source to read (a --shard's part): bytes of an uncompressed line file,
    # row groups of a Parquet file, rows of a dataset folder; stop None = to the end.
    start: int = 0
    stop: int | None = None
    part_bytes: int | None = None  # the part's share of ``size`` (None: the whole source)

    @property
    def work_bytes(self) -> int:
        """On-disk bytes this source stands for in this job (its part's, when a part)."""
        return self.size if self.part_bytes is None else self.part_bytes


@dataclass
class Chunk:
    """A unit of tokenizing work; ``index`` is its place in the output.

    Attributes:
        kind: "lines" (``payload`` holds whole JSON or text lines), "range" (the lines of
            ``source.path`` that start at a byte in ``start:stop``), "parquet" (row groups
            ``groups`` of ``source.path``), "hf" (rows ``start:stop`` of a dataset folder) or
            "files" (``files``, one document each).
        first_line: 1-based line number of the first line of ``payload``; 0 while unknown
            (a "range" chunk; see :func:`~bloomline.dataprep.formats.lines.count_lines_before`).
        source_bytes: this chunk's share of the on-disk input, for progress and ETA.
    """

    index: int
    source: Source
    kind: str
    payload: bytes = b""
    first_line: int = 1
    groups: tuple[int, ...] = ()
    start: int = 0
    stop: int = 0
    files: tuple[str, ...] = field(default_factory=tuple)
    source_bytes: int = 0


class ChunkSizer:
    """How many input bytes the next chunk should take.

    ``max_bytes`` while plenty of work remains; then a quarter of each worker's share of what
    is left, so chunks taper off towards the end and all workers finish within a small chunk
    of each other instead of one worker tokenizing a last 8 MiB chunk alone. Small inputs get
    small chunks from the start, so every worker has work. Sizes change how work is shared,
    never the output.
    """

    def __init__(self, total_bytes: int, max_bytes: int = DEFAULT_CHUNK_BYTES,
                 workers: int = 1) -> None:
        self.remaining = total_bytes
        self.max_bytes = max_bytes
        self.min_bytes = min(MIN_CHUNK_BYTES, max_bytes)
        self.workers = workers

    def next_size(self) -> int:
        """Bytes for the next chunk."""
        share = self.remaining // (4 * self.workers)
        return int(min(self.max_bytes, max(self.min_bytes, share)))

    def consumed(self, num_bytes: int) -> None:
        """Account for a chunk handed out (its on-disk bytes)."""
        self.remaining -= num_bytes


class BadInputError(UserError):
    """A line, row or file of the input that cannot be turned into a document."""


@dataclass
class ChunkDocuments:
    """The documents of one chunk: ``texts[key][i]`` is document ``i`` for ``key``."""

    texts: dict[str, list[str]]
    num_skipped: int = 0
    skipped_messages: list[str] = field(default_factory=list)
    text_bytes: int = 0

    @property
    def num_documents(self) -> int:
        return len(next(iter(self.texts.values()))) if self.texts else 0


class DocumentCollector:
    """Where a format's reader puts a chunk's documents, and reports its bad lines.

    With ``skip_bad_lines`` a bad line is counted and skipped for all keys at once (the reader
    appends a document to every key or to none), so the outputs of several keys stay aligned
    document by document; without, the first bad line raises.
    """

    def __init__(self, keys: list[str], skip_bad_lines: bool,
                 max_document_bytes: int = DEFAULT_MAX_DOCUMENT_BYTES) -> None:
        self.docs = ChunkDocuments({key: [] for key in keys})
        self.skip_bad_lines = skip_bad_lines
        self.max_document_bytes = max_document_bytes

    def too_big(self, size: int) -> bool:
        """Whether a document of ``size`` bytes is over the limit (then :meth:`oversized`)."""
        return size > self.max_document_bytes

    def oversized(self, where: str, size: int, what: str = "line") -> None:
        """Report a ``what`` (line, file, value) of ``size`` bytes at ``where``, over the limit
        per document, as bad (see :meth:`bad`), before anything decodes or tokenizes it."""
        self.bad(f"{where}: a {what} of {size:,} bytes, over the limit of "
                 f"{self.max_document_bytes:,} bytes per document (--max-document-mb "
                 f"{self.max_document_bytes / (1 << 20):.3g}); split the document, raise "
                 "--max-document-mb where memory allows (a tokenizer needs many times a "
                 "document's size), or skip such lines with --skip-bad-lines")

    def bad(self, message: str) -> None:
        """Report a bad line, row or file (``FILE:LINE: what``).

        Raises:
            BadInputError: unless ``skip_bad_lines``.
        """
        if not self.skip_bad_lines:
            raise BadInputError(message)
        self.docs.num_skipped += 1
        if len(self.docs.skipped_messages) < _MAX_REPORTED:
            self.docs.skipped_messages.append(message)


def units_in_range(positions: Sequence[int], low: int, high: int) -> tuple[int, int]:
    """[first, stop) of the sorted ``positions`` in [low, high): the units a shard owns."""
    return bisect.bisect_left(positions, low), bisect.bisect_left(positions, high)


class Format:
    """One input format. Subclasses fill in what differs; the defaults suit a format whose
    files are read whole.

    Attributes:
        name: the ``Source.format`` of its sources.
        suffixes: file-name suffix -> compression (None: none), matched in this order.
    """

    name: str = ""
    suffixes: dict[str, str | None] = {}

    # -- which inputs are this format's ------------------------------------------------------
    def is_folder_of(self, path: Path) -> bool:
        """Whether the folder ``path`` is one source of this format (a dataset folder)."""
        return False

    def folder_source(self, path: Path) -> Source:
        """The source of a folder :meth:`is_folder_of` claimed."""
        raise NotImplementedError(self.name)

    def check_folder(self, path: Path) -> None:
        """Refuse, with one line, a folder about to be searched for inputs that this format
        knows cannot be read that way."""

    # -- cutting into chunks ------------------------------------------------------------------
    def groups_whole_files(self, txt_per_line: bool) -> bool:
        """Whether each file is one document, grouped with its neighbours into "files"
        chunks (by ``iter_chunks``) instead of cut by :meth:`chunks`."""
        return False

    def chunks(self, source: Source, sizer: ChunkSizer, next_index: int) -> Iterator[Chunk]:
        """The chunks of ``source`` (of its part), numbered from ``next_index``, each sized
        by ``sizer.next_size()`` at the time it is cut."""
        raise NotImplementedError(self.name)

    # -- documents ------------------------------------------------------------------------------
    def documents(self, chunk: Chunk, keys: list[str], out: DocumentCollector) -> None:
        """Put the texts of every document of ``chunk`` for every key into ``out``, in input
        order, naming every bad line as ``FILE:LINE: what`` (``FILE: row N: what``)."""
        raise NotImplementedError(self.name)

    # -- sharding ---------------------------------------------------------------------------------
    def shard_part(self, source: Source, begin: int, end: int | float,
                   txt_per_line: bool) -> Source | None:
        """The part of ``source`` whose units lie in ``[begin, end)`` of its on-disk bytes
        (see :mod:`bloomline.dataprep.sharding`), or None when it has none.

        The default is a whole-file unit, owned by the shard where the file starts."""
        return source if begin <= 0 < end else None
