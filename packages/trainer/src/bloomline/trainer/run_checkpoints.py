"""A run's checkpoints as the trainer sees them: which one to resume, what a load re-applies,
and saves (synchronous or through the run's one ``AsyncCheckpointer``) under the watchdog.

The Trainer holds one ``RunCheckpoints`` and keeps the ``TrainState`` and the skips in force
itself: ``load`` returns them, ``save`` takes the state. Why outside ``checkpoint/``: this is
the run's glue between the checkpoint format (``checkpoint/``) and what survives a run
(``survival/``'s skips and spike history); ``checkpoint/`` stays a format that knows no run.
Why a class of its own: the loop then only says when to save or load, and the rules of what
a checkpoint carries besides the weights (loss scale, spike history, skip ranges) and which
settings win live in one place.

Invariants: every rank calls ``load``, ``save`` and ``finish`` at the same points (DCP is
collective); a loaded optimizer keeps this run's hyper-parameters (the config's, not the
checkpoint's param groups); the skips after a load are the ones in force plus the
checkpoint's.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from bloomline.trainer.checkpoint import (
    AsyncCheckpointer,
    changed_settings,
    check_compatible,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    load_config_of,
    save_checkpoint,
)
from bloomline.trainer.checkpoint.path_kind import refuse_non_checkpoint
from bloomline.trainer.checkpoint.rng_state import set_rng_state
from bloomline.trainer.snapshots.local_state import restore_state
from bloomline.trainer.snapshots.peer_snapshots import PeerSnapshots
from bloomline.trainer.survival.finite_weights import check_finite_weights
from bloomline.trainer.survival.sample_skips import SkipRanges
from bloomline.trainer.train_state import TrainState

__all__ = ["Loaded", "RunCheckpoints"]


@dataclass
class Loaded:
    """What a load hands back to the trainer: the checkpoint's folder, the config it was
    written with, the trainer state it held (with ``skip_samples`` = ``skips``) and the skip
    ranges now in force."""

    path: Path
    config: object
    state: TrainState
    skips: SkipRanges


class RunCheckpoints:
    """The checkpoints of one process's run: resume choice, load, save, background saves.

    ``guard`` is the run's ``survival.run_guard.RunGuard``: its watchdog covers each save
    and wait, its spike detector's history travels in the checkpoint, and it learns how long
    a save took (its stop-time reserve)."""

    def __init__(self, cfg, run_dir: Path, model, optimizer, precision, guard, is_main: bool,
                 log, layout=None) -> None:
        self.cfg, self.run_dir = cfg, run_dir
        self.model, self.optimizer, self.precision, self.guard = model, optimizer, precision, guard
        self.is_main, self.log = is_main, log
        rank, world = (layout.rank, layout.world_size) if layout is not None else (0, 1)
        # the in-memory snapshots a restart goes on from (snapshots/); off without restarts
        self.snapshots = PeerSnapshots(cfg, run_dir, model, optimizer, rank, world,
                                       layout.describe() if layout is not None else "",
                                       log)
        # the config's hyper-parameters: a checkpoint's param groups must not replace them
        self._hyperparameters = [{k: v for k, v in group.items() if k != "params"}
                                 for group in optimizer.param_groups]
        self._async_saver: AsyncCheckpointer | None = None

    # -- loading ------------------------------------------------------------------------------
    def resume(self, skips: SkipRanges) -> Loaded | None:
        """Load the checkpoint ``checkpoint.resume`` names (``auto``: this run's newest that
        verifies) and log the settings in which this run differs from it (this run's values
        win). None when there is none to resume: the caller starts the run."""
        setting = self.cfg.checkpoint.resume
        path = None
        if setting == "auto":
            if self.snapshots.can_recover():  # a restart: the peer snapshots first
                recovered = self._recover(skips)
                if recovered is not None:
                    return recovered
            else:  # a first start: what an earlier job left is stale
                self.snapshots.clear_stale()
            path = latest_checkpoint(self.run_dir, log=self.log)
        elif setting != "none":
            path = Path(setting)
            refuse_non_checkpoint(path, "checkpoint.resume", f"checkpoint.resume {setting}")
        if path is None:
            return None
        loaded = self.load(path, skips, verified=setting == "auto")
        changed = changed_settings(loaded.config, self.cfg)
        if changed:
            self.log(f"resuming {path.name}: settings differ from the checkpoint's, this run's "
                     f"values win: {'; '.join(changed)}")
        return loaded

    def _recover(self, skips: SkipRanges) -> Loaded | None:
        """A restart: the newest peer snapshot every rank can restore (snapshots/), or None
        with one line saying why the checkpoints are read instead."""
        listed = list_checkpoints(self.run_dir) if self.is_main else []
        newest = int(listed[-1].name[5:]) if listed else None  # names only: nothing is read
        recovered, reason = self.snapshots.recover(newest)
        if recovered is None:
            self.log(f"peer snapshots: {reason}; resuming from the persistent checkpoint "
                     "instead")
            return None
        header = recovered.header
        restore_state(self.model, self.optimizer, recovered.tensors, header.values)
        set_rng_state(header.rng)
        state = TrainState()
        state.load_state_dict(header.trainer_state, where=str(recovered.path))
        loaded = self._after_load(recovered.path, self.cfg, state, skips,
                                  f"the peer snapshot of step {header.step}")
        age = time.time() - header.created
        self.log(f"recovered step {header.step} from peer snapshots in "
                 f"{recovered.seconds:.2f} s ({recovered.from_peers} of "
                 f"{self.snapshots.placement.world_size} rank states sent by a peer, the rest "
                 f"from their own node's memory; taken {age:.1f} s before); the checkpoints "
                 "were not read")
        return loaded

    def load(self, path: Path, skips: SkipRanges, verified: bool = False) -> Loaded:
        """Model, optimizer, RNG and trainer state from the checkpoint ``path``, with this
        run's hyper-parameters, loss scale and spike history re-applied from it;
        ``verified``: its manifest was just checked (by ``latest_checkpoint``), skip hashing
        it a second time. ``skips``: the ranges in force before the load. The peer snapshots
        are dropped: a load (a rollback) leaves the history they hold."""
        saved = load_config_of(path, type(self.cfg))
        check_compatible(saved, self.cfg, path)
        self.snapshots.discard()
        state = TrainState()
        state.load_state_dict(load_checkpoint(path, self.model, self.optimizer,
                                              verified=verified))
        return self._after_load(path, saved, state, skips, f"checkpoint {path}")

    def _after_load(self, path: Path, saved, state: TrainState, skips: SkipRanges,
                    what: str) -> Loaded:
        """What every load re-applies: the weights checked finite, this run's
        hyper-parameters, the loss scale and spike history, the skips."""
        check_finite_weights(self.model, what,
                             "it cannot be trained from: resume from an earlier checkpoint "
                             "(checkpoint.resume=PATH)")
        for group, settings in zip(self.optimizer.param_groups, self._hyperparameters,
                                   strict=True):
            group.update(settings)
        self.precision.load_state_dict(state.loss_scale)
        self.guard.detector.load_state_dict(state.spike_history)
        # the skips in force and the checkpoint's (at a rollback the former hold the latter).
        # RUN/rollbacks.json is not read here but once in Trainer.run, after a resume: at a
        # rollback rank 0 may have written this rollback's range into it already, and a rank
        # that read it would compute the range against other skips than the others (a hang)
        skips = SkipRanges([*skips.to_list(), *state.skip_samples])
        state.skip_samples = skips.to_list()
        return Loaded(path, saved, state, skips)

    # -- saving -------------------------------------------------------------------------------
    def save(self, state: TrainState) -> Path:
        """A checkpoint of ``state.step`` (in the background with ``checkpoint.async``);
        records the loss scale and spike history into ``state`` first."""
        cfg, step = self.cfg, state.step
        saved = self._saved_state(state)
        check_finite_weights(self.model, f"step {step}",
                             "not saved as a checkpoint (the newest complete one stays); "
                             "resume from it with a lower optimizer.lr")
        started = time.perf_counter()
        self.guard.watchdog.arm(f"checkpoint of step {step}", cfg.watchdog.startup_seconds)
        if cfg.checkpoint.async_:
            if self._async_saver is None:
                self._async_saver = AsyncCheckpointer(self.run_dir, cfg.checkpoint.keep_last,
                                                      is_writer=self.is_main)
            path = self._async_saver.save(step, self.model, self.optimizer, saved, cfg)
        else:
            path = save_checkpoint(self.run_dir, step, self.model, self.optimizer, saved, cfg,
                                   cfg.checkpoint.keep_last, is_writer=self.is_main)
        self.guard.watchdog.disarm()
        self.guard.last_save_seconds = time.perf_counter() - started
        return path

    def _saved_state(self, state: TrainState) -> dict:
        """``trainer_state.json``'s object, the loss scale and spike history recorded into
        ``state`` first: what a checkpoint and a snapshot carry."""
        state.loss_scale = self.precision.state_dict()
        state.spike_history = self.guard.detector.state_dict()
        return state.state_dict()

    def snapshot_after(self, state: TrainState) -> None:
        """After each step: a new peer snapshot round of ``state.step`` when due
        (snapshots/): what a checkpoint of the step would hold, copied to host memory,
        replicated in the background; else, the step after a round, that round waited for
        when ``checkpoint.snapshot_wait`` says so (``PeerSnapshots.settles_next_step``)."""
        snapshots = self.snapshots
        if not snapshots.due(state.step):
            if snapshots.in_flight and snapshots.settles_next_step(
                    self.guard.watchdog.median_step_seconds()):
                self.guard.watchdog.arm("a peer snapshot's replication",
                                        self.cfg.watchdog.startup_seconds)
                snapshots.wait()
                self.guard.watchdog.disarm()
            return
        saved = self._saved_state(state)
        self.guard.watchdog.arm(f"peer snapshot of step {state.step}",
                                self.cfg.watchdog.startup_seconds)
        snapshots.take(state.step, saved, timeline=state.rollbacks)
        self.guard.watchdog.disarm()

    def raise_if_failed(self) -> None:
        """Raise a background save's failure now (the run ends at the step that sees it)."""
        if self._async_saver is not None:
            self._async_saver.raise_if_failed()

    def finish(self) -> None:
        """Wait for a checkpoint still being written in the background."""
        if self._async_saver is not None:
            self.guard.watchdog.arm("finishing an async checkpoint",
                                    self.cfg.watchdog.startup_seconds)
            self._async_saver.wait()
            self.guard.watchdog.disarm()

    def close_snapshots(self, finished: bool) -> None:
        """The run's end: a finished run (completed or stopped with a checkpoint) deletes its
        snapshots; a failed one leaves them to its restart."""
        self.snapshots.close(finished)

    def settle(self) -> None:
        """When the run fails with a checkpoint still being written in the background: let it
        complete (under the watchdog), so that what it holds is kept; its own failure is
        logged, the run's error stays the one reported."""
        if self._async_saver is None or not self._async_saver.in_flight:
            return
        try:
            self.finish()
        except Exception as err:  # noqa: BLE001 - the run's own error is on its way out
            self.log(f"the checkpoint being written when the run failed: {err}")
