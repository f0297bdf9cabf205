"""The run, settled once: ``settle(config, world_size, rank)`` turns a loaded config into a
``RunSpec`` that every later part reads and nothing changes.

What settling decides, in this order, each exactly once:

1. the model's shape (``model_source.py``): the recipe's, the checkpoint's a run resumes, or
   the one ``checkpoint.init_from`` starts from;
2. the vocabulary: ``model.vocab_size = 0`` becomes the tokenizer's, padded to 128 x tp, and
   the tokenizer is checked against the model and the corpus's fingerprints;
3. the precision: ``precision.dtype = "auto"`` becomes what the device computes fast;
4. the layout and every rule between fields (``config_rules.py``): one UserError naming the
   fields for the first that fails.

The spec's config is a copy, frozen (assigning a field raises): ``trainer pretrain`` runs
it, ``trainer config`` prints it, checkpoints record it, ``trainer plan`` builds from it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

from bloomline.common.config_loader import freeze, load_config, thawed_copy
from bloomline.common.errors import UserError
from bloomline.trainer.config import Config, load_trainer_config
from bloomline.trainer.config_rules import resolve_layout
from bloomline.trainer.data import check_vocabulary, load_run_tokenizer
from bloomline.trainer.data.end_of_document import (
    masks_documents,
    missing_eod,
    run_eod_id,
)
from bloomline.trainer.model.config import padded_vocab_size
from bloomline.trainer.model_source import (
    ModelSource,
    resolve_model_settings,
    vocabulary_advice,
)
from bloomline.trainer.parallel.mesh import Layout
from bloomline.trainer.precision import resolve_dtype

__all__ = ["RunSpec", "load_run", "model_overrides", "run_device", "settle"]


@dataclass(frozen=True)
class RunSpec:
    """A settled run: ``config`` (frozen), this rank's ``layout``, where the model comes from
    (``model_source``), the ``device`` it was settled for and ``warnings`` to tell the user
    (an explicit precision the device runs slowly). ``eod_id``: the end-of-document id when
    the run masks documents (``data.reset_attention_mask``, ``data.eod_mask_loss``; None
    when it does not, or when a spec settled without the tokenizer check could not find it)."""

    config: Config
    layout: Layout
    model_source: ModelSource
    device: torch.device
    warnings: tuple[str, ...] = ()
    eod_id: int | None = None


def run_device(name: str) -> torch.device:
    """The device type ``train.device`` names on this machine (``auto``: cuda when
    available), without selecting a GPU: what the precision is settled for."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise UserError(f"train.device = {name!r}: CUDA is not available on this machine")
    return torch.device(name)


def model_overrides(overrides: Iterable[str]) -> dict[str, object]:
    """The ``model.*`` values among command-line ``section.key=value`` overrides, parsed as
    the config parses them: the ones that must not contradict the model a run starts from."""
    given = [text for text in overrides if _override_key(text).startswith("model.")]
    model = load_config(Config, None, given).model
    return {key: getattr(model, key.removeprefix("model.")) for key in map(_override_key, given)}


def _override_key(text: str) -> str:
    return text.split("=", 1)[0].strip().removeprefix("--")


def settle(cfg: Config, world_size: int = 1, rank: int = 0, *,
           device: torch.device | str | None = None,
           explicit: Mapping[str, object] | None = None, check_tokenizer: bool = True,
           log: Callable[[str], object] | None = None) -> RunSpec:
    """The ``RunSpec`` of rank ``rank`` in a ``world_size``-process run of ``cfg`` (a loaded
    config: ``config.load_trainer_config``; left as it is).

    Args:
        device: what the precision is settled for (default: ``train.device`` on this machine);
            ``cuda`` on a machine without one plans for a GPU (bf16 for ``auto``).
        explicit: ``model.*`` values given on the command line (``model_overrides``): one
            that contradicts the checkpoint or model the run starts from is an error.
        check_tokenizer: check the tokenizer against the model's vocabulary and the corpus's
            fingerprints. ``trainer config`` and the planner, which show runs whose files may
            live elsewhere, pass False: the tokenizer is then read only to size a vocabulary
            of 0, and when it is not there the size stays 0 (the recipe's, as given).
        log: where the model source's notes go (``init_from`` ignored on resume).

    Raises:
        UserError: the first rule that fails, naming the fields.
    """
    cfg = thawed_copy(cfg)
    device = run_device(cfg.train.device) if device is None else torch.device(device)
    source = resolve_model_settings(cfg, explicit, log=log)
    warnings = _settle_precision(cfg, device)
    # every rule between fields, once (a vocabulary of 0 is skipped: it is sized next, to a
    # multiple of 128 x tp)
    layout = resolve_layout(cfg, world_size, rank)
    _settle_vocabulary(cfg, check_tokenizer, log,
                       vocabulary_advice(source, cfg.model.vocab_size))
    eod_id = _settle_documents(cfg, check_tokenizer)
    return RunSpec(freeze(cfg), layout, source, device, warnings, eod_id)


def _settle_precision(cfg: Config, device: torch.device) -> tuple[str, ...]:
    """``precision.dtype`` ``auto`` resolved for ``device``; a warning for an explicit dtype
    the device runs slowly. A GPU planned from a machine without one: bf16 (every GPU the
    planner knows computes it natively)."""
    if device.type == "cuda" and not torch.cuda.is_available():
        if cfg.precision.dtype == "auto":
            cfg.precision.dtype = "bf16"
        return ()
    warning = resolve_dtype(cfg.precision, device)
    return (warning,) if warning else ()


def _settle_vocabulary(cfg: Config, check: bool, log: Callable[[str], object] | None = None,
                       fixed_shape: str | None = None) -> None:
    """model.vocab_size 0 means: the tokenizer's vocabulary (its largest id + 1, which counts
    added tokens above the base vocabulary) padded to a multiple of 128 x tp. With ``check``
    the tokenizer is then checked against it and against the corpus (what the check of
    files without a fingerprint read goes to ``log``)."""
    if cfg.model.vocab_size == 0:
        if not check and not (cfg.data.tokenizer and _exists(cfg.data.tokenizer)):
            return  # shown as given: the tokenizer lives where the run will
        if not cfg.data.tokenizer:
            raise UserError("model.vocab_size = 0 needs data.tokenizer to size the vocabulary")
        cfg.model.vocab_size = padded_vocab_size(load_run_tokenizer(cfg.data).vocab_size,
                                                 tensor_parallel=cfg.parallel.tensor_parallel)
    if check:
        check_vocabulary(cfg.data, cfg.model.vocab_size, log, fixed_shape)


def _settle_documents(cfg: Config, check: bool) -> int | None:
    """The EOD id of a run that masks documents (``data/end_of_document.py``); without it a
    UserError when ``check``, else None (the planner and ``trainer config``: the files may
    live elsewhere; ``build_run`` refuses a real run without it)."""
    if not masks_documents(cfg.data):
        return None
    eod_id = run_eod_id(cfg.data)
    if eod_id is None and check:
        raise missing_eod(cfg.data)
    return eod_id


def _exists(tokenizer: str) -> bool:
    """A tokenizer setting that names a file or folder that exists, or a named one
    (``tiktoken:NAME``)."""
    return tokenizer.startswith("tiktoken:") or Path(tokenizer).exists()


def load_run(path, overrides: list[str] | None = None, world_size: int | None = None,
             rank: int = 0, **settle_options) -> RunSpec:
    """The run a command line describes: the recipe ``path`` with ``section.key=value``
    ``overrides`` (``config.load_trainer_config``), settled for ``world_size`` processes
    (default: the recipe's ``parallel.world_size``, else the smallest world of its layout),
    its ``model.*`` overrides held against the model the run starts from. ``settle_options``:
    as ``settle``'s."""
    overrides = list(overrides or [])
    cfg = load_trainer_config(path, overrides)
    if world_size is None:
        p = cfg.parallel
        world_size = p.world_size or (p.tensor_parallel * p.pipeline_parallel
                                      * max(1, p.data_parallel))
    return settle(cfg, world_size, rank, explicit=model_overrides(overrides), **settle_options)
