"""``--shard K/N``: a deterministic split of a tokenize job into N parts, and the checks that
the parts merge back into exactly the single-machine output.

Mental model: lay the inputs end to end in argument order, a line of ``total`` on-disk
bytes. Shard ``K`` owns the positions ``[K * total // N, (K + 1) * total // N)`` (the last
shard also owns everything after). Every unit of work has one position, so it falls in exactly
one shard:

- a line of an uncompressed ``.jsonl``/``.txt``: the byte where the line starts;
- a Parquet row group: its file's offset plus its share of the file's compressed bytes;
- a row of a ``save_to_disk`` folder: its file's offset plus its share of the folder's bytes;
- a compressed file (``.zst``, ``.gz``) or a one-document ``.txt`` file: where it starts.

A shard's units are contiguous in input order, so shard 0's output, then shard 1's, ...,
is the single run's document sequence, and ``dataprep merge`` of the parts in shard order
writes exactly the single run's bytes (the ``.bin`` is the tokens in document order and the
``.idx`` is a function of the document lengths). Nothing is read to make the plan beyond
file sizes and Parquet / dataset metadata, so every shard computes the same plan on its own.

Why compressed files are not cut: a ``.zst``/``.gz`` stream cannot be entered in the middle,
so a shard owning its second half would decompress the first half to find its place, and the
cut would depend on the decompressor's buffering. Such a file goes whole to one shard; a
corpus of a few huge compressed files balances only as well as its files do (many files of
moderate size, the norm for web corpora, balance well).

Each part records what it covers in ``PREFIX.shard.json`` (written last, so its presence
means the part is complete); ``check_shard_parts`` refuses parts of different inputs, a
missing or repeated shard, or shards out of order before a merge writes anything.
"""

from __future__ import annotations

import json
import os
import re
import socket
from dataclasses import dataclass
from pathlib import Path

from bloomline.common.atomic import atomic_write_bytes
from bloomline.common.errors import UserError
from bloomline.dataprep.formats import FORMATS, Source

__all__ = [
    "ShardRecord",
    "check_shard_parts",
    "empty_part_warning",
    "format_merge_summary",
    "parse_shard",
    "shard_record_path",
    "shard_sources",
    "write_shard_record",
]

_RECORD_FORMAT = "bloomline-shard/1"


def parse_shard(text: str) -> tuple[int, int]:
    """``"3/8"`` -> ``(3, 8)``: part 3 (0-based, as SLURM_ARRAY_TASK_ID) of 8."""
    match = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text)
    if not match:
        raise UserError(f"--shard {text}: expected K/N, e.g. 0/8 (K counts from 0)")
    index, count = int(match[1]), int(match[2])
    if count < 1 or index >= count:
        raise UserError(f"--shard {text}: K must be in 0..N-1 and N at least 1")
    return index, count


def shard_sources(sources: list[Source], index: int, count: int,
                  txt_per_line: bool = False) -> list[Source]:
    """The parts of ``sources`` that shard ``index`` of ``count`` tokenizes, in input order.

    A source cut inside gets ``start``/``stop`` (bytes of a line file, row groups of a
    Parquet file, rows of a dataset folder) and ``part_bytes``, its share of the on-disk
    bytes (for chunk sizes, progress and ETA); where its units lie is its format's
    ``shard_part``.
    """
    total = sum(s.size for s in sources)
    low = index * total // count
    high = (index + 1) * total // count if index < count - 1 else float("inf")
    parts: list[Source] = []
    offset = 0
    for source in sources:
        begin, end = low - offset, high - offset  # this shard's range, in the file's bytes
        part = FORMATS[source.format].shard_part(source, begin, end, txt_per_line)
        if part is not None:
            parts.append(part)
        offset += source.size
    return parts


def empty_part_warning(sources: list[Source], index: int, count: int,
                       txt_per_line: bool = False) -> str:
    """The line a part that got no document prints: why its share of the job holds no unit
    (the file its byte range starts in, and why that file is not cut there), that the part is
    still written (empty, so that ``merge`` of all N parts works), and what to do."""
    total = sum(s.size for s in sources)
    low = index * total // count
    reason = (f"the inputs hold {total:,} bytes in {len(sources)} file(s), too few for "
              f"{count} parts", "use fewer parts")
    offset = 0
    for source in sources:
        if offset <= low < offset + source.size:
            reason = _why_not_cut(source, low - offset, offset, total, count, txt_per_line)
            break
        offset += source.size
    return (f"warning: shard {index}/{count} gets no input: {reason[0]}; the part is written "
            f"empty, and merge takes it ({reason[1]})")


def _why_not_cut(source: Source, at: int, offset: int, total: int, count: int,
                 txt_per_line: bool) -> tuple[str, str]:
    """Why ``source``, where this part's range starts (``at`` bytes into it, ``offset`` into
    the job), has no unit in this part, and what to do."""
    if source.compression is not None:
        owner = max(k for k in range(count) if k * total // count <= offset)
        return (f"{source.path} is one compressed file and cannot be split (shard "
                f"{owner}/{count} reads it whole)",
                "use --shard with more files or uncompressed input")
    if FORMATS[source.format].groups_whole_files(txt_per_line):
        return (f"{source.path} is one document (a whole .txt file) and is not split",
                "use fewer parts, or --txt-per-line")
    if source.format in ("jsonl", "txt"):
        return (f"no line of {source.path} starts in the bytes of it this part owns (from "
                f"byte {at:,}; a line is never split)", "use fewer parts")
    return (f"no {'row group' if source.format == 'parquet' else 'row'} of {source.path} "
            "starts in the bytes of it this part owns", "use fewer parts")


# ------------------------------------------------------------------ the record of each part


@dataclass
class ShardRecord:
    """What one part covers and what it took, as ``PREFIX.shard.json`` holds it."""

    shard: int
    num_shards: int
    inputs: list[list]  # [path, size] of every input of the whole job, in order
    parts: list[list]  # [path, start, stop] of what this shard read (stop None: to the end)
    num_documents: int
    num_tokens: int
    text_bytes: int
    num_skipped: int
    started: float  # Unix time
    seconds: float
    workers: int
    host: str

    @property
    def finished(self) -> float:
        return self.started + self.seconds


def shard_record_path(prefix: str | os.PathLike) -> Path:
    return Path(f"{prefix}.shard.json")


def write_shard_record(prefix: str, index: int, count: int, sources: list[Source],
                       parts: list[Source], summary, started: float, workers: int) -> None:
    """Record a finished part (after its ``.bin``/``.idx``: the record means "complete")."""
    record = ShardRecord(
        shard=index, num_shards=count,
        inputs=[[s.path, s.size] for s in sources],
        parts=[[p.path, p.start, p.stop] for p in parts],
        num_documents=summary.num_documents,
        num_tokens=sum(summary.num_tokens.values()),
        text_bytes=summary.text_bytes, num_skipped=summary.num_skipped,
        started=started, seconds=summary.seconds, workers=workers,
        host=socket.gethostname())
    payload = {"format": _RECORD_FORMAT, **record.__dict__}
    atomic_write_bytes(shard_record_path(prefix), json.dumps(payload, indent=1).encode())


def _read_record(prefix: str) -> ShardRecord | None:
    path = shard_record_path(prefix)
    if not path.is_file():
        return None
    try:
        payload = json.loads(path.read_text())
        if payload.pop("format") != _RECORD_FORMAT:
            raise ValueError("unknown format")
        return ShardRecord(**payload)
    except (ValueError, KeyError, TypeError) as err:
        raise UserError(f"{path}: not a shard record of this version ({err})") from None


def check_shard_parts(prefixes: list[str], num_documents: list[int]) -> list[ShardRecord]:
    """The shard records of ``prefixes``, checked to be parts 0..N-1 of one job, in order.

    ``num_documents`` is each part's document count as its ``.idx`` says (a part replaced by
    another file after it was written shows here). Prefixes without records are plain token
    files: merging those is allowed, mixing them with parts is not.

    Raises:
        UserError: naming the first part that is missing, repeated, out of order, of other
            inputs or of another N, or an input file whose size changed since (its parts'
            cuts, made from the sizes, no longer tile it).
    """
    records = [_read_record(p) for p in prefixes]
    if all(r is None for r in records):
        return []
    if any(r is None for r in records):
        plain = prefixes[records.index(None)]
        raise UserError(f"merge: {plain} has no {Path(plain).name}.shard.json but other "
                        "inputs are --shard parts; merge the parts of one job only")
    first = records[0]
    for prefix, record in zip(prefixes, records, strict=True):
        if record.num_shards != first.num_shards or record.inputs != first.inputs:
            raise UserError(f"merge: {prefix} is a part of another job (other inputs or N) "
                            f"than {prefixes[0]}")
    for path, size in first.inputs:  # the inputs as they are now, where this node sees them
        if os.path.isfile(path) and os.path.getsize(path) != size:
            raise UserError(f"merge: input {path} is {os.path.getsize(path):,} bytes now but "
                            f"was {size:,} when the parts were made; tokenize the parts again")
    if len(prefixes) != first.num_shards:
        have = [r.shard for r in records]
        missing = sorted(set(range(first.num_shards)) - set(have))
        repeated = sorted({k for k in have if have.count(k) > 1})
        detail = (f"missing shard(s) {missing[:5]}" if missing else
                  f"shard(s) {repeated[:5]} given twice")
        raise UserError(f"merge: {len(prefixes)} parts given for a job of {first.num_shards} "
                        f"shards ({detail}); give every part, in shard order")
    for position, (prefix, record, docs) in enumerate(
            zip(prefixes, records, num_documents, strict=True)):
        if record.shard != position:
            raise UserError(f"merge: {prefix} is shard {record.shard}/{record.num_shards} "
                            f"but given in place {position}; give the parts in shard order")
        if record.num_documents != docs:
            raise UserError(f"merge: {prefix}.idx holds {docs:,} documents but its shard "
                            f"record says {record.num_documents:,}: the part was changed")
    return records


def format_merge_summary(records: list[ShardRecord]) -> str:
    """The job's totals over every part, with rates over the job's wall time."""
    wall = max(max(r.finished for r in records) - min(r.started for r in records), 1e-9)
    docs = sum(r.num_documents for r in records)
    tokens = sum(r.num_tokens for r in records)
    text = sum(r.text_bytes for r in records)
    slowest = max(records, key=lambda r: r.seconds)
    hosts = len({r.host for r in records})
    return (f"{len(records)} parts on {hosts} host(s): {docs:,} documents, {tokens:,} tokens, "
            f"{text / 1e6:,.1f} MB of text, {sum(r.num_skipped for r in records):,} skipped "
            f"lines\njob: {wall:.1f} s from the first part's start to the last one's end | "
            f"{docs / wall:,.0f} docs/s | {text / wall / 1e6:.2f} MB/s | "
            f"{tokens / wall:,.0f} tokens/s | slowest part {slowest.shard}: "
            f"{slowest.seconds:.1f} s")
