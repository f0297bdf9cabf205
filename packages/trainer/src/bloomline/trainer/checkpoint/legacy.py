"""Checkpoints of the format before manifests (bloomline until 2026-11-25), upgraded into
today's by ``trainer upgrade-checkpoint OLD NEW``; never loaded as they are.

What such a checkpoint differs in (its golden checkpoints, under the trainer's
``tests/checkpoint/golden/``, say from which commits):

- no ``manifest.json``: nothing can tell a complete, intact one from a damaged one;
- the generator states in ``rng.pt``, a pickle (``torch.save`` of Python's, numpy's and
  torch's states), where today's ``rng.json`` is plain JSON;
- until 2026-11-22 (pipeline parallelism), the optimizer's ``param_groups`` saved as DCP's
  list, ``optim.param_groups.N.KEY`` with the parameters' names in ``...N.params``, where
  today's are saved by parameter name, ``optim.param_groups.NAME.KEY``; the moments
  (``optim.state.NAME.KEY``) and the weights (``model.NAME``) are the same.

Why a command and not a fallback of the load: every load verifies a checkpoint against its
manifest before reading anything from it, and reads no pickle but DCP's, restricted
(``metadata.py``). An old folder has neither guarantee; upgrading it is the one deliberate
step that reads ``rng.pt`` (with ``torch.load(weights_only=True)``, numpy's arrays admitted)
and vouches for the files by writing a manifest of the new copy. The copy holds the same
tensors, bit for bit, and the same generator states, step, samples and config: resuming it
continues the old run as the old version would have.

The whole state passes through this process's memory once (DCP reads every shard; the
copy is written as one process's checkpoint, which DCP reshards on load to any layout).
"""

from __future__ import annotations

import base64
import json
import re
import shutil
from pathlib import Path

import numpy as np
import torch
import torch.distributed.checkpoint as dcp

from bloomline.common.errors import UserError
from bloomline.trainer.checkpoint.dcp_state import dcp_quiet
from bloomline.trainer.checkpoint.layout import (
    CONFIG_FILE,
    LEGACY_RNG_FILE,
    RNG_FILE,
    STATE_FILE,
    is_legacy_checkpoint,
)
from bloomline.trainer.checkpoint.manifest import MANIFEST, fsync_dir, write_manifest
from bloomline.trainer.checkpoint.metadata import (
    METADATA_FILE,
    check_pickles,
    dcp_load,
    read_metadata,
)
from bloomline.trainer.checkpoint.path_kind import refuse_non_checkpoint
from bloomline.trainer.checkpoint.rng_state import rng_problems
from bloomline.trainer.train_state import TrainState

__all__ = ["upgrade_checkpoint"]

_GROUP_ENTRY = re.compile(r"^optim\.param_groups\.(\d+)\.(\w+)$")
# what np.random.get_state() pickles into: an ndarray of uint32, by numpy 1's and 2's names
_NUMPY_GLOBALS = [np.ndarray, np.dtype, type(np.dtype(np.uint32)),
                  (np._core.multiarray._reconstruct, "numpy.core.multiarray._reconstruct"),
                  np._core.multiarray._reconstruct]


def _b64(state: torch.Tensor) -> str:
    return base64.b64encode(state.numpy().tobytes()).decode("ascii")


def _rng_json(path: Path) -> dict:
    """``rng.pt``'s states as ``rng.json`` holds them (``rng_state.rng_state``'s layout)."""
    try:
        with torch.serialization.safe_globals(_NUMPY_GLOBALS):
            old = torch.load(path, map_location="cpu", weights_only=True)
        python, numpy_state = old["python"], old["numpy"]
        state = {"python": {"version": int(python[0]), "state": [int(v) for v in python[1]],
                            "gauss_next": python[2]},
                 "numpy": {"name": str(numpy_state[0]),
                           "keys": [int(v) for v in np.asarray(numpy_state[1])],
                           "pos": int(numpy_state[2]), "has_gauss": int(numpy_state[3]),
                           "cached_gaussian": float(numpy_state[4])},
                 "torch": _b64(old["torch"])}
        if "cuda" in old:
            state["cuda"] = [_b64(s) for s in old["cuda"]]
    except Exception as err:  # noqa: BLE001 - whatever a damaged or foreign file raises
        text = (str(err).strip().splitlines() or [""])[0][:300]
        raise UserError(f"{path}: not the generator states an old bloomline saved "
                        f"({type(err).__name__}: {text})") from None
    problems = rng_problems(state)
    if problems:
        raise UserError(f"{path}: {problems[0]}")
    return state


def _read_state(source: Path) -> dict:
    """Every entry of the checkpoint's DCP files, by its name: tensors and values."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    sizes = {p.name: p.stat().st_size for p in source.iterdir() if p.is_file()}
    problems = check_pickles(source, sizes)  # the entries inside their files, no transforms
    if problems:
        raise UserError(f"{source}: {problems[0]}")
    state: dict = {}
    for fqn, item in read_metadata(source).state_dict_metadata.items():
        state[fqn] = (torch.empty(tuple(item.size), dtype=item.properties.dtype)
                      if isinstance(item, TensorStorageMetadata) else None)
    with dcp_quiet():
        dcp_load(state, source)
    return state


def _param_groups_by_name(state: dict) -> dict:
    """The optimizer's ``param_groups`` as today's saves name them (by parameter), from DCP's
    list (``optim.param_groups.N.KEY`` and ``...N.params``); a state by name already is
    returned as it is."""
    groups: dict[str, dict[str, object]] = {}
    for fqn in list(state):
        found = _GROUP_ENTRY.match(fqn)
        if found:
            groups.setdefault(found.group(1), {})[found.group(2)] = state.pop(fqn)
    for index, group in sorted(groups.items()):
        names = group.pop("params", None)
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise UserError(f"optim.param_groups.{index}.params: {names!r} is not a list of "
                            "parameter names")
        for name in names:
            for key, value in group.items():
                state[f"optim.param_groups.{name}.{key}"] = value
    return state


def upgrade_checkpoint(source: str | Path, target: str | Path) -> Path:
    """Write ``target``: checkpoint ``source`` (of the format before manifests) in today's
    format, verified by its manifest; ``source`` is left as it is. Returns ``target``.

    Raises:
        UserError: ``source`` is not such a checkpoint (today's, or not one at all), a file of
            it does not read as an old save wrote it, or ``target`` exists.
    """
    source, target = Path(source), Path(target)
    refuse_non_checkpoint(source, "upgrade-checkpoint")
    if (source / MANIFEST).is_file():
        raise UserError(f"{source}: has a {MANIFEST}: a checkpoint of today's format, nothing "
                        "to upgrade (`trainer verify-checkpoint` checks it)")
    if not is_legacy_checkpoint(source):
        raise UserError(f"{source}: not a bloomline checkpoint of the format before manifests "
                        f"(it has {LEGACY_RNG_FILE}, {METADATA_FILE}, {STATE_FILE} and "
                        f"{CONFIG_FILE})")
    if target.exists():
        raise UserError(f"{target}: exists; upgrade into a new folder")
    for name in (STATE_FILE, CONFIG_FILE):
        if not (source / name).is_file():
            raise UserError(f"{source}: no {name}; not a complete checkpoint")
    try:
        trainer_state = json.loads((source / STATE_FILE).read_text())
    except (ValueError, UnicodeDecodeError) as err:
        raise UserError(f"{source / STATE_FILE}: does not parse ({err})") from None
    problems = TrainState.problems(trainer_state)
    if problems:
        raise UserError(f"{source / STATE_FILE}: {problems[0]}")
    rng = _rng_json(source / LEGACY_RNG_FILE)
    state = _param_groups_by_name(_read_state(source))
    partial = target.parent / f".{target.name}.partial"
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    try:
        with dcp_quiet():
            dcp.save(state, checkpoint_id=str(partial))
        (partial / STATE_FILE).write_text(json.dumps(trainer_state, indent=1))
        (partial / RNG_FILE).write_text(json.dumps(rng))
        shutil.copyfile(source / CONFIG_FILE, partial / CONFIG_FILE)
        write_manifest(partial, int(trainer_state.get("step", 0)), is_writer=True)
        partial.rename(target)
        fsync_dir(target.parent)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return target
