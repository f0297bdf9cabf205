"""Checkpoints: ``RUN/checkpoints/step_NNNNNNNN/`` with

- the model and optimizer state through torch.distributed.checkpoint (DCP): sharded per rank
  when the model is, and loadable into another layout (a resume under another layout
  reshards through it);
- ``trainer_state.json``: step, consumed samples and tokens, bad-step counters, loss-scaler
  state; the LR schedule is a function of these counters, so it needs nothing more;
- ``rng.json``: the python, numpy, torch (and CUDA) generator states, as plain JSON (no
  pickle: loading a checkpoint must not run code from it);
- ``config.toml``: the resolved config the run was started with;
- ``tokenizer/``: the run's tokenizer files (``tokenizer_copy.py``), when it has a tokenizer;
- ``manifest.json``, written last: every other file's size and sha256
  (``manifest.py``).

A checkpoint is written into a hidden ``.step_N.partial`` folder, its files fsync'ed, the
manifest written, and the folder renamed: a crash leaves no folder that looks like a
checkpoint, and a folder damaged later is caught by its manifest. ``latest_checkpoint``
returns the newest checkpoint that verifies; older ones beyond ``keep_last`` are deleted after
each save, stale partial folders at the start of the next one.

Saving is two halves around the DCP write, shared by the synchronous ``save_checkpoint`` and
the background ``AsyncCheckpointer`` (``async_save.py``): ``begin_save`` snapshots the
small state and prepares the folder, ``finish_save`` completes it.
"""

from __future__ import annotations

import base64
import contextlib
import copy
import json
import os
import random
import shutil
import sys
import warnings
from collections.abc import Callable, Iterator
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch
import torch.distributed.checkpoint as dcp

from bloomline.common.config_loader import config_from_dict, resolve_paths, to_toml
from bloomline.common.errors import UserError
from bloomline.trainer.checkpoint.failure import failed_save
from bloomline.trainer.checkpoint.layout import (
    CONFIG_FILE,
    PARTIAL_NAME,
    RNG_FILE,
    STATE_FILE,
    PendingSave,
    list_checkpoints,
)
from bloomline.trainer.checkpoint.manifest import (
    fsync_dir,
    verify_checkpoint,
    write_manifest,
)
from bloomline.trainer.checkpoint.metadata import dcp_load
from bloomline.trainer.checkpoint.tokenizer_copy import tokenizer_copy_files
from bloomline.trainer.survival import faults

__all__ = ["latest_checkpoint", "list_checkpoints", "load_checkpoint", "save_checkpoint",
           "load_config_of", "check_compatible", "changed_settings", "saved_state_dict",
           "begin_save", "finish_save", "PendingSave"]


# DCP warns on every call without a process group that it assumes a single process; that is
# intended here. A process-wide filter for the async save, which calls DCP from a background
# thread (a catch_warnings block is not thread-safe and is gone by then); ``_quiet`` for the
# calls in this thread, where a test harness may have reset the filters.
_DCP_SINGLE_PROCESS = ".*torch.distributed is disabled.*"
warnings.filterwarnings("ignore", message=_DCP_SINGLE_PROCESS)


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_DCP_SINGLE_PROCESS)
        yield


def _distributed() -> bool:
    return torch.distributed.is_available() and torch.distributed.is_initialized()


# -- RNG states as JSON ------------------------------------------------------------------------
def _b64(state: torch.Tensor) -> str:
    return base64.b64encode(state.numpy().tobytes()).decode("ascii")


def _from_b64(text: str) -> torch.Tensor:
    return torch.frombuffer(bytearray(base64.b64decode(text)), dtype=torch.uint8)


def rng_state() -> dict:
    """This process's generator states as plain JSON values (ints, lists, strings): Python's
    Mersenne Twister, numpy's legacy global generator, torch's CPU (and CUDA) generators.
    Floats (the cached Gaussians) survive JSON exactly: ``json`` writes their shortest
    round-tripping repr."""
    version, internal, gauss_next = random.getstate()
    name, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
    state = {"python": {"version": version, "state": list(internal), "gauss_next": gauss_next},
             "numpy": {"name": name, "keys": keys.tolist(), "pos": int(pos),
                       "has_gauss": int(has_gauss), "cached_gaussian": float(cached)},
             "torch": _b64(torch.get_rng_state())}
    if torch.cuda.is_available():
        state["cuda"] = [_b64(s) for s in torch.cuda.get_rng_state_all()]
    return state


def set_rng_state(state: dict) -> None:
    """Restore what :func:`rng_state` returned, bit for bit."""
    python, numpy_state = state["python"], state["numpy"]
    random.setstate((python["version"], tuple(python["state"]), python["gauss_next"]))
    np.random.set_state((numpy_state["name"], np.array(numpy_state["keys"], dtype=np.uint32),
                         numpy_state["pos"], numpy_state["has_gauss"],
                         numpy_state["cached_gaussian"]))
    torch.set_rng_state(_from_b64(state["torch"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([_from_b64(s) for s in state["cuda"]])


# -- saving ------------------------------------------------------------------------------------
def _options():
    """Optimizer state flattened to one entry per parameter name (``state.NAME.exp_avg``,
    ``param_groups.NAME.lr``): pipeline stages hold different parameter groups, and DCP would
    keep one rank's unflattened ``param_groups`` list for all of them (loading the wrong
    groups on the other stages); by name, it reshards across layouts as the tensors do."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(flatten_optimizer_state_dict=True)


def saved_state_dict(model, optimizer) -> dict:
    """What DCP writes: {"model": ..., "optim": ...} (live tensors, not copies).

    An optimizer that has not stepped yet has no state to save, so DCP's ``get_state_dict``
    creates it with a zero-lr ``step()``: Adam's moments stay zero but its step counter reads
    1, and the first real update would use the second step's bias correction. That counter
    is set back to 0 (in the optimizer and in what is saved): a step that did not happen is
    never recorded."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    never_stepped = not optimizer.state
    model_state, optim_state = get_state_dict(model, optimizer, options=_options())
    if never_stepped:
        for state in [*optimizer.state.values(), optim_state]:
            _zero_step_counters(state)
    return {"model": model_state, "optim": optim_state}


def _zero_step_counters(state: dict) -> None:
    """Set the ``step`` entries (Adam/LAMB's per-parameter counter) of a parameter's state, or
    of a flattened optimizer state dict (``state.NAME.step``), to 0."""
    for key, value in state.items():
        if key == "step" or key.endswith(".step"):
            if isinstance(value, torch.Tensor):
                value.zero_()
            else:
                state[key] = 0


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
    faults.fire("save", step=pending.step)
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
        with _quiet():
            dcp.save(saved_state_dict(model, optimizer), checkpoint_id=str(pending.partial))
        return finish_save(pending)


# -- finding -----------------------------------------------------------------------------------
def _log_on_first_rank(line: str) -> None:
    if not _distributed() or torch.distributed.get_rank() == 0:
        print(line, file=sys.stderr, flush=True)


def latest_checkpoint(run_dir: str | Path, before_step: int | None = None,
                      log: Callable[[str], object] | None = None, group=None) -> Path | None:
    """The newest checkpoint of a run that verifies, or None.

    Each newer one that does not verify is logged once with its first problem and skipped.
    Collective when the process group is up (verification shares the hashing): all ranks
    call it and get the same answer.

    Args:
        run_dir: The run folder (``train.run_dir``).
        before_step: Only consider checkpoints of steps below this one.
        log: Where the fallback lines go; None: stderr on the first rank.
        group: Process group for the collectives (None: the default group).

    Returns:
        The checkpoint folder, or None when no checkpoint verifies.
    """
    candidates = [p for p in list_checkpoints(run_dir)
                  if before_step is None or int(p.name[5:]) < before_step]
    if _distributed():  # every rank must verify the same folders, in the same order
        box = [candidates]
        torch.distributed.broadcast_object_list(
            box, src=torch.distributed.get_global_rank(group, 0) if group else 0, group=group)
        candidates = box[0]
    for index, path in reversed(list(enumerate(candidates))):
        problems = verify_checkpoint(path, group)
        if not problems:
            return path
        then = "falling back to the previous one" if index else "no older checkpoint"
        (log or _log_on_first_rank)(f"checkpoint {path}: damaged ({problems[0]}); {then}")
    return None


# -- loading -----------------------------------------------------------------------------------
def load_config_of(checkpoint: str | Path, config_cls):
    """The resolved config a checkpoint was written with."""
    import tomllib

    path = Path(checkpoint) / CONFIG_FILE
    if not path.is_file():
        raise UserError(f"{checkpoint}: not a bloomline checkpoint (no {CONFIG_FILE})")
    return config_from_dict(config_cls, tomllib.loads(path.read_text()), str(path))


def check_compatible(saved, current, checkpoint: Path) -> None:
    """Refuse to load weights into a model of another shape (or data of another L/seed)."""
    fields = []
    for section, names in (("model", None), ("data", ("seq_length", "seed", "split"))):
        old, new = asdict(getattr(saved, section)), asdict(getattr(current, section))
        for name in names or old:
            if name in ("hidden_dropout", "attention_dropout", "attention"):
                continue  # numerics that may change on resume
            if old.get(name) != new.get(name):
                fields.append(f"{section}.{name} {old.get(name)!r} -> {new.get(name)!r}")
    if fields:
        raise UserError(f"{checkpoint}: checkpoint from an incompatible config: "
                        + "; ".join(fields))


# settings that name this run's place and tools rather than what it computes: never listed
_NOT_COMPARED = {"train.run_dir", "checkpoint.resume", "checkpoint.init_from",
                 "monitor.peak_flops"}


def changed_settings(saved, current) -> list[str]:
    """``section.key old -> new`` for every setting of ``current`` that differs from the
    config a checkpoint was written with (``check_compatible`` refuses the ones a resume
    cannot change; the rest take this run's value). A relative path in a checkpoint written
    before paths were saved absolute is read from the working directory: not a change when
    it names the same place."""
    saved = copy.deepcopy(saved)
    resolve_paths(saved)

    def leaves(tree: dict, prefix: str = "") -> dict:
        flat = {}
        for key, value in tree.items():
            if isinstance(value, dict) and key != "weights":
                flat.update(leaves(value, f"{prefix}{key}."))
            else:
                flat[f"{prefix}{key.removesuffix('_')}"] = value
        return flat

    old, new = leaves(asdict(saved)), leaves(asdict(current))
    return [f"{key} {old.get(key)!r} -> {value!r}" for key, value in new.items()
            if key not in _NOT_COMPARED and old.get(key) != value]


def load_checkpoint(checkpoint: str | Path, model, optimizer=None, verified: bool = False,
                    group=None) -> dict:
    """Load model (and optimizer) state and the RNG states; returns the trainer state.

    The checkpoint is verified against its manifest first (DCP unpickles ``.metadata``: a
    damaged or swapped file must be refused before that), unless the caller has just done so
    (``latest_checkpoint`` returns verified checkpoints: pass ``verified=True``). Collective
    when the process group is up.

    Raises:
        UserError: The checkpoint does not verify (names its first problem), or a pickle of
            it names a global outside DCP's classes (``TamperedCheckpointError``).
    """
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        set_model_state_dict,
        set_state_dict,
    )

    checkpoint = Path(checkpoint)
    if not verified:
        problems = verify_checkpoint(checkpoint, group)
        if problems:
            more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
            raise UserError(f"{checkpoint}: damaged or incomplete checkpoint: {problems[0]}"
                            f"{more}; run `trainer verify-checkpoint {checkpoint}`")
    if optimizer is None:
        state = {"model": get_model_state_dict(model)}
    else:
        state = saved_state_dict(model, optimizer)
    with _quiet():  # DCP's pickles read with DCP's classes only (metadata.py)
        dcp_load(state, checkpoint)
    trainer_state = json.loads((checkpoint / STATE_FILE).read_text())
    if optimizer is None:
        set_model_state_dict(model, state["model"])
        return trainer_state
    set_state_dict(model, optimizer, model_state_dict=state["model"],
                   optim_state_dict=state["optim"], options=_options())
    set_rng_state(json.loads((checkpoint / RNG_FILE).read_text()))
    return trainer_state
