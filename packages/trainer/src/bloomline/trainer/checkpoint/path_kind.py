"""What a path given where one checkpoint is expected really is, said in one line with what to
do: a path that does not exist (and, under a run's ``checkpoints/``, the steps that do), a
run folder or its ``checkpoints/`` folder (and their checkpoints), a transformers model
folder (and what the command can do with it), or a checkpoint (then nothing is said here:
a damaged one gets the manifest's own message when it is read).

Every command that takes a checkpoint path asks this module first (``generate``,
``export-hf``, ``evaluate``, ``verify-checkpoint``, ``upgrade-checkpoint``,
``checkpoint.resume``, ``checkpoint.init_from``), so a wrong path reads the same everywhere.
A command that only reads a model (``READS_LATEST``) takes a run folder as Megatron's
``--load`` takes its save folder: its newest checkpoint that verifies, said in a line. The
others want the step named: a resume or ``init_from`` is recorded in the run's config and
must say which weights it started from, ``verify-checkpoint`` checks the one it is given
(the newest that verifies would hide a damaged one), and ``upgrade-checkpoint`` converts one.
"""

from __future__ import annotations

import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bloomline.common.errors import UserError
from bloomline.trainer.checkpoint.discovery import latest_checkpoint
from bloomline.trainer.checkpoint.layout import (
    CONFIG_FILE,
    LEGACY_RNG_FILE,
    STATE_FILE,
    checkpoint_step,
    is_checkpoint_name,
    legacy_checkpoints,
    list_checkpoints,
)
from bloomline.trainer.checkpoint.manifest import MANIFEST

__all__ = ["READS_LATEST", "CheckpointPath", "checkpoint_to_read", "classify",
           "path_problem", "refuse_non_checkpoint"]

# the commands that take a run folder for its newest checkpoint (module docstring)
READS_LATEST = frozenset({"generate", "export-hf", "evaluate"})
# files only a checkpoint holds (a run folder holds config.toml too)
_CHECKPOINT_FILES = (MANIFEST, ".metadata", STATE_FILE, LEGACY_RNG_FILE)
_RUN_FILES = ("metrics.jsonl", "run_info.json", "summary.json")


@dataclass(frozen=True)
class CheckpointPath:
    """A path as found: ``kind`` is ``checkpoint``, ``missing``, ``file``, ``run`` (a run
    folder), ``checkpoints`` (a run's ``checkpoints/``), ``hf`` (a transformers model folder)
    or ``other``; ``run`` the run whose checkpoints ``steps`` (complete, oldest first) and
    ``legacy`` (of the format before manifests) lists, where there is one."""

    path: Path
    kind: str
    run: Path | None = None
    steps: tuple[Path, ...] = ()
    legacy: tuple[Path, ...] = ()


def _with_run(path: Path, kind: str, run: Path) -> CheckpointPath:
    return CheckpointPath(path, kind, run, tuple(list_checkpoints(run)),
                          tuple(legacy_checkpoints(run)))


def classify(path: str | Path) -> CheckpointPath:
    """What ``path`` is, from the names of the files it holds (nothing is parsed)."""
    path = Path(path)
    if not path.exists():
        run = path.parent.parent if path.parent.name == "checkpoints" else None
        return (_with_run(path, "missing", run) if run is not None and path.parent.is_dir()
                else CheckpointPath(path, "missing"))
    if not path.is_dir():
        return CheckpointPath(path, "file")
    if is_checkpoint_name(path.name) or any((path / name).exists() for name in _CHECKPOINT_FILES):
        return CheckpointPath(path, "checkpoint")
    if (path / "checkpoints").is_dir() or any((path / name).is_file() for name in _RUN_FILES):
        return _with_run(path, "run", path)
    if path.name == "checkpoints" and any(is_checkpoint_name(p.name) for p in path.iterdir()):
        return _with_run(path, "checkpoints", path.parent)
    if (path / "config.json").is_file():
        return CheckpointPath(path, "hf")
    if (path / CONFIG_FILE).is_file():  # a checkpoint without its other files: damaged
        return CheckpointPath(path, "checkpoint")
    return CheckpointPath(path, "other")


def _names(paths: tuple[Path, ...]) -> str:
    return ", ".join(p.name for p in paths)


def _keep_last(run: Path) -> int | None:
    """The run's ``checkpoint.keep_last`` as its run folder's config says, if it says."""
    try:
        value = tomllib.loads((run / CONFIG_FILE).read_text())["checkpoint"]["keep_last"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return value if isinstance(value, int) else None


def _missing(found: CheckpointPath) -> str:
    line = "no such file or folder"
    if found.run is None:
        return line
    folder = found.run / "checkpoints"
    if not found.steps:
        return f"{line}; {folder} holds no complete checkpoint"
    keep = _keep_last(found.run)
    step = checkpoint_step(found.path.name)
    older = step is not None and step < checkpoint_step(found.steps[0].name)
    why = (f" (checkpoint.keep_last = {keep} keeps the newest {keep}: older ones are deleted "
           "as new ones are saved)" if keep and older else "")
    return f"{line}; {folder} has {_names(found.steps)}{why}"


def _run_folder(found: CheckpointPath, use: str) -> str:
    what = "a run folder" if found.kind == "run" else "a run's checkpoints folder"
    if use == "upgrade-checkpoint":
        if not found.legacy:
            return (f"is {what}, and it holds no checkpoint of the format before manifests "
                    "(nothing to upgrade)")
        return (f"is {what}; its checkpoints of the format before manifests: "
                f"{_names(found.legacy)}; give one of them, e.g. {found.legacy[-1]}")
    if not found.steps:
        return (f"is {what} without a complete checkpoint (none was saved yet: "
                "checkpoint.interval, or the run's end, saves one)")
    line = (f"is {what}; its checkpoints: {_names(found.steps)} (latest: "
            f"{found.steps[-1].name}); give one of them, e.g. {found.steps[-1]}")
    if use == "checkpoint.resume":
        line += f" (or, to continue that run, train.run_dir={found.run} --resume auto)"
    return line


_HF_ADVICE = {
    "export-hf": "nothing to export: transformers loads it as it is (from_pretrained)",
    "checkpoint.resume": "to start a run from its weights use checkpoint.init_from={path} "
                         "instead of checkpoint.resume",
    "verify-checkpoint": "nothing to verify (a bloomline checkpoint has a manifest.json)",
    "upgrade-checkpoint": "nothing to upgrade",
}


def _hf_folder(found: CheckpointPath, use: str) -> str:
    advice = _HF_ADVICE.get(use, "to start a run from its weights use "
                                 "checkpoint.init_from={path}")
    return ("is a transformers (Hugging Face) model folder, not a bloomline checkpoint; "
            + advice.format(path=found.path))


def path_problem(found: CheckpointPath, use: str, label: str | None = None) -> str | None:
    """The one line that says what ``found`` is and what to do, for the command or setting
    ``use``; None for a checkpoint. ``label`` names it (default: the path; a setting's
    errors say ``checkpoint.resume PATH``)."""
    label = label or str(found.path)
    if found.kind == "checkpoint":
        return None
    if found.kind == "missing":
        return f"{label}: {_missing(found)}"
    if found.kind == "file":
        return f"{label}: a file, not a checkpoint folder (RUN/checkpoints/step_N)"
    if found.kind in ("run", "checkpoints"):
        return f"{label} {_run_folder(found, use)}"
    if found.kind == "hf":
        return f"{label} {_hf_folder(found, use)}"
    init = " nor a transformers model folder (config.json)" if use == "checkpoint.init_from" \
        else ""
    return (f"{label}: neither a bloomline checkpoint ({CONFIG_FILE}, {MANIFEST}){init} nor "
            "a run folder; give a checkpoint folder RUN/checkpoints/step_N")


def refuse_non_checkpoint(path: str | Path, use: str, label: str | None = None) -> None:
    """Raise ``path_problem``'s line as a ``UserError`` unless ``path`` is a checkpoint."""
    problem = path_problem(classify(path), use, label)
    if problem:
        raise UserError(problem)


def checkpoint_to_read(path: str | Path, use: str,
                       log: Callable[[str], object]) -> Path:
    """The checkpoint a reading command (``READS_LATEST``) uses for ``path``: the path, or a
    run folder's (or its ``checkpoints/``'s) newest checkpoint that verifies, said to
    ``log``.

    Raises:
        UserError: ``path`` is neither (``path_problem``'s line), or no checkpoint of the run
            verifies.
    """
    found = classify(path)
    if use not in READS_LATEST or found.kind not in ("run", "checkpoints") or not found.steps:
        refuse_non_checkpoint(path, use)
        return Path(path)
    newest = latest_checkpoint(found.run, log=log)
    if newest is None:
        raise UserError(f"{path}: none of its checkpoints ({_names(found.steps)}) verifies; "
                        f"run `trainer verify-checkpoint {found.steps[-1]}`")
    what = "a run folder" if found.kind == "run" else "a run's checkpoints folder"
    log(f"{path} is {what}: using its latest checkpoint, {newest}")
    return newest
