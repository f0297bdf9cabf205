"""Checkpoint manifests: what makes a checkpoint folder complete, and how to tell a good one
from a damaged one.

``manifest.json`` is the last file a save writes into its ``.step_N.partial`` folder: the
format version, the step, and every other file's size and sha256. A folder without a manifest
is an unfinished save; a folder whose files disagree with it was damaged after saving (a
flipped bit, a truncated copy, a shard lost or swapped). ``verify_checkpoint`` checks all of
it *before* anything is loaded, so that a bad checkpoint is refused with a line naming the
file instead of failing (or, worse, loading garbage) deep inside DCP; and, since DCP unpickles
``.metadata``, before any unpickling happens. Then it unpickles DCP's pickles as a load does,
admitting only DCP's classes (``metadata.py``).

Hashing a checkpoint of billions of parameters takes seconds per GB on one core; when the
process group is up, every rank hashes a slice of the files (``sorted(files)[rank::world]``)
and the results are gathered. This needs the checkpoint folder to be visible to every rank
(a shared file system), which DCP's ``FileSystemWriter`` needs already.
"""

from __future__ import annotations

import hashlib
import json
import os
import tomllib
from collections.abc import Callable
from pathlib import Path

import torch.distributed as dist

from bloomline.common.errors import UserError
from bloomline.trainer.checkpoint import metadata
from bloomline.trainer.checkpoint.rng_state import rng_problems
from bloomline.trainer.train_state import TrainState

__all__ = ["MANIFEST", "MANIFEST_VERSION", "describe_checkpoint", "fsync_dir",
           "refuse_damaged", "small_file_problems", "verify_checkpoint", "write_manifest"]

MANIFEST = "manifest.json"
MANIFEST_VERSION = 1
_FORMAT = "bloomline-checkpoint"
_CHUNK = 8 << 20  # 8 MiB: large enough that hashlib (which releases the GIL) dominates
# files every checkpoint has, and how to check that they parse; DCP's .metadata is a pickle,
# read (restricted, metadata.py) only after the checksums agree
_REQUIRED = ("trainer_state.json", "config.toml", "rng.json", ".metadata")


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def _files(folder: Path) -> list[str]:
    """Every file under ``folder`` but the manifest, as sorted relative POSIX paths."""
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*")
                  if p.is_file() and p.relative_to(folder).as_posix() != MANIFEST)


def _hash_file(path: Path, sync: bool) -> tuple[int, str]:
    """(size, sha256) of a file; with ``sync``, also fsync it (the hashing rank may not be
    the one that wrote it: fsync of any descriptor flushes the file's dirty pages)."""
    digest, size = hashlib.sha256(), 0
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            digest.update(chunk)
            size += len(chunk)
        if sync:
            os.fsync(fh.fileno())
    return size, digest.hexdigest()


def _hash_shared(folder: Path, names: list[str], sync: bool,
                 group=None) -> dict[str, tuple[int, str] | str]:
    """{name: (size, sha256)} or {name: error text} for ``names``, each rank hashing its slice
    when the process group is up; every rank gets the whole answer. ``names`` must be equal on
    all ranks (each rank takes its slice by position)."""
    def one(name: str) -> tuple[int, str] | str:
        try:
            return _hash_file(folder / name, sync)
        except OSError as err:
            return err.strerror or str(err)

    if not _distributed():
        return {name: one(name) for name in names}
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    mine = {name: one(name) for name in names[rank::world]}
    gathered: list = [None] * world
    dist.all_gather_object(gathered, mine, group=group)
    return {name: result for part in gathered for name, result in part.items()}


def fsync_dir(path: Path) -> None:
    """Make a folder's entries (a file created or renamed in it) durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_manifest(folder: str | Path, step: int, is_writer: bool, group=None) -> None:
    """Hash (and fsync) every file of ``folder`` and write ``manifest.json`` last, fsync'ed.

    Collective when the process group is up: all ranks call it after every rank's files are
    written; the writer lists the folder (the list is broadcast so that all ranks agree on
    the slices), all hash, the writer writes the manifest.

    Args:
        folder: The checkpoint's partial folder.
        step: The training step, recorded in the manifest.
        is_writer: Whether this rank writes the manifest (rank 0).
        group: Process group for the collectives (None: the default group).

    Raises:
        OSError: A file vanished or could not be read while hashing.
    """
    folder = Path(folder)
    names = _files(folder) if is_writer else []
    if _distributed():
        box = [names]
        dist.broadcast_object_list(box, src=dist.get_global_rank(group, 0) if group else 0,
                                   group=group)
        names = box[0]
    hashed = _hash_shared(folder, names, sync=True, group=group)
    if not is_writer:
        return
    failed = {name: result for name, result in hashed.items() if isinstance(result, str)}
    if failed:
        name, why = next(iter(failed.items()))
        raise OSError(f"{folder / name}: cannot hash for the manifest: {why}")
    manifest = {"format": _FORMAT, "version": MANIFEST_VERSION, "step": step,
                "files": {name: {"size": size, "sha256": sha}
                          for name, (size, sha) in hashed.items()}}
    with open(folder / MANIFEST, "w") as fh:
        fh.write(json.dumps(manifest, indent=1))
        fh.flush()
        os.fsync(fh.fileno())
    fsync_dir(folder)


def _read_manifest(folder: Path) -> tuple[dict | None, str | None]:
    """(manifest, None) or (None, the problem)."""
    path = folder / MANIFEST
    if not path.is_file():
        if (folder / "rng.pt").is_file():  # legacy.py: the format before manifests
            return None, (f"{MANIFEST}: missing: a checkpoint of the format before manifests "
                          f"(bloomline until 2026-11-25); `trainer upgrade-checkpoint {folder} "
                          "NEW` converts it")
        return None, (f"{MANIFEST}: missing (the save did not finish, or the checkpoint "
                      "predates manifests)")
    try:
        manifest = json.loads(path.read_bytes())
    except (ValueError, OSError) as err:
        return None, f"{MANIFEST}: bad JSON ({err})"
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if (not isinstance(files, dict) or manifest.get("format") != _FORMAT
            or not all(isinstance(v, dict) and isinstance(v.get("size"), int)
                       and isinstance(v.get("sha256"), str) for v in files.values())):
        return None, f"{MANIFEST}: not a bloomline checkpoint manifest"
    if manifest.get("version") != MANIFEST_VERSION:
        return None, (f"{MANIFEST}: format version {manifest.get('version')!r}, this "
                      f"bloomline reads {MANIFEST_VERSION}")
    return manifest, None


def _check_json_object(text: bytes) -> dict:
    value = json.loads(text)
    if not isinstance(value, dict):
        raise ValueError("not a JSON object")
    return value


_PARSERS: dict[str, Callable[[bytes], object]] = {
    "trainer_state.json": _check_json_object,
    "rng.json": _check_json_object,
    "config.toml": lambda text: tomllib.loads(text.decode()),
}


def _nothing(value: object) -> list[str]:
    return []


_SCHEMAS: dict[str, Callable[[dict], list[str]]] = {
    "trainer_state.json": TrainState.problems,
    "rng.json": rng_problems,
}


def _cheap_problems(folder: Path, manifest: dict) -> list[str]:
    """Everything but the checksums: files listed / present / of the listed size / parsing."""
    problems = []
    listed = manifest["files"]
    present = set(_files(folder))
    for name in sorted(listed):
        if name not in present:
            problems.append(f"{name}: listed in the manifest but missing")
            continue
        size = (folder / name).stat().st_size
        if size != listed[name]["size"]:
            problems.append(f"{name}: {size} bytes, the manifest says {listed[name]['size']} "
                            "(truncated or overwritten)")
    problems += [f"{name}: present but not listed in the manifest"
                 for name in sorted(present - listed.keys())]
    problems += [f"{name}: missing (every checkpoint has one)"
                 for name in _REQUIRED if name not in listed and name not in present]
    for name, parse in _PARSERS.items():
        if name in present:
            try:
                value = parse((folder / name).read_bytes())
            except (ValueError, UnicodeDecodeError, OSError) as err:
                problems.append(f"{name}: does not parse ({err})")
                continue
            if name == "trainer_state.json" and value.get("step") != manifest.get("step"):
                problems.append(f"{name}: step {value.get('step')!r}, the manifest says "
                                f"{manifest.get('step')!r}")
            # what a load takes from them, checked as the load checks it (types, ranges)
            problems += [f"{name}: {problem}" for problem in _SCHEMAS.get(name, _nothing)(value)]
    return problems


def small_file_problems(path: str | Path) -> list[str]:
    """The checks of ``verify_checkpoint`` that cost no hashing of the shards: the manifest,
    every file present and of its listed size, and the small files (``config.toml``,
    ``trainer_state.json``, ``rng.json``) hashed against it and checked as a load reads them.
    Not collective. What a reader runs before it builds anything from ``config.toml``: an
    edited config (a model of 33 GB) must be refused before it is allocated."""
    folder = Path(path)
    if not folder.is_dir():
        return [f"{folder}: not a folder"]
    manifest, problem = _read_manifest(folder)
    if problem:
        return [problem]
    problems = _cheap_problems(folder, manifest)
    if problems:
        return problems
    for name in _PARSERS:
        if name in manifest["files"]:
            _, sha = _hash_file(folder / name, sync=False)
            if sha != manifest["files"][name]["sha256"]:
                problems.append(f"{name}: sha256 differs from the manifest's (content changed "
                                "after saving)")
    return problems


def refuse_damaged(checkpoint: str | Path, problems: list[str]) -> None:
    """Raise the one-line ``UserError`` for a checkpoint that does not verify (its first
    problem, how many more, and the command that lists them); nothing when ``problems`` is
    empty."""
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise UserError(f"{checkpoint}: damaged or incomplete checkpoint: {problems[0]}{more}; "
                        f"run `trainer verify-checkpoint {checkpoint}`")


def verify_checkpoint(path: str | Path, group=None) -> list[str]:
    """Check a checkpoint folder against its manifest; return the problems (empty: good).

    Reports, one line each naming the file: a missing or unparsable manifest, a listed file
    that is missing, of another size (truncated) or another sha256 (a flipped byte), a file
    present but not listed, and a ``trainer_state.json`` / ``config.toml`` / ``rng.json`` that
    does not parse. Once all that is right (never before), DCP's ``.metadata`` and the
    non-tensor values it indexes are unpickled the way a load does (``check_pickles``): one
    that does not unpickle is a problem, one naming a global a load refuses an error.

    Collective when the process group is up: all ranks call it, each hashes a slice of the
    files, and all return the same list.

    Args:
        path: A checkpoint folder (``RUN/checkpoints/step_N``).
        group: Process group for the collectives (None: the default group).

    Returns:
        The problems, most telling first; empty when the checkpoint is intact.

    Raises:
        TamperedCheckpointError: A pickle names a global outside what DCP writes (no damage makes
            one: nothing should fall back past such a checkpoint).
    """
    folder = Path(path)
    if not folder.is_dir():
        problems = [f"{folder}: not a folder"]
        manifest = None
    else:
        manifest, problem = _read_manifest(folder)
        problems = [problem] if problem else _cheap_problems(folder, manifest)
    listed = manifest["files"] if manifest else {}
    # only files whose size is right are worth hashing (the others are reported already)
    expected = {name: listed[name]["sha256"] for name in sorted(listed)
                if (folder / name).is_file()
                and (folder / name).stat().st_size == listed[name]["size"]}
    if _distributed():
        # one answer for all ranks, and slices taken from one list: the first rank's
        box = [expected, problems]
        dist.broadcast_object_list(box, src=dist.get_global_rank(group, 0) if group else 0,
                                   group=group)
        expected, problems = box
    hashed = _hash_shared(folder, list(expected), sync=False, group=group)
    for name, sha in expected.items():
        result = hashed[name]
        if isinstance(result, str):
            problems.append(f"{name}: cannot be read ({result})")
        elif result[1] != sha:
            problems.append(f"{name}: sha256 differs from the manifest's (content changed "
                            "after saving)")
    if not problems:
        # the files are the ones the manifest lists: only now are DCP's pickles read, as a
        # load reads them (metadata.py: DCP's classes only, else refused)
        problems += metadata.check_pickles(
            folder, {name: entry["size"] for name, entry in listed.items()})
    return problems


def describe_checkpoint(path: str | Path) -> tuple[int, int, int]:
    """(number of files, total bytes, step) of a checkpoint per its manifest (verify first)."""
    manifest, problem = _read_manifest(Path(path))
    if manifest is None:
        raise ValueError(problem)
    files = manifest["files"]
    return len(files), sum(v["size"] for v in files.values()), int(manifest["step"])
