"""The snapshots a node holds: files in host memory (``/dev/shm`` by default, a tmpfs), in a
folder of the run that outlives the training processes.

Why files in a tmpfs: torchrun's restart ends every worker of every node, so what must
survive a worker's death cannot live in the worker; a tmpfs file is host memory that stays
until it is deleted (or the machine goes), needs no keeper process, and a restarted worker
finds it by name.

    ROOT/bloomline-snapshots/RUN-JOB/HOST/shard00003-step00000120-t0-own.snap
                                          shard00001-step00000120-t0-copy.snap

``RUN`` hashes the run folder's absolute path, ``JOB`` is torchrun's run id (the same for
every restart of one launcher, new for the next launch), ``HOST`` the node (the machine's
name; ``placement.py``'s simulated nodes get one folder each). ``own`` is the rank's own
state, ``copy`` the replica it keeps for its source rank; ``tN`` the run's timeline (its
rollbacks so far). A file is written as ``.NAME.partial`` and renamed when complete: a name
without the prefix is a whole snapshot.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch

from bloomline.trainer.snapshots.shard_file import (
    PREFIX_SIZE,
    ShardHeader,
    crc32,
    decode_header,
    encode_header,
    header_end,
)

__all__ = ["Holding", "HostStore", "run_hash"]

_NAME = re.compile(r"^shard(\d{5})-step(\d{8})-t(\d+)-(own|copy)\.snap$")
_FOLDER = "bloomline-snapshots"


def run_hash(run_dir: str | Path) -> str:
    """A short name for the run folder (its absolute path hashed)."""
    return hashlib.sha256(str(Path(run_dir).resolve()).encode()).hexdigest()[:16]


@dataclass(frozen=True, order=True)
class Holding:
    """A complete snapshot file this node holds (ordered oldest to newest)."""

    timeline: int
    step: int
    shard: int
    kind: str
    path: Path

    def describe(self) -> str:
        return f"shard {self.shard} step {self.step}"


class HostStore:
    """One node's folder of a run's snapshots (``root``: ``checkpoint.snapshot_dir``)."""

    def __init__(self, root: str | Path, run_dir: str | Path, job: str, host: str) -> None:
        self.runs = Path(root) / _FOLDER
        self.prefix = run_hash(run_dir)
        self.folder = self.runs / f"{self.prefix}-{job}" / host

    @staticmethod
    def name(shard: int, step: int, timeline: int, kind: str) -> str:
        return f"shard{shard:05d}-step{step:08d}-t{timeline}-{kind}.snap"

    def holdings(self) -> list[Holding]:
        """The complete snapshot files of this node, oldest first."""
        try:
            names = os.listdir(self.folder)
        except (FileNotFoundError, NotADirectoryError):
            return []
        found = []
        for name in names:
            match = _NAME.match(name)
            if match:
                shard, step, timeline, kind = match.groups()
                found.append(Holding(int(timeline), int(step), int(shard), kind,
                                     self.folder / name))
        return sorted(found)

    def write(self, header: ShardHeader, data: torch.Tensor, kind: str) -> Path:
        """``header`` and ``data`` (flat uint8) as one snapshot file, complete or absent."""
        self.folder.mkdir(parents=True, exist_ok=True)
        final = self.folder / self.name(header.shard, header.step, header.timeline, kind)
        partial = final.with_name(f".{final.name}.partial")
        try:
            with open(partial, "wb") as fh:
                fh.write(encode_header(header))
                if data.numel():
                    fh.write(memoryview(data.numpy()))
            os.replace(partial, final)
        except BaseException:
            partial.unlink(missing_ok=True)
            raise
        return final

    @staticmethod
    def read(path: Path) -> tuple[ShardHeader, torch.Tensor]:
        """(header, data) of a snapshot file, its data checked against the header's CRC.

        Raises:
            ValueError: Not a snapshot, truncated, or its data does not match its CRC.
        """
        with open(path, "rb") as fh:
            prefix = fh.read(PREFIX_SIZE)
            prefix += fh.read(header_end(prefix) - len(prefix))
            header, offset = decode_header(prefix)
            fh.seek(offset)
            data = torch.empty(header.data_bytes, dtype=torch.uint8)
            if header.data_bytes and fh.readinto(memoryview(data.numpy())) != header.data_bytes:
                raise ValueError("truncated data")
        if crc32(data) != header.data_crc:
            raise ValueError("its data does not match its CRC (damaged in memory or in transit)")
        return header, data

    def prune(self, shard: int, kind: str, keep: int) -> None:
        """Keep the newest ``keep`` snapshots of ``shard`` of ``kind``; delete the others."""
        mine = [h for h in self.holdings() if h.shard == shard and h.kind == kind]
        for old in mine[:-keep] if keep else mine:
            old.path.unlink(missing_ok=True)

    def remove_run(self) -> None:
        """Delete every snapshot of this run on this node (every job's)."""
        for folder in self.runs.glob(f"{self.prefix}-*"):
            shutil.rmtree(folder, ignore_errors=True)
        try:
            self.runs.rmdir()  # and the top folder when no other run keeps snapshots here
        except OSError:
            pass
