"""Saving a checkpoint: ``RUN/checkpoints/step_NNNNNNNN/`` with

- the model and optimizer state through torch.distributed.checkpoint (DCP): sharded per rank
  when the model is, and loadable into another layout (a resume under another layout
  reshards through it);
- ``trainer_state.json``: step, consumed samples and tokens, bad-step counters, loss-scaler
  state; the LR schedule is a function of these counters, so it needs nothing more;
- ``rng.json``: the python, numpy, torch (and CUDA) generator states, as plain JSON
  (``rng_state.py``);
- ``config.toml``: the resolved config the run was started with;
- ``tokenizer/``: the run's tokenizer files (``tokenizer_copy.py``), when it has a tokenizer;
- ``manifest.json``, written last: every other file's size and sha256
  (``manifest.py``).

A checkpoint is written into a hidden ``.step_N.partial`` folder, its files fsync'ed, the
manifest written, and the folder renamed: a crash leaves no folder that looks like a
checkpoint, and a folder damaged later is caught by its manifest. Older checkpoints beyond
``keep_last`` are deleted after each save, stale partial folders at the start of the next one.

Saving is two halves around the DCP write, shared by the synchronous ``save_checkpoint`` and
the background ``AsyncCheckpointer`` (``async_save.py``): ``begin_save`` snapshots the
small state and prepares the folder, ``finish_save`` completes it. Reading checkpoints back
is apart: ``load.py``, ``discovery.py`` (the newest that verifies), ``compatibility.py``.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp

from bloomline.common import faults
from bloomline.common.config_loader import to_toml
from bloomline.trainer.checkpoint.dcp_state import dcp_quiet, saved_state_dict
from bloomline.trainer.checkpoint.failure import failed_save
from bloomline.trainer.checkpoint.layout import (
    CONFIG_FILE,
    PARTIAL_NAME,
    RNG_FILE,
    STATE_FILE,
    PendingSave,
    list_checkpoints,
)
from bloomline.trainer.checkpoint.manifest import fsync_dir, write_manifest
from bloomline.trainer.checkpoint.rng_state import rng_state
from bloomline.trainer.checkpoint.tokenizer_copy import tokenizer_copy_files

__all__ = ["begin_save", "finish_save", "save_checkpoint"]


def _distributed() -> bool:
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def begin_save(run_dir: str | Path, step: int, trainer_state: dict, config, keep_last: int,
               is_writer: bool) -> PendingSave:
    """Snapshot the trainer state, RNG states, config and (the writer) the run's tokenizer
    files (``tokenizer_copy.py``), and give the writer an empty partial folder (stale ones of
    killed saves are removed: no save is in flight now)."""
    pending = PendingSave(Path(run_dir) / "checkpoints", step, keep_last, is_writer, files={
        STATE_FILE: json.dumps(trainer_state, indent=1).encode(),
        RNG_FILE: json.dumps(rng_state()).encode(),
        CONFIG_FILE: to_toml(config).encode(),
        **(tokenizer_copy_files(config.data) if is_writer else {})})
    if is_writer:
        if pending.root.is_dir():
            for stale in pending.root.iterdir():
                if PARTIAL_NAME.match(stale.name):
                    shutil.rmtree(stale, ignore_errors=True)
        # exist_ok: the other ranks' DCP writers create it too, maybe first (before planning;
        # they write nothing before the planning collective, which this rank joins after)
        pending.partial.mkdir(parents=True, exist_ok=True)
    return pending


def _write_synced(path: Path, data: bytes) -> None:
    with open(path, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())


def finish_save(pending: PendingSave, group=None) -> Path:
    """Complete a save whose tensors every rank has written: the small files, the manifest
    (hashing shared over the ranks), the rename, the pruning. Collective when the process
    group is up; ``group`` is the one to use (an async save passes its own: the training
    thread uses the default group meanwhile)."""
    if pending.is_writer:
        for name, data in pending.files.items():
            (pending.partial / name).parent.mkdir(exist_ok=True)  # tokenizer/NAME
            _write_synced(pending.partial / name, data)
    faults.fire("save", step=pending.step)  # a fault point of survival/faults.py's list
    write_manifest(pending.partial, pending.step, pending.is_writer, group)
    if pending.is_writer:
        final = pending.final
        if final.exists():  # a re-run of the same step replaces it
            shutil.rmtree(final)
        pending.partial.rename(final)
        fsync_dir(pending.root)
        kept = list_checkpoints(pending.root.parent)
        for old in kept[:-pending.keep_last] if pending.keep_last > 0 else []:
            shutil.rmtree(old, ignore_errors=True)
    if _distributed():
        # no rank returns before the writer has renamed the folder: a rank that went on to
        # load it, list it or exit (ending the job) would otherwise race the rename
        torch.distributed.barrier(group=group)
    return pending.final


def save_checkpoint(run_dir: str | Path, step: int, model, optimizer, trainer_state: dict,
                    config, keep_last: int, is_writer: bool = True) -> Path:
    """Write checkpoint ``step`` (verified by its manifest) and prune to the newest
    ``keep_last``; returns its folder. Every rank calls it (DCP is collective); the training
    stalls until the checkpoint is on disk (``AsyncCheckpointer`` does not). A save that
    fails (a full disk) removes its partial folder and raises one ``UserError`` line
    (``failure.py``)."""
    pending = begin_save(run_dir, step, trainer_state, config, keep_last, is_writer)
    with failed_save(pending):
        with dcp_quiet():
            dcp.save(saved_state_dict(model, optimizer), checkpoint_id=str(pending.partial))
        return finish_save(pending)
