"""Checkpoints: ``RUN/checkpoints/step_NNNNNNNN/`` with

- the model and optimizer state through torch.distributed.checkpoint (DCP): sharded per rank
  when the model is, and loadable into another layout (issue [5] reshards through it);
- ``trainer_state.json``: step, consumed samples and tokens, bad-step counters, loss-scaler
  state; the LR schedule is a function of these counters, so it needs nothing more;
- ``rng.pt``: the python, numpy, torch (and CUDA) generator states;
- ``config.toml``: the resolved config the run was started with.

A checkpoint is written into a hidden ``.step_N.partial`` folder and renamed when complete:
a crash leaves no folder that looks like a checkpoint. ``latest_checkpoint`` only returns
complete ones; older ones beyond ``keep_last`` are deleted after each save.
"""

from __future__ import annotations

import json
import random
import re
import shutil
import warnings
from pathlib import Path

import numpy as np
import torch

from bloomline.common.config import config_from_dict, to_toml
from bloomline.common.errors import UserError

__all__ = ["latest_checkpoint", "load_checkpoint", "save_checkpoint", "load_config_of",
           "check_compatible"]

_NAME = re.compile(r"^step_(\d{8})$")
STATE_FILE = "trainer_state.json"


def _dcp():
    import torch.distributed.checkpoint as dcp

    return dcp


def _quiet():
    """DCP warns on every call that it runs without a process group; that is intended here."""
    context = warnings.catch_warnings()
    context.__enter__()
    warnings.filterwarnings("ignore", message=".*torch.distributed is disabled.*")
    return context


def _rng_state() -> dict:
    state = {"python": random.getstate(), "numpy": np.random.get_state(),
             "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _options():
    """Optimizer state flattened to one entry per parameter name (``state.NAME.exp_avg``,
    ``param_groups.NAME.lr``): pipeline stages hold different parameter groups, and DCP would
    keep one rank's unflattened ``param_groups`` list for all of them (loading the wrong
    groups on the other stages); by name, it reshards across layouts as the tensors do."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(flatten_optimizer_state_dict=True)


def save_checkpoint(run_dir: str | Path, step: int, model, optimizer, trainer_state: dict,
                    config, keep_last: int, is_writer: bool = True) -> Path:
    """Write checkpoint ``step`` atomically and prune to the newest ``keep_last``."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    root = Path(run_dir) / "checkpoints"
    final = root / f"step_{step:08d}"
    partial = root / f".step_{step:08d}.partial"
    if is_writer:
        shutil.rmtree(partial, ignore_errors=True)
        # exist_ok: the other ranks' DCP writers create it too, maybe first (before planning)
        partial.mkdir(parents=True, exist_ok=True)
    model_state, optim_state = get_state_dict(model, optimizer, options=_options())
    context = _quiet()
    try:
        _dcp().save({"model": model_state, "optim": optim_state}, checkpoint_id=str(partial))
    finally:
        context.__exit__(None, None, None)
    if is_writer:
        (partial / STATE_FILE).write_text(json.dumps(trainer_state, indent=1))
        torch.save(_rng_state(), partial / "rng.pt")
        (partial / "config.toml").write_text(to_toml(config))
        if final.exists():  # a re-run of the same step replaces it
            shutil.rmtree(final)
        partial.rename(final)
        for old in sorted(_complete(root))[:-keep_last] if keep_last > 0 else []:
            shutil.rmtree(old, ignore_errors=True)
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        # no rank returns before the writer has renamed the folder: a rank that went on to
        # load it, list it or exit (ending the job) would otherwise race the rename
        torch.distributed.barrier()
    return final


def _complete(root: Path) -> list[Path]:
    if not root.is_dir():
        return []
    return [p for p in root.iterdir()
            if _NAME.match(p.name) and (p / STATE_FILE).is_file() and (p / ".metadata").is_file()]


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    found = sorted(_complete(Path(run_dir) / "checkpoints"))
    return found[-1] if found else None


def load_config_of(checkpoint: str | Path, config_cls):
    """The resolved config a checkpoint was written with."""
    import tomllib

    path = Path(checkpoint) / "config.toml"
    if not path.is_file():
        raise UserError(f"{checkpoint}: not a bloomline checkpoint (no config.toml)")
    return config_from_dict(config_cls, tomllib.loads(path.read_text()), str(path))


def check_compatible(saved, current, checkpoint: Path) -> None:
    """Refuse to load weights into a model of another shape (or data of another L/seed)."""
    from dataclasses import asdict

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


def load_checkpoint(checkpoint: str | Path, model, optimizer=None) -> dict:
    """Load model (and optimizer) state and the RNG states; returns the trainer state."""
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    checkpoint = Path(checkpoint)
    state_path = checkpoint / STATE_FILE
    if not state_path.is_file():
        raise UserError(f"{checkpoint}: not a complete checkpoint (no {STATE_FILE})")
    if optimizer is None:
        from torch.distributed.checkpoint.state_dict import (
            get_model_state_dict,
            set_model_state_dict,
        )

        state = {"model": get_model_state_dict(model)}
    else:
        model_state, optim_state = get_state_dict(model, optimizer, options=_options())
        state = {"model": model_state, "optim": optim_state}
    context = _quiet()
    try:
        _dcp().load(state, checkpoint_id=str(checkpoint))
    finally:
        context.__exit__(None, None, None)
    if optimizer is None:
        set_model_state_dict(model, state["model"])
        return json.loads(state_path.read_text())
    set_state_dict(model, optimizer, model_state_dict=state["model"],
                   optim_state_dict=state["optim"], options=_options())
    _set_rng_state(torch.load(checkpoint / "rng.pt", weights_only=False))
    return json.loads(state_path.read_text())
