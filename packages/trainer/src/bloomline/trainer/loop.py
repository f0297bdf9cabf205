"""The training loop, top to bottom: batch -> step (the runner: forward/backward over
micro-batches, clip, optimizer step) -> schedule -> log -> maybe evaluate -> maybe checkpoint.

``Trainer.__init__`` settles the run (``run_spec.settle``), builds it (``build.build_run``)
and sets up what restores and saves it (``run_checkpoints.py``, ``train_state.py``).
``Trainer.train_step`` is callable on its own (tests, benchmarks); ``Trainer.run`` is what
``trainer pretrain`` does. This module orchestrates; each concern lives in its own module:
the step in ``step/`` (one runner interface, plain or pipelined), resume/load/save in
``run_checkpoints.py``, records and console lines in ``reporting/monitor.py``, batches in
``data/``, rollbacks and bad steps in ``survival/``.
"""

from __future__ import annotations

from pathlib import Path

import torch

from bloomline.common.errors import UserError
from bloomline.trainer.blend_phases import (
    configured_phases,
    phases_begun,
    reordered_datasets,
    resume_phases,
)
from bloomline.trainer.build import build_run
from bloomline.trainer.checkpoint import list_checkpoints, tokenizer_copy_files
from bloomline.trainer.config import Config
from bloomline.trainer.curriculum import (
    global_batch_size,
    schedule_progress,
    sequence_length,
    total_steps,
)
from bloomline.trainer.data import (
    StepBatches,
    blend_of,
    check_token_ids,
    open_splits,
    open_step_batches,
    sample_sources,
)
from bloomline.trainer.data.data_source import data_source
from bloomline.trainer.evaluation import evaluate_split
from bloomline.trainer.kernels.cpu.linear import configure_cpu_fp32_matmul
from bloomline.trainer.malloc import tune_malloc
from bloomline.trainer.model_source import load_initial_weights
from bloomline.trainer.optim import learning_rate
from bloomline.trainer.parallel import build_mesh, init_distributed, world_info
from bloomline.trainer.parallel.zero_engine import describe_zero, replicates_parameters
from bloomline.trainer.reporting.clock import RunClock, now
from bloomline.trainer.reporting.finished_run import nothing_left, report_finished
from bloomline.trainer.reporting.monitor import RunMonitor
from bloomline.trainer.reporting.start_phases import StartPhases
from bloomline.trainer.reporting.step_sections import SectionClock
from bloomline.trainer.reporting.stragglers import StragglerWatch
from bloomline.trainer.run_checkpoints import RunCheckpoints
from bloomline.trainer.run_spec import RunSpec, run_device, settle
from bloomline.trainer.step.recompute import StepRecompute
from bloomline.trainer.survival import faults
from bloomline.trainer.survival.finite_weights import check_finite_weights
from bloomline.trainer.survival.preemption import PREEMPTED_EXIT_CODE
from bloomline.trainer.survival.rollback import ROLLBACKS_FILE, Rollback, skips_in_force
from bloomline.trainer.survival.run_folder import check_start_point, write_run_tokenizer
from bloomline.trainer.survival.run_guard import RunGuard
from bloomline.trainer.survival.sample_skips import SkipRanges
from bloomline.trainer.survival.silent_errors import SilentErrors
from bloomline.trainer.train_state import TrainState

__all__ = ["Trainer", "resolve_device"]


def resolve_device(name: str, local_rank: int = 0) -> torch.device:
    """``train.device`` on this machine (``run_spec.run_device``), a GPU selected: ``cuda``
    and ``auto`` on a CUDA machine become this process's ``cuda:LOCAL_RANK``."""
    device = run_device(name)
    if device.type == "cuda" and device.index is None:
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    return device


class Trainer:
    """One process's training: its settled run (``spec``), the built model, optimizer and step
    ``runner``, the ``state`` (``TrainState``) and what keeps the run alive."""

    _batches: StepBatches | None = None  # the run's micro-batches (its loader workers)

    def __init__(self, run: Config | RunSpec, log=print) -> None:
        """``run``: a loaded config (settled here for this process's rank of the torchrun
        world) or a ``RunSpec`` settled already (``trainer pretrain``)."""
        started = now()  # the run's elapsed time counts the build too
        rank, local_rank, world_size = world_info()
        self.is_main = rank == 0
        self.log = log if self.is_main else (lambda *_: None)
        # 1. settle: the model's shape, vocabulary, precision and layout, every rule once
        spec = run if isinstance(run, RunSpec) else settle(
            run, world_size, rank, log=log if self.is_main else None)
        self.spec, self.cfg, self.layout = spec, spec.config, spec.layout
        cfg = self.cfg
        for warning in spec.warnings:
            self.log(warning)
        # what the start-up is doing, as it goes (rank 0: self.log is silent elsewhere)
        self.start_up = StartPhases(self.log, RunClock(started))
        self.start_up.building(cfg.model.num_parameters(), self.layout.describe())
        # 2. build: this rank's model, parallelism, optimizer and step runner
        self.device = resolve_device(cfg.train.device, local_rank)
        if cfg.train.tune_malloc:
            tune_malloc()
        configure_cpu_fp32_matmul(cfg.train.cpu_fp32_matmul)
        init_distributed(cfg, self.device)
        built = build_run(spec, build_mesh(self.layout, self.device), self.device)
        self.mesh, self.model, self.optimizer = built.mesh, built.model, built.optimizer
        self.precision, self.runner = built.precision, built.runner
        # 3. restore: the state a checkpoint carries and the parts that load and save it
        self.run_dir = Path(cfg.train.run_dir)
        self.state = TrainState()
        self.skips = SkipRanges(cfg.train.skip_samples)
        self.monitor = RunMonitor(cfg, self.layout, self.device, self.precision, self.model,
                                  self.optimizer, self.is_main, self.log, started=started,
                                  start_up=self.start_up)
        self.guard = RunGuard(cfg, self.run_dir, rank)
        # before any checkpoint is loaded: it records the config's optimizer hyper-parameters
        self.checkpoints = RunCheckpoints(cfg, self.run_dir, self.model, self.optimizer,
                                          self.precision, self.guard, self.is_main, self.log,
                                          self.layout)
        self.rollback = Rollback(cfg, self.run_dir, self.checkpoints, self.monitor,
                                 self.layout.dp, self.is_main, self.log)
        # the step's section times (the runner and the loop mark them) for the straggler
        # report, and where the heartbeat says this rank is (reporting/stragglers.py)
        self.sections = SectionClock(self.device, self.guard.heartbeat.at)
        self.runner.sections = self.sections
        self.stragglers = StragglerWatch(cfg, self.layout, self.sections, self.monitor,
                                         self.log)
        self.guard.heartbeat.report_to(log, self.monitor.write)  # ranks 0 and 1 report
        self.silent_errors = SilentErrors(
            cfg, self.run_dir, self.guard.detector, self.layout,
            list(self.model.named_parameters()), replicates_parameters(cfg, self.layout.dp),
            self.precision.scaler is not None, self.device, self.monitor.write, self.log,
            self.is_main)
        if cfg.spike.recompute:  # a suspect step is computed again before the optimizer step
            self.runner.recompute = StepRecompute(self.runner, self.silent_errors)

    # -- one optimizer step ---------------------------------------------------------------
    def train_step(self, micro_batches: list[torch.Tensor], lr: float,
                   activation_stats: bool = False, sources: torch.Tensor | None = None,
                   num_sources: int = 0) -> dict:
        """One optimizer step over the micro-batches of a global batch
        (``StepRunner.train_step``)."""
        return self.runner.train_step(micro_batches, lr, activation_stats, sources, num_sources)

    def full_model_state(self) -> dict[str, torch.Tensor]:
        """The whole model's parameters as plain CPU tensors under the single-process names,
        on every rank (gathers shards: for tests, export and small models)."""
        return self.runner.full_model_state()

    @torch.no_grad()
    def sample_losses(self, samples) -> torch.Tensor:
        """Each sample's mean loss ([len(samples)] fp32 on CPU, on every rank)
        (``StepRunner.sample_losses``; collective)."""
        return self.runner.sample_losses(samples)

    def evaluate(self, samples, num_samples: int, split: str = "valid") -> dict:
        """``{split}_loss`` and ``{split}_ppl`` over the first ``num_samples`` samples and, when
        ``samples`` is a blend of several datasets, ``{split}_loss/NAME`` / ``{split}_ppl/NAME``
        over the first ``num_samples`` of each dataset's own split (``evaluation.py``)."""
        return evaluate_split(self.sample_losses, samples, num_samples, split).record()

    # -- checkpoints --------------------------------------------------------------------------
    def total_steps(self) -> int:
        """Steps of the whole run (``curriculum.total_steps``, with the skips in force)."""
        return total_steps(self.cfg, self.layout.dp, self.skips)

    def resume(self) -> Path | None:
        """Continue from a checkpoint of this run (``checkpoint.resume``) and return it; when
        there is none, start, from ``checkpoint.init_from``'s weights if set."""
        if self.is_main:
            self.start_up.resuming(self.cfg.checkpoint.resume, list_checkpoints(self.run_dir))
        loaded = self.checkpoints.resume(self.skips)
        if loaded is None:
            source = self.spec.model_source
            load_initial_weights(self.model, source)
            if source.kind == "init":
                check_finite_weights(self.model, f"checkpoint.init_from {source.path}",
                                     "a run cannot train from these weights")
            return None
        self.state, self.skips = loaded.state, loaded.skips
        return loaded.path

    def load(self, path: Path, verified: bool = False) -> Config:
        """Model, optimizer, RNG and trainer state (``state``, ``skips``) from the checkpoint
        ``path`` (``RunCheckpoints.load``); returns the config it was written with."""
        loaded = self.checkpoints.load(path, self.skips, verified=verified)
        self.state, self.skips = loaded.state, loaded.skips
        return loaded.config

    def save(self) -> Path:
        """A checkpoint of this step (in the background with ``checkpoint.async``)."""
        return self.checkpoints.save(self.state)

    def finish_saves(self) -> None:
        """Wait for a checkpoint still being written in the background."""
        self.checkpoints.finish()

    # -- the run ----------------------------------------------------------------------------
    def run(self) -> dict:
        """Train to the end of ``train.train_samples`` (or a stop: ``exit_interval``, a signal,
        ``train.max_wallclock``, too many rollbacks). Returns the trainer state; a run that
        stopped early to be continued has ``state.stopped`` set to the reason."""
        # the run folder's lock; from here on a SIGTERM / SIGUSR1 / SIGINT asks for a checkpoint
        self.guard.start()
        finished = False
        try:
            state = self._run()
            finished = True
            return state
        finally:  # also when the run fails: no loader worker or save outlives it
            # a failed run's snapshots stay for its restart; a finished one's are deleted
            self.checkpoints.close_snapshots(finished)
            if self._batches is not None:
                self._batches.close()
                self._batches = None
            self.checkpoints.settle()
            self.guard.close()

    def _run(self) -> dict:
        cfg = self.cfg
        self.run_dir.mkdir(parents=True, exist_ok=True)
        resumed = self.resume()  # first: the checkpoint's blend phases shape the index
        check_start_point(self.run_dir, cfg.checkpoint.resume, resumed, self.state.step)
        self._settle_phases(resumed is not None)
        self.start_up.opening_indices(cfg.data.corpus or "Megatron's data arguments")
        splits = self._open_run_splits()
        self.start_up.indices_ready(splits["train"].index_report)
        train = splits["train"]
        if len(train) < cfg.train.train_samples:
            raise UserError(f"data: the train split serves {len(train)} samples, fewer than "
                            f"train.train_samples {cfg.train.train_samples}")
        if self.is_main:  # the run folder usable without the original tokenizer file
            write_run_tokenizer(self.run_dir, tokenizer_copy_files(cfg.data))
        self.skips = skips_in_force(cfg.train.skip_samples, self.state.skip_samples,
                                    self.run_dir)
        self.state.skip_samples = self.skips.to_list()
        source = self.spec.model_source
        initialized = source.path if not resumed and source.kind == "init" else None
        # the matmul peak first, while nothing else of this run computes (reporting/monitor.py)
        self.monitor.start(resumed, initialized, source.format,
                           describe_zero(self.cfg, self.layout.dp))
        if self.skips:
            self.log(f"skipping train samples {self.skips.to_list()}")
        total = self.total_steps()
        if self.state.step == total or nothing_left(cfg, self.state, self.skips,
                                                    self.layout.dp):  # at the end, or past it
            report_finished(self.monitor, self.run_dir, resumed, self.state, total,
                            cfg.train.train_samples, "valid" in splits, self.log)
            return self.state
        if self.state.step > total:
            raise UserError(f"{self.run_dir}: resumed at step {self.state.step}, but the run "
                            f"has {total} steps with the skip ranges in force "
                            f"({self.skips.to_list()}: train.skip_samples, the checkpoint's, "
                            f"{self.run_dir / ROLLBACKS_FILE}): a range covers samples the "
                            "checkpoint had already trained; remove it")
        self.monitor.open_metrics()  # closed below: no W&B run stays open after the run
        ended = False
        try:
            self._train(train, splits)
            if not self.state.stopped:
                self._finish_run(splits)
            self._summarize("valid" in splits)
            ended = True
        finally:  # a failed run's W&B run is marked failed
            self.monitor.close(failed=not ended)
        return self.state

    def _settle_phases(self, resumed: bool) -> None:
        """The run's blend phases into the state its checkpoints save: the config's, or on
        resume the checkpoint's past and the config's future (``blend_phases.py``), with a
        line when a resume changed them."""
        configured = configured_phases(self.cfg.data, self.cfg.train.train_samples)
        consumed = self.state.consumed_samples if resumed else 0
        phases, note = resume_phases(self.state.data_phases, configured, consumed)
        if note:
            self.log(note)
        self._phases_before = self.state.data_phases if note else None
        self.state.data_phases = phases

    def _open_run_splits(self) -> dict:
        """The run's splits in its blend phases, each train dataset's index kept at the count
        the checkpoint recorded while it suffices (``dataprep.kept_indices``: its order goes
        on); a warning for each dataset a resume's new phases reshuffle all the same; the
        counts used into the state its checkpoints save."""
        state = self.state
        kept = state.data_index_samples if state.data_phases else {}
        before = None
        if self._phases_before:  # a resume changed the phases
            before = self._open_splits(self._phases_before, kept)["train"]
            kept = kept or before.index_samples  # a checkpoint that predates the counts
        splits = self._open_splits(state.data_phases, kept)
        train = splits["train"]
        if before is not None:
            for line in reordered_datasets(before.samples, train.samples,
                                           state.consumed_samples):
                self.log(line)
        state.data_index_samples = dict(train.index_samples) if state.data_phases else {}
        return splits

    def _open_splits(self, phases: list, kept_sizes: dict[str, int]) -> dict:
        """The run's train and valid samples, the train blend in ``phases``."""
        cfg = self.cfg
        return open_splits(data_source(cfg.data), cfg.data.seq_length, cfg.train.train_samples,
                           None, cfg.data.split, cfg.data.seed, cfg.data.weights,
                           cfg.data.cache_dir, phases=phases, kept_sizes=kept_sizes)

    def _open_batches(self, train) -> StepBatches:
        """The micro-batches from the current position (a rollback's new one: the old
        loader's workers end first)."""
        if self._batches is not None:
            self._batches.close()
        # sample ids for a blend's per-source losses at log steps
        self._batches = open_step_batches(train, self.cfg, self.state.consumed_samples,
                                          self.layout.dp_rank, self.layout.dp, self.skips,
                                          pin_memory=self.device.type == "cuda",
                                          with_ids=blend_of(train) is not None)
        return self._batches

    def _train(self, train, splits) -> None:
        cfg, guard, monitor = self.cfg, self.guard, self.monitor
        steps_total = self.total_steps()
        batches = self._open_batches(train)
        blend = blend_of(train)
        guard.stops.begin_training()
        monitor.steps_begin()
        self.stragglers.begin(self.state.step)  # collective: the ranks' hosts
        steps_here = 0
        while self.state.step < steps_total and not (
                cfg.train.exit_interval and steps_here >= cfg.train.exit_interval):
            state = self.state
            steps_here += 1
            step = state.step + 1
            monitor.at_step(step)
            guard.watchdog.arm(f"step {step}")
            size = global_batch_size(cfg, state.consumed_samples, self.layout.dp)
            length = sequence_length(cfg, state.consumed_tokens)
            self.sections.begin_step(step)  # the data wait
            micro, ids = batches.next_step(
                size // (cfg.train.micro_batch_size * self.layout.dp), length)
            # the process's first step too: its line ends the start-up's silence
            log_step = (step % cfg.train.log_interval == 0 or step == steps_total
                        or steps_here == 1)
            # per-source losses at log steps only: the blend's provenance of this rank's ids
            sources = sample_sources(train, ids) if log_step and blend is not None else None
            check_token_ids(micro, cfg.model.vocab_size, cfg.data.corpus, step)
            lr = learning_rate(*schedule_progress(cfg, state), cfg.optimizer, cfg.schedule)
            stats = monitor.wants_activation_stats(step)
            faults.fire("step", step=step)
            self.silent_errors.begin(step)
            result = self.train_step(micro, lr, activation_stats=stats, sources=sources,
                                     num_sources=len(blend.names) if blend else 0)
            self.silent_errors.end(step, result)  # names what a recompute or fingerprint found
            self.sections.enter("verdict")
            verdict = guard.judge(result)
            self.sections.synced()  # every rank leaves the verdict together
            guard.watchdog.disarm(step_finished=True)
            self.checkpoints.raise_if_failed()  # a background save's failure ends the run now
            loaded = (self.rollback(verdict.finding, step, state, self.skips)
                      if verdict.finding is not None else None)
            if loaded is not None:
                self.state, self.skips = loaded.state, loaded.skips
                self.state.data_phases = state.data_phases  # the run's, not the checkpoint's
                self.state.data_index_samples = state.data_index_samples
                steps_total = self.total_steps()
                if self.state.step >= steps_total:
                    raise UserError(
                        f"step {step}: the rollback's skip ranges {self.skips.to_list()} "
                        f"leave nothing of train.train_samples = {cfg.train.train_samples} to "
                        f"train after step {self.state.step}; the run stops here, not "
                        "completed: lower spike.skip_after, or fix the run's data or "
                        "optimizer.lr and resume")
                batches = self._open_batches(train)
                monitor.restart_window()
                continue
            before = state.consumed_samples
            state.advance(size, length, self.skips.advance(state.consumed_samples, size))
            for line in phases_begun(state.data_phases, before, state.consumed_samples):
                self.log(f"step {step}: {line}")
            guard.count_bad(state, result, step, self.precision.scaler is not None, self.log)
            monitor.step_done(step, size, length, result["loss"], result["skipped"])
            if log_step:
                # collective: the interval's section times, the stragglers named
                result["section_times"] = self.stragglers.interval_end(step)
                monitor.log_step(result, lr, size, length, state, steps_total,
                                 blend.names if blend else None)
            if stats:
                monitor.activation_stats(step, result["activation_stats"])
            if cfg.train.eval_interval and step % cfg.train.eval_interval == 0:
                self._evaluate(splits, step)
            if cfg.checkpoint.interval and step % cfg.checkpoint.interval == 0:
                self.log(f"checkpoint: {self.save()}")
            self.checkpoints.snapshot_after(self.state)
            if verdict.stop_reason:
                self._stop_for(verdict.stop_reason)
                return

    def _finish_run(self, splits) -> None:
        """The last evaluation and checkpoint (end of the run or of ``exit_interval``)."""
        cfg, step = self.cfg, self.state.step
        if cfg.train.eval_interval and step % cfg.train.eval_interval:
            self._evaluate(splits, step)
        if not cfg.checkpoint.interval or step % cfg.checkpoint.interval:
            self.log(f"checkpoint: {self.save()}")
        self.finish_saves()

    def _summarize(self, has_valid: bool) -> None:
        """The end-of-run summary (``monitor.summarize``): the run completed, stopped to be
        continued (a signal, ``train.max_wallclock``), or ended its ``train.exit_interval``."""
        total, step = self.total_steps(), self.state.step
        reason = self.state.stopped or (
            "" if step >= total else
            f"train.exit_interval = {self.cfg.train.exit_interval} steps in this process")
        checkpoints = list_checkpoints(self.run_dir) if self.is_main else []
        self.monitor.summarize(self.state, total, reason,
                               checkpoints[-1] if checkpoints else None, has_valid)

    def _stop_for(self, reason: str) -> None:
        """Save (unless this step's checkpoint was just written) and mark the run stopped."""
        step = self.state.step
        if not (self.cfg.checkpoint.interval and step % self.cfg.checkpoint.interval == 0):
            self.log(f"checkpoint: {self.save()}")
        self.finish_saves()
        self.state.stopped = reason
        self.monitor.write({"kind": "stop", "step": step, "reason": reason})
        self.log(f"stopping after step {step}: {reason}; checkpoint saved, exit code "
                 f"{PREEMPTED_EXIT_CODE} (resume with --resume auto)")

    def _evaluate(self, splits, step: int) -> None:
        if "valid" not in splits:
            return
        self.guard.watchdog.arm(f"evaluation at step {step}", self.cfg.watchdog.startup_seconds)
        record = {"kind": "valid", "step": step,
                  **self.evaluate(splits["valid"], self.cfg.train.eval_samples)}
        self.guard.watchdog.disarm()
        self.monitor.valid(record)
