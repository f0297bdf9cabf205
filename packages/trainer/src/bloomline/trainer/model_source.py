"""Where a run's model comes from before its first step: its recipe, a checkpoint it resumes,
or an existing model it starts from (``checkpoint.init_from``).

Two halves, around building the model:

- :func:`resolve_model_settings` (before the model is built) decides the ``[model]`` section.
  A run that resumes takes the architecture its checkpoint was trained with; a run that starts
  from ``init_from`` takes the source's. The recipe keeps the fields that only say how to
  compute (kernels, fp32 islands, dropout).
- :func:`load_initial_weights` (after the model is built and parallelized, on every rank)
  copies the source's weights into whatever layout this run has. Nothing else is taken from
  the source: the optimizer starts empty (Adam's step 0, zero moments), the run at step 0 and
  sample 0, as torchtitan's ``initial_load_path`` and Megatron's ``--finetune`` do.

The source is a transformers BLOOM folder (``config.json`` + safetensors) or a bloomline
checkpoint folder of any layout (DCP reshards it).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from bloomline.common.errors import UserError
from bloomline.trainer import checkpoint as ckpt
from bloomline.trainer.checkpoint.manifest import small_file_problems
from bloomline.trainer.checkpoint.path_kind import classify, refuse_non_checkpoint
from bloomline.trainer.hf import import_hf, read_model_config
from bloomline.trainer.hf.load import check_model_size
from bloomline.trainer.master_weights import master_weights_of
from bloomline.trainer.model.config import ModelConfig

__all__ = ["ARCHITECTURE_FIELDS", "ModelSource", "load_initial_weights",
           "resolve_model_settings", "vocabulary_advice"]

# The fields that describe the weights: they come from the checkpoint or model a run starts
# from. The other ModelConfig fields say how to compute with those weights and stay the
# recipe's.
ARCHITECTURE_FIELDS = ("vocab_size", "hidden_size", "num_layers", "num_heads",
                       "ffn_hidden_size", "layernorm_epsilon", "init_std")


@dataclass(frozen=True)
class ModelSource:
    """What the model settings were taken from. ``kind`` is ``resume`` (a checkpoint of this
    run), ``init`` (``checkpoint.init_from``) or ``recipe``; ``format`` of an init source is
    ``hf`` or ``bloomline``."""

    kind: str
    path: Path | None = None
    format: str = ""


def _source_format(path: Path) -> str:
    """``hf`` or ``bloomline``, from the files the folder holds."""
    found = classify(path)
    if found.kind == "hf":
        return "hf"
    refuse_non_checkpoint(path, "checkpoint.init_from", f"checkpoint.init_from {path}")
    return "bloomline"


def _source_model(path: Path, fmt: str, recipe: ModelConfig, config_cls: type) -> ModelConfig:
    """The model settings a source holds, on top of the recipe's compute fields."""
    if fmt == "hf":
        model = read_model_config(path, recipe)
        # before the run builds anything of that size: a config that its weight files
        # cannot back, or a model this machine cannot load, is refused here in one line
        check_model_size(path, model)
        return model
    return ckpt.load_config_of(path, config_cls).model


def _resume_candidate(cfg) -> Path | None:
    """The checkpoint a resume would start from, found without hashing its shards: the
    newest complete one of the run whose manifest and small files agree (``auto``; an older
    one may be used if a shard is damaged, but all of a run's checkpoints share the model
    settings), the folder given, or None."""
    setting = cfg.checkpoint.resume
    if setting == "none":
        return None
    if setting == "auto":
        # a damaged newest config must not settle the model: the resume falls back past it
        return next((path for path in reversed(ckpt.list_checkpoints(cfg.train.run_dir))
                     if not small_file_problems(path)), None)
    path = Path(setting)
    if path.exists():  # a missing one: refused at the load (trainer config shows it as given)
        refuse_non_checkpoint(path, "checkpoint.resume", f"checkpoint.resume {path}")
    return path if (path / ckpt.CONFIG_FILE).is_file() else None


def _adopt(recipe: ModelConfig, source: ModelConfig, explicit: Mapping[str, object],
           where: str) -> ModelConfig:
    """The recipe with the source's architecture fields; a command-line override of one of
    those that says otherwise is an error naming both."""
    for name in ARCHITECTURE_FIELDS:
        key = f"model.{name}"
        if key in explicit and explicit[key] != getattr(source, name):
            raise UserError(f"{key} = {explicit[key]!r} contradicts {where}, which has "
                            f"{getattr(source, name)!r}; drop the override (the model's "
                            "shape comes from the model the run starts from)")
    return dataclasses.replace(recipe, **{name: getattr(source, name)
                                          for name in ARCHITECTURE_FIELDS})


def resolve_model_settings(cfg, explicit: Mapping[str, object] | None = None,
                           log: Callable[[str], object] | None = None) -> ModelSource:
    """Settle ``cfg.model`` before the model is built (idempotent; every rank computes the
    same from the same files).

    - Resuming (``checkpoint.resume`` finds a checkpoint): ``checkpoint.init_from`` is
      ignored. With ``init_from`` set the architecture is the checkpoint's (the run's model
      never was the recipe's); with ``model.vocab_size = 0`` the checkpoint's padded
      vocabulary is kept, so that a run resumed under another tensor-parallel size keeps the
      rows it was trained with. Any other difference is refused when the checkpoint loads.
    - Starting (``init_from`` set, nothing to resume): the source's architecture replaces
      the recipe's.

    Args:
        cfg: the trainer config; ``cfg.model`` is replaced in place.
        explicit: the ``model.*`` values given as command-line overrides; one that contradicts
            the source is an error.
        log: where the line saying ``init_from`` is ignored goes.
    """
    explicit = explicit or {}
    init_from = cfg.checkpoint.init_from
    resume_from = _resume_candidate(cfg)
    if resume_from is not None:
        if init_from or cfg.model.vocab_size == 0:
            saved = ckpt.load_config_of(resume_from, type(cfg)).model
            if init_from:
                cfg.model = _adopt(cfg.model, saved, explicit, f"the checkpoint {resume_from}")
                if log is not None:
                    log(f"checkpoint.init_from {init_from}: ignored, the run folder has "
                        f"checkpoints to resume ({resume_from.name})")
            else:
                cfg.model.vocab_size = saved.vocab_size
        return ModelSource("resume", resume_from)
    if not init_from:
        return ModelSource("recipe")
    path = Path(init_from)
    fmt = _source_format(path)
    cfg.model = _adopt(cfg.model, _source_model(path, fmt, cfg.model, type(cfg)), explicit,
                       f"checkpoint.init_from {path}")
    return ModelSource("init", path, fmt)


def _source_tokenizer(source: ModelSource) -> str | None:
    """The tokenizer the source's model was trained with, where its folder holds it."""
    if source.format == "hf":
        for name in ("tokenizer.model", "tokenizer.json"):
            if (source.path / name).is_file():
                return str(source.path / name)
        return None
    copy = ckpt.copied_tokenizer(source.path)
    return str(copy) if copy is not None else None


def vocabulary_advice(source: ModelSource, rows: int) -> str | None:
    """What can fit a tokenizer larger than the model's ``rows`` embedding rows when the
    model's shape is the source's (None: it is the recipe's, and ``model.vocab_size`` can
    grow). Nothing here resizes an embedding: the advice is a tokenizer that fits."""
    if source.kind == "recipe":
        return None
    own = _source_tokenizer(source)
    fits = f"the one it was trained with, data.tokenizer={own}" if own else \
        "the one it was trained with"
    if source.kind == "init":
        return (f"the model's shape comes from checkpoint.init_from {source.path}, so "
                f"model.vocab_size cannot change: use a tokenizer of at most {rows} tokens "
                f"({fits}), or train a new model without checkpoint.init_from (bloomline does "
                "not resize an embedding)")
    return (f"the model's shape comes from the checkpoint this run resumes, {source.path}, so "
            f"model.vocab_size cannot change: use a tokenizer of at most {rows} tokens "
            f"({fits}), or start a new run in another train.run_dir")


def load_initial_weights(model, source: ModelSource, group=None) -> None:
    """Copy the weights of an ``init`` source into ``model`` (this rank's part of it, in any
    layout: tp/dp shards, a pipeline stage). Collective when the process group is up."""
    if source.kind != "init":
        return
    if source.format == "bloomline":
        ckpt.load_checkpoint(source.path, model, group=group)
        return
    # imported here: DCP's state-dict helpers load DTensor's operator tables (about a second),
    # which the processes that only read a config (the launcher) do not need
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        set_model_state_dict,
    )

    _, full = import_hf(source.path)
    # a pipeline stage holds some of the layers: give it those (under the single-process
    # names the stage keeps); every name it holds must be in the source
    wanted = get_model_state_dict(model).keys()
    missing = sorted(set(wanted) - set(full))
    if missing:
        raise UserError(f"checkpoint.init_from {source.path}: no tensor for "
                        f"{', '.join(missing[:3])}")
    engine = master_weights_of(model)
    if engine is not None:  # the buffers engine: the fp32 masters take the source's values
        engine.load_full(full, {param: name for name, param in model.named_parameters()})
        return
    set_model_state_dict(model, {name: full[name] for name in wanted},
                         options=StateDictOptions(full_state_dict=True))
