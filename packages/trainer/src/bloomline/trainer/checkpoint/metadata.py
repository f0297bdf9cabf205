"""Reading a checkpoint's pickles without running code from them.

Contract: every pickle bloomline reads from a checkpoint goes through here. DCP's
``.metadata`` (the index of the shards) is unpickled resolving only the globals DCP's metadata
is made of (``ALLOWED_GLOBALS``: its dataclasses and enum, ``_StorageInfo``, ``torch.Size``,
torch's dtypes, layouts and memory formats, ``PosixPath``); the non-tensor values DCP stores
(the optimizer's ``param_groups`` entries) load with ``torch.load(weights_only=True)``, as the
tensors do. Any other global is refused with a one-line ``TamperedCheckpointError`` (a
``UserError``) naming the file and the global. Loads go through ``dcp_load``
(``CheckpointReader`` + ``CheckpointLoadPlanner``); ``verify_checkpoint`` runs
``check_pickles`` once the checksums agree.

Why: DCP reads these with plain ``pickle.load`` and ``torch.load(weights_only=False)``, and a
manifest proves only that the files are the ones it lists, not who wrote them.
"""

from __future__ import annotations

import io
import math
import pickle
import re
import zipfile
from pathlib import Path
from typing import IO, Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.filesystem import FileSystemReader
from torch.distributed.checkpoint.metadata import (
    BytesStorageMetadata,
    Metadata,
    MetadataIndex,
    StorageMeta,
    TensorStorageMetadata,
)

from bloomline.common.errors import UserError

__all__ = ["ALLOWED_GLOBALS", "METADATA_FILE", "CheckpointLoadPlanner", "CheckpointReader",
           "TamperedCheckpointError", "check_pickles", "dcp_load", "load_value", "read_metadata",
           "unpickle_metadata"]

METADATA_FILE = ".metadata"

# What DCP's metadata pickles are made of (torch 2.13; the same in every layout bloomline
# saves: one process, DDP, ZeRO-1/3 with FSDP2 DTensors, offload, tp with and without sequence
# parallelism, pp, AdamW and LAMB, sync and async saves). Classes whose construction runs no
# code of the file's choosing, and plain values; _get_layout maps a name to a torch.layout.
ALLOWED_GLOBALS: frozenset[tuple[str, str]] = frozenset(
    {("torch.distributed.checkpoint.metadata", name) for name in (
        "Metadata", "MetadataIndex", "StorageMeta", "TensorStorageMetadata",
        "BytesStorageMetadata", "ChunkStorageMetadata", "TensorProperties",
        "_MEM_FORMAT_ENCODING")}
    | {("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
       ("torch", "Size"),
       ("torch.serialization", "_get_layout"),
       # StorageMeta.checkpoint_id, the folder it was saved to (pathlib._local on 3.13)
       ("pathlib", "PosixPath"), ("pathlib", "PurePosixPath"),
       ("pathlib._local", "PosixPath"), ("pathlib._local", "PurePosixPath")}
    | {("torch", name) for name, value in vars(torch).items()
       if isinstance(value, (torch.dtype, torch.layout, torch.memory_format))})

_WHY = "a checkpoint's metadata names only DCP's classes"
_TAMPERED = "the checkpoint may be tampered with"


class TamperedCheckpointError(UserError):
    """A checkpoint pickle names a global outside what DCP writes: no accident of storage
    makes one (the manifest agreed), so nothing falls back past it; it is refused."""


class _MetadataUnpickler(pickle.Unpickler):
    def __init__(self, file: IO[bytes], where: str) -> None:
        super().__init__(file)
        self.where = where

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in ALLOWED_GLOBALS:
            raise TamperedCheckpointError(f"{self.where}: refuses to unpickle {module}.{name} "
                                     f"({_WHY}); {_TAMPERED}")
        return super().find_class(module, name)

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError("persistent ids are not part of DCP metadata")


def unpickle_metadata(file: IO[bytes], where: str) -> Metadata:
    """DCP ``Metadata`` from an open ``.metadata`` file, resolving only ``ALLOWED_GLOBALS``.

    Raises:
        TamperedCheckpointError: It names another global (``where``: the file, for the message).
        ValueError: It does not unpickle, or is not DCP metadata (a damaged file).
    """
    try:
        metadata = _MetadataUnpickler(file, where).load()
    except UserError:
        raise
    except Exception as err:  # noqa: BLE001 - whatever a damaged pickle raises
        raise ValueError(f"does not unpickle ({type(err).__name__}: {err})") from None
    if not isinstance(metadata, Metadata):
        raise ValueError(f"holds a {type(metadata).__name__}, not DCP metadata")
    return metadata


def read_metadata(checkpoint: str | Path) -> Metadata:
    """A checkpoint folder's ``.metadata``, unpickled as ``unpickle_metadata`` does.

    Raises:
        TamperedCheckpointError: It names a global outside ``ALLOWED_GLOBALS``.
        UserError: It cannot be read or does not unpickle as DCP metadata.
    """
    path = Path(checkpoint) / METADATA_FILE
    try:
        with open(path, "rb") as fh:
            return unpickle_metadata(fh, str(path))
    except (OSError, ValueError) as err:
        raise UserError(f"{path}: {err}") from None


_GLOBAL = re.compile(r"GLOBAL ([\w.]+)")


def load_value(data: bytes, where: str, fqn: str) -> Any:
    """A non-tensor value DCP stored (``torch.save`` bytes) with ``weights_only=True``.

    Raises:
        TamperedCheckpointError: It names a global ``weights_only`` does not admit.
        ValueError: It does not load (a damaged file).
    """
    try:
        return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        found = _GLOBAL.search(str(err))
        if found is None:  # not a refused global: damaged
            raise ValueError(f"{fqn}: does not load ({str(err).splitlines()[0]})") from None
        raise TamperedCheckpointError(
            f"{where}: refuses to unpickle {found.group(1)} (in {fqn}: a checkpoint's "
            f"non-tensor values load with torch.load(weights_only=True)); {_TAMPERED}"
        ) from None
    except Exception as err:  # noqa: BLE001 - whatever a damaged file raises
        raise ValueError(f"{fqn}: does not load ({type(err).__name__}: {err})") from None


def _ints(values: Any) -> bool:
    """A sequence of ints >= 0 (not bools: ``True`` is an int to Python, no size)."""
    return isinstance(values, (tuple, list)) and all(
        isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values)


class _Window(io.RawIOBase):
    """The bytes ``[start, start + length)`` of an open file as a seekable file of their own:
    one storage entry, which ``zipfile`` reads as torch.load would."""

    def __init__(self, fh: IO[bytes], start: int, length: int) -> None:
        super().__init__()
        self.fh, self.start, self.length, self.pos = fh, start, length, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = 0) -> int:
        base = (0, self.pos, self.length)[whence]
        self.pos = min(max(base + offset, 0), self.length)
        return self.pos

    def readinto(self, buffer) -> int:
        self.fh.seek(self.start + self.pos)
        data = self.fh.read(min(len(buffer), self.length - self.pos))
        buffer[:len(data)] = data
        self.pos += len(data)
        return len(data)


def _tensor_entry_problem(fh: IO[bytes], info, nbytes: int) -> str | None:
    """Why a tensor's storage entry is not what DCP writes for ``nbytes`` of data, or None.

    DCP writes each tensor chunk with ``torch.save`` (a zip file) whose storage holds exactly
    the chunk's bytes (it clones a view of a larger storage first); torch.load also inflates
    deflated members, so a few KB of zip could claim GBs: every member must be stored
    uncompressed, and the storages must add up to the chunk's bytes."""
    if info.length < nbytes:
        return f"{info.length} bytes for a chunk of {nbytes} bytes"
    try:
        members = zipfile.ZipFile(_Window(fh, info.offset, info.length)).infolist()
    except (zipfile.BadZipFile, OSError, ValueError, EOFError) as err:
        return f"not a torch.save archive ({err})"
    if any(m.compress_type != zipfile.ZIP_STORED or m.compress_size != m.file_size
           for m in members):
        return "a compressed member (DCP stores tensors uncompressed)"
    if sum(m.file_size for m in members) > info.length:
        return "members larger than the entry"
    stored = sum(m.file_size for m in members if "/data/" in m.filename
                 and not m.filename.rsplit("/", 1)[-1].startswith("."))
    if stored != nbytes:
        return f"{stored} bytes of storage for a chunk of {nbytes} bytes"
    return None


def _storage_problems(metadata: Metadata, sizes: dict[str, int]) -> list[str]:
    """The index's entries against the files (``sizes``: the manifest's) and the tensors:
    each entry an ``[offset, offset + length)`` inside its file, untransformed (bloomline
    writes no DCP extension; a zstd one inflates whatever size its frame claims), and each
    tensor chunk within its tensor with an entry of its own."""
    problems = []
    storage, items = metadata.storage_data, metadata.state_dict_metadata
    for key, info in storage.items():
        fqn = getattr(key, "fqn", key)
        if getattr(info, "transform_descriptors", None):
            problems.append(f"{METADATA_FILE}: {fqn}: stored through transforms "
                            f"{info.transform_descriptors!r} (bloomline writes none); "
                            f"{_TAMPERED}")
        elif not _ints([info.offset, info.length]):
            problems.append(f"{METADATA_FILE}: {fqn}: offset {info.offset!r}, length "
                            f"{info.length!r} are not byte counts")
        elif info.offset + info.length > sizes[info.relative_path]:
            problems.append(f"{METADATA_FILE}: {fqn}: bytes [{info.offset}, "
                            f"{info.offset + info.length}) of {info.relative_path}, which has "
                            f"{sizes[info.relative_path]}")
        elif (not isinstance(key, MetadataIndex) or fqn not in items
              or not (key.offset is None or _ints(key.offset))):
            problems.append(f"{METADATA_FILE}: {fqn}: a storage entry of no tensor or value")
    for fqn, item in items.items():
        if isinstance(item, BytesStorageMetadata):
            continue
        if (not isinstance(item, TensorStorageMetadata) or not _ints(item.size)
                or not isinstance(getattr(item.properties, "dtype", None), torch.dtype)
                or not isinstance(item.chunks, list)):
            problems.append(f"{METADATA_FILE}: {fqn}: not a tensor's metadata")
            continue
        for chunk in item.chunks:
            if not (_ints(chunk.offsets) and _ints(chunk.sizes)
                    and len(chunk.offsets) == len(chunk.sizes) == len(item.size)
                    and all(o + n <= d for o, n, d in zip(chunk.offsets, chunk.sizes,
                                                          item.size, strict=True))):
                problems.append(f"{METADATA_FILE}: {fqn}: a chunk at {chunk.offsets!r} of "
                                f"{chunk.sizes!r} outside its size {tuple(item.size)}")
    return problems


def _chunk_entries(storage: dict) -> dict[tuple[str, tuple], Any]:
    """{(fqn, chunk offsets): storage entry} of the tensor chunks (DCP finds a chunk's entry
    by its offsets)."""
    return {(key.fqn, tuple(key.offset)): info for key, info in storage.items()
            if key.offset is not None}


def check_pickles(folder: str | Path, sizes: dict[str, int]) -> list[str]:
    """Unpickle a checkpoint's ``.metadata`` and every non-tensor value it indexes the way a
    load does, and check every storage entry against its file and its tensor; return the
    problems (empty: good), one line each naming the file.

    ``sizes``: the checkpoint's files and their sizes (the manifest's); the metadata may point
    only inside them.

    Raises:
        TamperedCheckpointError: A pickle names a global a load refuses.
    """
    folder = Path(folder)
    try:
        with open(folder / METADATA_FILE, "rb") as fh:
            metadata = unpickle_metadata(fh, str(folder / METADATA_FILE))
    except (OSError, ValueError) as err:
        return [f"{METADATA_FILE}: {err}"]
    storage, items = metadata.storage_data, metadata.state_dict_metadata
    if not isinstance(storage, dict) or not isinstance(items, dict):
        return [f"{METADATA_FILE}: not DCP metadata (its index is not a dict)"]
    paths = [getattr(info, "relative_path", None) for info in storage.values()]
    if not all(isinstance(path, str) for path in paths):
        return [f"{METADATA_FILE}: not DCP metadata (an index entry names no file)"]
    problems = sorted(f"{METADATA_FILE}: indexes {path!r}, not a file of the checkpoint"
                      for path in set(paths) - sizes.keys())
    if problems:
        return problems
    problems = _storage_problems(metadata, sizes)
    if problems:
        return problems
    chunks = _chunk_entries(storage)
    by_file: dict[str, list] = {}
    for fqn, item in items.items():
        if isinstance(item, BytesStorageMetadata):
            info = storage.get(MetadataIndex(fqn))
            if info is None:
                problems.append(f"{METADATA_FILE}: {fqn}: no storage entry")
            else:
                by_file.setdefault(info.relative_path, []).append((fqn, info, None))
            continue
        for chunk in item.chunks:
            info = chunks.get((fqn, tuple(chunk.offsets)))
            if info is None:
                problems.append(f"{METADATA_FILE}: {fqn}: no storage entry for its chunk at "
                                f"{tuple(chunk.offsets)}")
                continue
            nbytes = math.prod(chunk.sizes) * item.properties.dtype.itemsize
            by_file.setdefault(info.relative_path, []).append((fqn, info, nbytes))
    for name, entries in sorted(by_file.items()):
        with open(folder / name, "rb") as fh:
            for fqn, info, nbytes in entries:
                if nbytes is not None:
                    why = _tensor_entry_problem(fh, info, nbytes)
                    if why is not None:
                        problems.append(f"{name}: {fqn}: {why}; {_TAMPERED}")
                    continue
                try:
                    fh.seek(info.offset)
                    load_value(fh.read(info.length), str(folder / name), fqn)
                except (ValueError, TypeError, OSError) as err:
                    problems.append(f"{name}: {err}")
    return problems


class CheckpointReader(FileSystemReader):
    """DCP's ``FileSystemReader`` whose ``read_metadata`` unpickles with ``ALLOWED_GLOBALS``
    (the rest as in torch 2.13). A refusal is also kept in ``refusal``: DCP wraps errors of a
    load into its own exception (``dcp_load`` raises it again)."""

    def __init__(self, path: str | Path, **kwargs: Any) -> None:
        super().__init__(path, **kwargs)
        self.refusal: TamperedCheckpointError | None = None

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        path = self._get_metadata_path(kwargs.get("rank"))
        with self.fs.create_stream(path, "rb") as metadata_file:
            try:
                metadata = unpickle_metadata(metadata_file, str(path))
            except TamperedCheckpointError as err:
                self.refusal = err
                raise
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


class CheckpointLoadPlanner(DefaultLoadPlanner):
    """DCP's default load planner, but non-tensor values load with ``weights_only=True``
    (``DefaultLoadPlanner.load_bytes`` uses ``weights_only=False``).

    Args:
        checkpoint: The folder (for messages).
    """

    def __init__(self, checkpoint: str | Path, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.checkpoint = Path(checkpoint)

    def load_bytes(self, read_item, value: io.BytesIO) -> None:
        fqn = read_item.dest_index.fqn
        info = self.metadata.storage_data.get(read_item.storage_index) if self.metadata else None
        where = self.checkpoint / (info.relative_path if info is not None else "?")
        try:
            obj = load_value(value.getvalue(), str(where), fqn)
        except ValueError as err:
            raise UserError(f"{where}: {err}") from None
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[fqn], obj)
        else:
            self.state_dict[fqn] = obj


def dcp_load(state_dict: dict, checkpoint: str | Path, process_group=None) -> None:
    """``torch.distributed.checkpoint.load`` of ``checkpoint`` into ``state_dict`` (in place)
    with ``CheckpointReader`` and ``CheckpointLoadPlanner``; collective as DCP's.

    Raises:
        UserError: A pickle of the checkpoint is refused or damaged (the first such, with its
            line, rather than DCP's multi-rank report), or DCP fails to read it otherwise.
    """
    reader = CheckpointReader(checkpoint)
    try:
        dcp.load(state_dict, storage_reader=reader, planner=CheckpointLoadPlanner(checkpoint),
                 process_group=process_group)
    except CheckpointException as err:
        for failure in err.failures.values():
            exc = failure[0] if isinstance(failure, tuple) else failure
            if isinstance(exc, UserError):
                raise exc from None
        if reader.refusal is not None:
            raise reader.refusal from None
        # a checkpoint the checks above admit but DCP cannot read (a torch.save archive whose
        # pickle disagrees with the index): its first failure, in one line
        first = next(iter(err.failures.values()), err)
        exc = first[0] if isinstance(first, tuple) else first
        text = (str(exc).strip().splitlines() or [""])[0][:300]
        raise UserError(f"{checkpoint}: DCP cannot load it ({type(exc).__name__}: {text}); "
                        f"run `trainer verify-checkpoint {checkpoint}`") from None
