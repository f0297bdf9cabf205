"""Where a run's checkpoints live and what their folders and files are called.

Contract: checkpoint ``N`` of a run is ``RUN/checkpoints/step_NNNNNNNN/`` (eight digits, so
names sort by step), written first as the hidden ``.step_NNNNNNNN.partial``; a folder counts
as a checkpoint once it has its final name and a manifest. Why a module of its own: the save
(``save.py``, ``async_save.py``) calls the cleanup of a failed save (``failure.py``), and
both need these names; kept here, the cleanup never imports the save.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from bloomline.trainer.checkpoint.manifest import MANIFEST

__all__ = ["CONFIG_FILE", "LEGACY_RNG_FILE", "RNG_FILE", "STATE_FILE", "PARTIAL_NAME",
           "PendingSave", "checkpoint_step", "is_checkpoint_name", "is_legacy_checkpoint",
           "legacy_checkpoints", "list_checkpoints"]

_NAME = re.compile(r"^step_(\d{8})$")
PARTIAL_NAME = re.compile(r"^\.step_\d{8}\.partial$")
STATE_FILE = "trainer_state.json"
RNG_FILE = "rng.json"
CONFIG_FILE = "config.toml"
# the generator states of the format before manifests (a pickle; legacy.py upgrades it)
LEGACY_RNG_FILE = "rng.pt"


@dataclass
class PendingSave:
    """A save between ``begin_save`` and ``finish_save``: its folders and the small files,
    serialized when the save began (so that an async save records the state of its step,
    not of the step at which it completes)."""

    root: Path
    step: int
    keep_last: int
    is_writer: bool
    files: dict[str, bytes]

    @property
    def partial(self) -> Path:
        return self.root / f".step_{self.step:08d}.partial"

    @property
    def final(self) -> Path:
        return self.root / f"step_{self.step:08d}"


def checkpoint_step(name: str) -> int | None:
    """The step of a checkpoint folder named ``step_N``; None for any other name."""
    match = _NAME.match(name)
    return int(match.group(1)) if match else None


def is_checkpoint_name(name: str) -> bool:
    """Whether ``name`` is a checkpoint folder's: ``step_N``, or a save's ``.step_N.partial``."""
    return bool(_NAME.match(name) or PARTIAL_NAME.match(name))


def list_checkpoints(run_dir: str | Path) -> list[Path]:
    """Checkpoint folders of a run that look complete (named ``step_N``, with a manifest),
    oldest first. Cheap: nothing is read or verified (``latest_checkpoint`` verifies)."""
    root = Path(run_dir) / "checkpoints"
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if _NAME.match(p.name) and (p / MANIFEST).is_file()]
    return sorted(found, key=lambda p: int(p.name[5:]))


def is_legacy_checkpoint(folder: str | Path) -> bool:
    """A checkpoint folder of the format before manifests (bloomline until 2026-11-25):
    ``rng.pt`` and ``trainer_state.json``, no manifest (``legacy.py``)."""
    folder = Path(folder)
    return ((folder / LEGACY_RNG_FILE).is_file() and (folder / STATE_FILE).is_file()
            and not (folder / MANIFEST).exists())


def legacy_checkpoints(run_dir: str | Path) -> list[Path]:
    """A run's ``step_N`` folders of the format before manifests, oldest first:
    ``list_checkpoints`` does not see them (no manifest), and no run may replace them."""
    root = Path(run_dir) / "checkpoints"
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if _NAME.match(p.name) and is_legacy_checkpoint(p)]
    return sorted(found, key=lambda p: int(p.name[5:]))
