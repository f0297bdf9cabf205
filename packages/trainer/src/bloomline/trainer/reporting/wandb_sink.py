"""Weights & Biases as a mirror of the metrics sink (``monitor.wandb = true``; the ``wandb``
extra of bloomline-trainer).

What W&B gets is what TensorBoard gets: ``metrics.py`` names each record's scalars once
(``tensorboard_scalars``) and hands the same names and values to both, with the record's
step. Only rank 0 logs (the sink exists where ``MetricsWriter`` is enabled).

- **Steps.** Each record is a row of its own with its step as the ``step`` metric, which W&B
  plots everything against (``define_metric``), instead of W&B's own step: a rollback or a
  resume trains steps again, and W&B drops rows whose own step goes backwards, where
  TensorBoard, like metrics.jsonl, keeps both.
- **One W&B run per run folder.** Its id is written to ``RUN/wandb_run_id.txt`` before the
  run starts and read back at every later start (``--resume``, a restart, a requeue), which
  continues the same W&B run (``resume="allow"``).
- **The config** (the resolved tree) is given once per start, at ``wandb.init``; a resume
  with changed settings updates it, as the run's own values win there too.
- **The end.** ``close`` finishes the W&B run with the process's exit code: 0, 75 after a
  ``stop`` record (marked preempting first: it will be resumed), 1 when the run failed; then,
  when no other W&B run of this process is active, it ends W&B's service process, so that
  nothing outlives a run called from a longer-lived process (a notebook, the tests).

W&B's local files go to ``RUN/wandb/`` (``WANDB_DIR`` overrides); an offline run is uploaded
later with ``wandb sync RUN/wandb/offline-run-*``.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import secrets
from pathlib import Path

from bloomline.common.atomic import atomic_write_bytes
from bloomline.common.errors import UserError
from bloomline.trainer.survival.preemption import PREEMPTED_EXIT_CODE

__all__ = ["RUN_ID_FILE", "STEP_METRIC", "WandbSink", "check_wandb_settings"]

RUN_ID_FILE = "wandb_run_id.txt"
STEP_METRIC = "step"
_INSTALL = "pip install 'bloomline-trainer[wandb]'"
# characters W&B refuses in a project name
_PROJECT_FORBIDDEN = "/\\#?%:"


def check_wandb_settings(monitor) -> None:
    """The ``monitor.wandb*`` settings of a run that logs to W&B, checked with the config
    (before any process starts): the wandb package importable (without importing it: a
    second) and a project name W&B accepts.

    Raises:
        UserError: one line naming the setting, and the extra to install.
    """
    if not monitor.wandb:
        return
    if importlib.util.find_spec("wandb") is None:
        raise UserError(f"monitor.wandb = true needs the wandb package: {_INSTALL} (or set "
                        "monitor.wandb = false)")
    bad = sorted(set(monitor.wandb_project) & set(_PROJECT_FORBIDDEN))
    if not monitor.wandb_project.strip() or bad:
        raise UserError(f"monitor.wandb_project = {monitor.wandb_project!r}: W&B needs a "
                        f"non-empty name without {' '.join(_PROJECT_FORBIDDEN)}")


def run_id(run_dir: str | Path) -> str:
    """The W&B run id of the run folder: the one an earlier start wrote, else a new one,
    written now (before W&B starts, so that a crash after it still resumes that run)."""
    path = Path(run_dir) / RUN_ID_FILE
    if path.is_file():
        found = path.read_text().strip()
        if found:
            return found
    new = secrets.token_hex(6)
    atomic_write_bytes(path, f"{new}\n".encode())
    return new


class WandbSink:
    """One W&B run that mirrors a run folder's TensorBoard scalars; ``open`` starts it."""

    def __init__(self, run, wandb_module) -> None:
        self._run = run
        self._wandb = wandb_module
        self._exit_code = 0

    @classmethod
    def open(cls, cfg, run_dir: str | Path) -> WandbSink:
        """Start (or continue, see the module docstring) the W&B run of ``run_dir`` with the
        ``monitor.wandb*`` settings of ``cfg`` and ``cfg`` as its config.

        Raises:
            UserError: wandb missing, or W&B refusing to start (no API key in online mode,
                an unknown entity): one line naming the settings to check.
        """
        check_wandb_settings(cfg.monitor)
        import wandb  # the optional wandb extra (a second to import): only when it is on

        m = cfg.monitor
        run_dir = Path(run_dir)
        settings = {
            "project": m.wandb_project,
            "entity": m.wandb_entity or None,
            "name": m.wandb_run_name or run_dir.resolve().name,
            "id": run_id(run_dir),
            "resume": "allow",
            # W&B's own default would finish a run the calling process has open (a notebook)
            "reinit": "create_new",
            "config": dataclasses.asdict(cfg),
            "allow_val_change": True,  # a resume with changed settings: this run's values win
            "mode": None if m.wandb_mode == "auto" else m.wandb_mode,  # auto: WANDB_MODE
        }
        if not os.environ.get("WANDB_DIR"):
            settings["dir"] = str(run_dir)
        try:
            run = wandb.init(**settings)
        except Exception as err:  # noqa: BLE001 - W&B's errors vary (login, network, entity)
            raise UserError(f"monitor.wandb: W&B did not start the run (project "
                            f"{m.wandb_project!r}, mode {m.wandb_mode}): {err}; log in with "
                            "`wandb login` (or set WANDB_API_KEY), or set monitor.wandb_mode "
                            "= offline, or monitor.wandb = false") from None
        run.define_metric(STEP_METRIC)
        run.define_metric("*", step_metric=STEP_METRIC, step_sync=True)
        return cls(run, wandb)

    def log(self, record: dict, scalars: dict[str, float]) -> None:
        """One record's scalars (``metrics.tensorboard_scalars``), at the record's step."""
        if record.get("kind") == "stop":  # saved, to be resumed: exit code 75 follows
            self._run.mark_preempting()
            self._exit_code = PREEMPTED_EXIT_CODE
        if scalars:
            self._run.log({**scalars, STEP_METRIC: record["step"]})

    def close(self, failed: bool = False) -> None:
        """Finish the W&B run (exit code 1 when ``failed``) and, when no other W&B run of
        this process is active, W&B's service process."""
        if self._run is None:
            return
        run, self._run = self._run, None
        run.finish(exit_code=1 if failed else self._exit_code)
        if self._wandb.run is None:
            self._wandb.teardown()
