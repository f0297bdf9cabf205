"""A checkpoint's config against this run's: the config it was written with
(``load_config_of``), the settings a resume cannot change (``check_compatible``) and the ones
it takes from this run (``changed_settings``).

Apart from the load because it reads only ``config.toml``, no tensor: the trainer decides
what to load (and refuses a model of another shape) before DCP touches anything.
"""

from __future__ import annotations

import copy
from dataclasses import asdict
from pathlib import Path

from bloomline.common.config_loader import config_from_dict, resolve_paths
from bloomline.common.errors import UserError
from bloomline.trainer.checkpoint.layout import CONFIG_FILE
from bloomline.trainer.checkpoint.manifest import refuse_damaged, small_file_problems
from bloomline.trainer.checkpoint.path_kind import refuse_non_checkpoint

__all__ = ["changed_settings", "check_compatible", "load_config_of"]


def load_config_of(checkpoint: str | Path, config_cls):
    """The resolved config a checkpoint was written with, read only once the checkpoint's
    manifest, file sizes and small files agree (``small_file_problems``): every reader
    (generate, export-hf, evaluate, resume, ``checkpoint.init_from``) builds its model from
    this config, and an edited one would be allocated before the full verification (in
    ``load_checkpoint``) could refuse it.

    Raises:
        UserError: Not a checkpoint (``path_kind.py`` says what it is), no ``config.toml``,
            or the checkpoint is damaged (its first problem).
    """
    import tomllib

    refuse_non_checkpoint(checkpoint, "read")
    path = Path(checkpoint) / CONFIG_FILE
    if not path.is_file():
        raise UserError(f"{checkpoint}: not a bloomline checkpoint (no {CONFIG_FILE})")
    refuse_damaged(checkpoint, small_file_problems(checkpoint))
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
