"""The training loop, top to bottom: batch -> forward/backward over micro-batches -> clip ->
step -> schedule -> log -> maybe evaluate -> maybe checkpoint.

``Trainer.train_step`` is callable on its own (tests, benchmarks); ``Trainer.run`` is what
``trainer pretrain`` does.
"""

from __future__ import annotations

import contextlib
import copy
import json
import math
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import loss_parallel

from bloomline.common.config_loader import to_toml
from bloomline.common.errors import UserError
from bloomline.trainer import checkpoint as ckpt
from bloomline.trainer.config import Config, validate
from bloomline.trainer.curriculum import global_batch_size, sequence_length
from bloomline.trainer.data import (
    MegatronSampler,
    check_vocabulary,
    close_loader,
    load_run_tokenizer,
    make_loader,
    open_splits,
)
from bloomline.trainer.evaluation import (
    batched_sample_losses,
    blend_of,
    evaluate_split,
    per_sample_means,
    sample_sources,
    source_loss_record,
    source_totals,
    token_cross_entropy,
    valid_console_line,
)
from bloomline.trainer.kernels.cpu.linear import configure_cpu_fp32_matmul
from bloomline.trainer.malloc import tune_malloc
from bloomline.trainer.metrics import (
    MetricsWriter,
    console_line,
    memory_bytes,
    thermometer_readings,
)
from bloomline.trainer.mfu import (
    MfuGuard,
    Peak,
    PeakCache,
    machine_key,
    measure_peak_flops,
    resolve_peak,
)
from bloomline.trainer.model import build_model, padded_vocab_size
from bloomline.trainer.model_source import load_initial_weights, resolve_model_settings
from bloomline.trainer.optim import build_optimizer, learning_rate
from bloomline.trainer.parallel import (
    build_mesh,
    init_distributed,
    parallelize,
    resolve_layout,
    set_gradient_sync,
    world_info,
)
from bloomline.trainer.parallel.memory import memory_record
from bloomline.trainer.precision import Precision, resolve_dtype
from bloomline.trainer.survival import faults
from bloomline.trainer.survival.preemption import PREEMPTED_EXIT_CODE
from bloomline.trainer.survival.rollback import (
    ROLLBACKS_FILE,
    append_rollback,
    read_rollbacks,
    skip_range,
)
from bloomline.trainer.survival.run_folder import check_start_point
from bloomline.trainer.survival.run_guard import RunGuard
from bloomline.trainer.survival.sample_skips import SkipRanges
from bloomline.trainer.survival.spikes import SpikeFinding

__all__ = ["Trainer", "clip_grad_norm", "lm_loss", "resolve_device"]


def resolve_device(name: str, local_rank: int = 0) -> torch.device:
    """cpu, cuda (this process's GPU: cuda:LOCAL_RANK) or auto."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise UserError(f"train.device = {name!r}: CUDA is not available on this machine")
    if name == "cuda":
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    return torch.device(name)


def lm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy, computed in fp32 whatever the logits' dtype. Logits
    sharded by vocabulary (a DTensor under tensor parallelism) need ``loss_parallel()`` around
    this and the backward; the loss comes back a plain tensor."""
    loss = F.cross_entropy(logits.float().flatten(0, 1), labels.flatten())
    return loss.to_local() if isinstance(loss, DTensor) else loss  # replicated over tp


def clip_grad_norm(parameters, max_norm: float) -> torch.Tensor:
    """``clip_grad_norm_`` that also handles DTensor parameters (tp, FSDP2): the norm of
    sharded gradients comes back as a partial DTensor (per-rank partial norms); reduce it to
    the full norm before clipping and before anyone reads it. Returns the norm, a plain tensor."""
    parameters = [p for p in parameters if p.grad is not None]
    norm = torch.nn.utils.get_total_norm([p.grad for p in parameters], foreach=True)
    if isinstance(norm, DTensor):
        norm = norm.full_tensor()
    torch.nn.utils.clip_grads_with_norm_(parameters, max_norm, norm, foreach=True)
    return norm


def resolve_vocab(cfg: Config) -> None:
    """model.vocab_size 0 means: the tokenizer's vocabulary padded to a multiple of 128 x tp."""
    if cfg.model.vocab_size == 0:
        if not cfg.data.tokenizer:
            raise UserError("model.vocab_size = 0 needs data.tokenizer to size the vocabulary")
        cfg.model.vocab_size = padded_vocab_size(load_run_tokenizer(cfg.data).vocab_size,
                                                 tensor_parallel=cfg.parallel.tensor_parallel)
    check_vocabulary(cfg.data, cfg.model.vocab_size)


class Trainer:
    """One process's training: model, optimizer, precision, data, counters."""

    _loader = None  # the run's micro-batch iterator (its loader worker processes)

    def __init__(self, cfg: Config, log=print) -> None:
        rank, local_rank, world_size = world_info()
        # the model's shape: the recipe's, the checkpoint's it resumes or the model it starts from
        self.model_source = resolve_model_settings(cfg, log=log if rank == 0 else None)
        self.layout = resolve_layout(cfg, world_size, rank)
        validate(cfg, self.layout.dp)
        resolve_vocab(cfg)
        self.layout = resolve_layout(cfg, world_size, rank)  # again: the vocabulary is known
        self.cfg = cfg
        self.is_main = rank == 0
        self.log = log if self.is_main else (lambda *_: None)
        self.device = resolve_device(cfg.train.device, local_rank)
        slow_precision = resolve_dtype(cfg.precision, self.device)
        if slow_precision:
            self.log(slow_precision)
        if cfg.train.tune_malloc:
            tune_malloc()
        configure_cpu_fp32_matmul(cfg.train.cpu_fp32_matmul)
        init_distributed(cfg, self.device)
        self.mesh = build_mesh(self.layout, self.device)
        torch.manual_seed(cfg.train.seed)
        # every rank builds and initializes the whole model from the same seed, then keeps its
        # shards: the weights equal the single-process run's, which the equivalence tests need
        self.model = build_model(cfg.model, self.device, seed=cfg.train.seed)
        self.loss_fn = torch.compile(lm_loss) if cfg.train.compile else lm_loss
        # tp: vocabulary-sharded logits, cross-entropy without gathering them
        self.loss_context = loss_parallel if self.layout.tp > 1 else contextlib.nullcontext
        self.pipeline = None
        if self.layout.pp > 1:  # this rank keeps its stages only, each parallelized
            from bloomline.trainer.parallel.pipeline import build_pipeline

            self.pipeline = build_pipeline(self.model, self.mesh, self.layout, cfg,
                                           self.device, self.loss_fn, self.loss_context)
            self.model = self.pipeline.model  # the stages' modules, single-process names
        else:
            parallelize(self.model, self.mesh, self.layout, cfg)
        self.optimizer = build_optimizer(self.model, cfg.optimizer)
        if self.layout.dp > 1 and cfg.parallel.zero_stage == 1:
            from bloomline.trainer.parallel.data_parallel import shard_optimizer_state

            self.optimizer = shard_optimizer_state(self.optimizer, self.mesh["dp"])
        # the config's hyper-parameters: a checkpoint's param groups must not replace them
        self._hyperparameters = [{k: v for k, v in group.items() if k != "params"}
                                 for group in self.optimizer.param_groups]
        self.precision = Precision(cfg.precision, self.device)
        self.run_dir = Path(cfg.train.run_dir)
        self.state = {"step": 0, "consumed_samples": 0, "consumed_tokens": 0,
                      "skipped_steps": 0, "bad_in_row": 0, "loss_scale": {}}
        self.peak: Peak | None = None  # per device, resolved in run()
        self._mfu_guard: MfuGuard | None = None
        self._mfu_flagged = False
        self._run_info: dict = {}
        self.guard = RunGuard(cfg, self.run_dir, rank)
        self.skips = SkipRanges(cfg.train.skip_samples)
        self._async_saver = None

    # -- one optimizer step ---------------------------------------------------------------
    def train_step(self, micro_batches: list[torch.Tensor], lr: float,
                   thermometers: bool = False, sources: torch.Tensor | None = None,
                   num_sources: int = 0) -> dict:
        """Forward/backward over the micro-batches of one global batch ([mbs, L + 1] token
        tensors), clip, and step (or skip the step when the loss or a gradient is not
        finite). Returns loss, grad_norm, skipped and, with ``thermometers``, the per-layer
        readings. With ``sources`` (the dataset number of each of this rank's samples, in
        micro-batch order; ``evaluation.sample_sources``) also ``source_totals``: per dataset
        of ``num_sources``, the sum of its samples' losses and their count over the global
        batch (every dp rank's), from this step's forward."""
        if self.pipeline is not None:  # the schedule runs forward/backward over the stages
            return self.pipeline.train_step(micro_batches, lr, self.optimizer, self.precision,
                                            thermometers, sources, num_sources)
        model, precision = self.model, self.precision
        model.train()
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        count = len(micro_batches)
        total = torch.zeros((), device=self.device)
        per_sample = []
        for index, tokens in enumerate(micro_batches):
            tokens = tokens.to(self.device, non_blocking=True)
            model.set_thermometers(thermometers and index == 0)
            # data parallelism reduces gradients once, after the last micro-batch
            set_gradient_sync(model, index == count - 1)
            with self.loss_context():
                if sources is None:
                    loss = self._forward_loss(tokens)
                else:
                    loss, samples_loss = self._forward_loss(tokens, per_sample=True)
                    per_sample.append(samples_loss)
                precision.scale(loss / count).backward()
            total += loss.detach()
        model.set_thermometers(False)
        loss = self._mean_over_data_parallel(total / count)
        totals = None
        if sources is not None:
            totals = self._sum_over_data_parallel(
                source_totals(torch.cat(per_sample), sources, num_sources))
        if precision.scaler is not None:
            precision.scaler.unscale_(self.optimizer)
        clip = self.cfg.optimizer.clip_grad or math.inf
        grad_norm = clip_grad_norm(model.parameters(), clip)
        finite = bool(torch.isfinite(grad_norm)) and bool(torch.isfinite(loss))
        result = {"loss": float(loss), "grad_norm": float(grad_norm), "skipped": not finite}
        if totals is not None:
            result["source_totals"] = totals.tolist()
        if thermometers:
            result["thermometers"] = thermometer_readings(model)
        if precision.scaler is not None:
            precision.scaler.step(self.optimizer)  # skips by itself on inf/NaN gradients
            precision.scaler.update()
        elif finite:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return result

    def _forward_loss(self, tokens: torch.Tensor, per_sample: bool = False
                      ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """The mean loss of a [mbs, L + 1] token batch (inside ``loss_context``), and with
        ``per_sample`` each sample's mean loss [mbs] (detached) from the same forward. Without
        tensor parallelism the model fuses its head with the loss (no fp32 logits: 3-4x
        faster than cross-entropy over materialized logits on CPU, ``model/loss.py``);
        vocabulary-sharded logits go through ``loss_parallel``."""
        labels = tokens[:, 1:]
        if self.layout.tp == 1:
            with self.precision.autocast():
                out = self.model(tokens[:, :-1], labels=labels, token_losses=per_sample)
            return (out[0], per_sample_means(out[1], labels)) if per_sample else out
        with self.precision.autocast():
            logits = self.model(tokens[:, :-1])
        if not per_sample:
            return self.loss_fn(logits, labels)
        loss, token_losses = token_cross_entropy(logits, labels)
        return loss, per_sample_means(token_losses, labels)

    def full_model_state(self) -> dict[str, torch.Tensor]:
        """The whole model's parameters as plain CPU tensors under the single-process names,
        on every rank (gathers shards: for tests, export and small models)."""
        if self.pipeline is not None:
            return self.pipeline.full_model_state()
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_model_state_dict,
        )

        state = get_model_state_dict(self.model, options=StateDictOptions(full_state_dict=True))
        return {name: value.detach().cpu() for name, value in state.items()}

    def _mean_over_data_parallel(self, value: torch.Tensor) -> torch.Tensor:
        """The mean of a per-rank scalar over the dp ranks (the global batch's loss)."""
        if self.layout.dp == 1:
            return value
        return self._sum_over_data_parallel(value) / self.layout.dp

    def _sum_over_data_parallel(self, value: torch.Tensor) -> torch.Tensor:
        """The sum of a per-rank tensor over the dp ranks."""
        if self.layout.dp == 1:
            return value
        import torch.distributed as dist

        value = value.clone()
        dist.all_reduce(value, op=dist.ReduceOp.SUM, group=self.mesh["dp"].get_group())
        return value

    @torch.no_grad()
    def sample_losses(self, samples) -> torch.Tensor:
        """Each sample's mean loss ([len(samples)] fp32 on CPU, on every rank), forward only in
        micro-batches of ``train.micro_batch_size``. Collective: every rank evaluates every
        sample (FSDP's gathers need all dp ranks in each forward)."""
        if self.pipeline is not None:
            return self.pipeline.sample_losses(samples)
        self.model.eval()

        def forward(tokens: torch.Tensor) -> torch.Tensor:
            with self.loss_context():
                return self._forward_loss(tokens.to(self.device), per_sample=True)[1]

        return batched_sample_losses(forward, samples, self.cfg.train.micro_batch_size)

    def evaluate(self, samples, num_samples: int, split: str = "valid") -> dict:
        """``{split}_loss`` and ``{split}_ppl`` over the first ``num_samples`` samples and, when
        ``samples`` is a blend of several datasets, ``{split}_loss/NAME`` / ``{split}_ppl/NAME``
        over the first ``num_samples`` of each dataset's own split (``evaluation.py``)."""
        return evaluate_split(self.sample_losses, samples, num_samples, split).record()

    # -- the run ----------------------------------------------------------------------------
    def total_steps(self) -> int:
        """Steps of the whole run: global batches until the train samples run out (skipped
        samples count as consumed)."""
        consumed, steps = 0, 0
        while True:
            size = global_batch_size(self.cfg, consumed, self.layout.dp)
            following = self.skips.advance(consumed, size)
            if following > self.cfg.train.train_samples:
                return steps
            consumed = following
            steps += 1

    def _progress(self) -> tuple[int, int]:
        if self.cfg.schedule.unit == "tokens":
            return (self.state["consumed_tokens"],
                    self.cfg.train.train_samples * self.cfg.data.seq_length)
        return self.state["consumed_samples"], self.cfg.train.train_samples

    def resume(self) -> Path | None:
        """Continue from a checkpoint of this run (``checkpoint.resume``) and return it; when
        there is none, start, from ``checkpoint.init_from``'s weights if set."""
        setting = self.cfg.checkpoint.resume
        path = None
        if setting == "auto":
            path = ckpt.latest_checkpoint(self.run_dir, log=self.log)
        elif setting != "none":
            path = Path(setting)
            if not path.is_dir():
                raise UserError(f"checkpoint.resume {setting}: no such checkpoint folder")
        if path is None:
            load_initial_weights(self.model, self.model_source)
            return None
        changed = ckpt.changed_settings(self.load(path, verified=setting == "auto"), self.cfg)
        if changed:
            self.log(f"resuming {path.name}: settings differ from the checkpoint's, this run's "
                     f"values win: {'; '.join(changed)}")
        return path

    def load(self, path: Path, verified: bool = False) -> Config:
        """Model, optimizer, RNG and trainer state from the checkpoint ``path``;
        ``verified``: its manifest was just checked (by ``latest_checkpoint``), skip hashing
        it a second time. The optimizer keeps this run's hyper-parameters. Returns the config
        the checkpoint was written with."""
        saved = ckpt.load_config_of(path, Config)
        ckpt.check_compatible(saved, self.cfg, path)
        self.state = ckpt.load_checkpoint(path, self.model, self.optimizer, verified=verified)
        for group, settings in zip(self.optimizer.param_groups, self._hyperparameters,
                                   strict=True):
            group.update(settings)
        self.precision.load_state_dict(self.state.get("loss_scale", {}))
        self.guard.detector.load_state_dict(self.state.get("spike_history", {}))
        # the skips in force and the checkpoint's (at a rollback the former hold the latter).
        # RUN/rollbacks.json is not read here but once in run(), after a resume: at a
        # rollback rank 0 may have written this rollback's range into it already, and a rank
        # that read it would compute the range against other skips than the others (a hang)
        self.skips = SkipRanges([*self.skips.to_list(), *self.state.get("skip_samples", [])])
        self.state["skip_samples"] = self.skips.to_list()
        return saved

    def _merge_skips(self) -> None:
        """The skips in force: the config's, the checkpoint's, and those of rollbacks after
        the checkpoint was written (``RUN/rollbacks.json``)."""
        self.skips = SkipRanges([*self.cfg.train.skip_samples,
                                 *self.state.get("skip_samples", []),
                                 *read_rollbacks(self.run_dir)["skip_samples"]])
        self.state["skip_samples"] = self.skips.to_list()

    def save(self) -> Path:
        """A checkpoint of this step (in the background with ``checkpoint.async``)."""
        self.state["loss_scale"] = self.precision.state_dict()
        self.state["spike_history"] = self.guard.detector.state_dict()
        started = time.perf_counter()
        self.guard.watchdog.arm(f"checkpoint of step {self.state['step']}",
                                self.cfg.watchdog.startup_seconds)
        if self.cfg.checkpoint.async_:
            if self._async_saver is None:
                self._async_saver = ckpt.AsyncCheckpointer(
                    self.run_dir, self.cfg.checkpoint.keep_last, is_writer=self.is_main)
            path = self._async_saver.save(self.state["step"], self.model, self.optimizer,
                                          self.state, self.cfg)
        else:
            path = ckpt.save_checkpoint(self.run_dir, self.state["step"], self.model,
                                        self.optimizer, self.state, self.cfg,
                                        self.cfg.checkpoint.keep_last, is_writer=self.is_main)
        self.guard.watchdog.disarm()
        self.guard.last_save_seconds = time.perf_counter() - started
        return path

    def _finish_saves(self) -> None:
        """Wait for a checkpoint still being written in the background."""
        if self._async_saver is not None:
            self.guard.watchdog.arm("finishing an async checkpoint",
                                    self.cfg.watchdog.startup_seconds)
            self._async_saver.wait()
            self.guard.watchdog.disarm()

    def _settle_saves(self) -> None:
        """When the run fails with a checkpoint still being written in the background: let it
        complete (under the watchdog), so that what it holds is kept; its own failure is
        logged, the run's error stays the one reported."""
        if self._async_saver is None or not self._async_saver.in_flight:
            return
        try:
            self._finish_saves()
        except Exception as err:  # noqa: BLE001 - the run's own error is on its way out
            self.log(f"the checkpoint being written when the run failed: {err}")

    def run(self) -> dict:
        """Train to the end of ``train.train_samples`` (or a stop: ``exit_interval``, a signal,
        ``train.max_wallclock``, too many rollbacks). Returns the trainer state; a run that
        stopped early to be continued has ``state["stopped"]`` set to the reason."""
        # the run folder's lock; from here on a SIGTERM / SIGUSR1 / SIGINT asks for a checkpoint
        self.guard.start()
        try:
            return self._run()
        finally:  # also when the run fails: no loader worker or save outlives it
            close_loader(self._loader)
            self._loader = None
            self._settle_saves()
            self.guard.close()

    def _run(self) -> dict:
        cfg = self.cfg
        self.run_dir.mkdir(parents=True, exist_ok=True)
        splits = open_splits(cfg.data.corpus, cfg.data.seq_length, cfg.train.train_samples,
                             None, cfg.data.split, cfg.data.seed, cfg.data.weights,
                             cfg.data.cache_dir)
        train = splits["train"]
        if len(train) < cfg.train.train_samples:
            raise UserError(f"data: the train split serves {len(train)} samples, fewer than "
                            f"train.train_samples {cfg.train.train_samples}")
        resumed = self.resume()
        check_start_point(self.run_dir, cfg.checkpoint.resume, resumed, self.state["step"])
        self._merge_skips()
        state = self.state  # after resume(), which replaces it
        # the matmul peak for MFU, while nothing else of this run computes: the loader workers,
        # TensorBoard's writer and checkpoint threads start below (mfu.py)
        self.peak = resolve_peak(cfg.monitor.peak_flops, self.device, self.precision.dtype,
                                 self.run_dir, self._measure_peak, is_writer=self.is_main)
        self._mfu_guard = MfuGuard(self.peak, self._measure_peak,
                                   PeakCache(self.run_dir) if self.is_main else None,
                                   machine_key(self.device, self.precision.dtype))
        self._run_info = {"parameters": cfg.model.num_parameters(), "device": str(self.device),
                          "layout": self.layout.describe(), "resumed_from": str(resumed or "")}
        initialized = (self.model_source.path
                       if not resumed and self.model_source.kind == "init" else None)
        if initialized:
            self._run_info["initialized_from"] = str(initialized)
        self._write_run_files()
        self.log(f"model: {self._run_info['parameters']:,} parameters; "
                 f"{self.layout.describe()}; device {self.device}; {self.precision.name}; "
                 f"matmul peak {self.peak.describe()}"
                 + (f"; resumed from {resumed}" if resumed else "")
                 + (f"; weights from {initialized} ({self.model_source.format}), optimizer "
                    "fresh, step 0" if initialized else ""))
        if self.skips:
            self.log(f"skipping train samples {self.skips.to_list()}")
        metrics = MetricsWriter(self.run_dir, cfg.monitor.tensorboard and self.is_main,
                                enabled=self.is_main)
        total_steps = self.total_steps()
        if state["step"] >= total_steps:
            self.log(f"run complete: step {state['step']} of {total_steps}")
            return state
        profiler = _Profiler(cfg.train.profile_steps, self.run_dir, self.device)
        try:
            self._train(train, splits, metrics, profiler)
            if not self.state.get("stopped"):
                self._finish_run(splits, metrics)
        finally:
            profiler.close()
        metrics.close()
        return self.state

    def _measure_peak(self) -> float:
        # through this module's name: tests replace loop.measure_peak_flops to save the time
        return measure_peak_flops(self.device, self.precision.dtype)

    def _write_run_files(self) -> None:
        """RUN/config.toml (the resolved config, with the peak in use) and RUN/run_info.json."""
        if not self.is_main:
            return
        resolved = copy.deepcopy(self.cfg)
        resolved.monitor.peak_flops = self.peak.flops
        (self.run_dir / "config.toml").write_text(to_toml(resolved))
        info = {**self._run_info, **self.peak.record()}
        (self.run_dir / "run_info.json").write_text(json.dumps(info, indent=1))

    def _check_mfu(self, record: dict, metrics) -> None:
        """No MFU above 100% without a reason: the guard measures the peak again when a step
        beats it, and flags an MFU that stays above (mfu.py). Rank 0, which logs, only."""
        if self._mfu_guard is None or not self.is_main:
            return
        step = record["step"]
        achieved = (self.cfg.model.flops_per_token(record["seq_length"])
                    * record["tokens_per_s"] / self.layout.world_size)
        mfu, flag, event = self._mfu_guard.check(achieved, step)
        record["mfu"] = mfu
        if event is not None:
            metrics.write(event)
            raised = self._mfu_guard.peak is not self.peak
            self.log(f"step {step}: {achieved / 1e9:,.1f} GFLOP/s per device, above the "
                     f"matmul peak of {self.peak.flops / 1e9:,.1f} ({self.peak.source}); "
                     f"measured again: {event['measured_flops'] / 1e9:,.1f} GFLOP/s"
                     + ("; using it" if raised else "; keeping the old figure"))
            self.peak = self._mfu_guard.peak
            self._write_run_files()
        if flag:
            record["mfu_flag"] = flag
            if not self._mfu_flagged:  # once a streak; each record carries its own flag
                self.log(f"step {step}: mfu {100 * mfu:.1f}% is a measurement error: {flag}")
        self._mfu_flagged = bool(flag)

    def _open_batches(self, train):
        """Micro-batch iterator and, when spike faults are injected or the train split is a
        blend (per-source losses at log steps), the sample ids of each micro-batch, from the
        current position."""
        cfg = self.cfg
        sampler = MegatronSampler(cfg.train.train_samples, self.state["consumed_samples"],
                                  cfg.train.micro_batch_size, self.layout.dp_rank,
                                  self.layout.dp, self.skips)
        close_loader(self._loader)  # a rollback's new position: the old workers go now
        self._loader = loader = iter(make_loader(train, sampler, cfg.data.num_workers,
                                                 cfg.data.prefetch_factor,
                                                 self.device.type == "cuda"))
        wants_ids = faults.spike_samples() or blend_of(train) is not None
        return loader, (iter(sampler) if wants_ids else None)

    def _train(self, train, splits, metrics, profiler) -> None:
        cfg, guard = self.cfg, self.guard
        total_steps = self.total_steps()
        loader, sample_ids = self._open_batches(train)
        blend = blend_of(train)
        window = {"start": time.perf_counter(), "tokens": 0, "samples": 0, "steps": 0}
        steps_here = 0
        while self.state["step"] < total_steps and not (
                cfg.train.exit_interval and steps_here >= cfg.train.exit_interval):
            state = self.state
            steps_here += 1
            step = state["step"] + 1
            profiler.at_step(step)
            guard.watchdog.arm(f"step {step}")
            size = global_batch_size(cfg, state["consumed_samples"], self.layout.dp)
            length = sequence_length(cfg, state["consumed_tokens"])
            micro = [next(loader)[:, : length + 1]
                     for _ in range(size // (cfg.train.micro_batch_size * self.layout.dp))]
            ids = [next(sample_ids) for _ in micro] if sample_ids is not None else None
            if ids is not None:  # unchanged unless spike faults are injected
                micro = faults.corrupt_spiked(micro, ids, cfg.model.vocab_size)
            log_step = step % cfg.train.log_interval == 0 or step == total_steps
            # per-source losses at log steps only: the blend's provenance of this rank's ids
            sources = sample_sources(train, ids) if log_step and blend is not None else None
            self._check_ids(micro, step)
            progress, total = self._progress()
            lr = learning_rate(progress, total, cfg.optimizer, cfg.schedule)
            thermo = bool(cfg.monitor.thermometer_interval
                          and step % cfg.monitor.thermometer_interval == 0)
            faults.fire("step", step=step)
            result = self.train_step(micro, lr, thermometers=thermo, sources=sources,
                                     num_sources=len(blend.names) if blend else 0)
            verdict = guard.judge(result)
            guard.watchdog.disarm(step_finished=True)
            if self._async_saver is not None:  # a background save's failure ends the run now
                self._async_saver.raise_if_failed()
            if verdict.finding is not None and self._roll_back(verdict.finding, step, metrics):
                total_steps = self.total_steps()
                loader, sample_ids = self._open_batches(train)
                window = {"start": time.perf_counter(), "tokens": 0, "samples": 0,
                          "steps": 0}
                continue
            state["step"] = step
            state["consumed_samples"] = self.skips.advance(state["consumed_samples"], size)
            state["consumed_tokens"] += size * length
            self._count_bad(result, step)
            window["tokens"] += size * length
            window["samples"] += size
            window["steps"] += 1
            if log_step:
                record = self._record(result, lr, size, length, window)
                self._check_mfu(record, metrics)
                if "source_totals" in result:
                    record.update(source_loss_record(result["source_totals"], blend.names))
                metrics.write(record)
                self.log(console_line(record, total_steps))
                window = {"start": time.perf_counter(), "tokens": 0, "samples": 0, "steps": 0}
            if thermo:
                metrics.write({"kind": "thermometer", "step": step, **result["thermometers"]})
            if cfg.train.eval_interval and step % cfg.train.eval_interval == 0:
                self._evaluate(splits, metrics, step)
            if cfg.checkpoint.interval and step % cfg.checkpoint.interval == 0:
                self.log(f"checkpoint: {self.save()}")
            if verdict.stop_reason:
                self._stop_for(verdict.stop_reason, metrics)
                return

    def _finish_run(self, splits, metrics) -> None:
        """The last evaluation and checkpoint (end of the run or of ``exit_interval``)."""
        cfg, step = self.cfg, self.state["step"]
        if cfg.train.eval_interval and step % cfg.train.eval_interval:
            self._evaluate(splits, metrics, step)
        if not cfg.checkpoint.interval or step % cfg.checkpoint.interval:
            self.log(f"checkpoint: {self.save()}")
        self._finish_saves()

    def _stop_for(self, reason: str, metrics) -> None:
        """Save (unless this step's checkpoint was just written) and mark the run stopped."""
        step = self.state["step"]
        if not (self.cfg.checkpoint.interval and step % self.cfg.checkpoint.interval == 0):
            self.log(f"checkpoint: {self.save()}")
        self._finish_saves()
        self.state["stopped"] = reason
        metrics.write({"kind": "stop", "step": step, "reason": reason})
        self.log(f"stopping after step {step}: {reason}; checkpoint saved, exit code "
                 f"{PREEMPTED_EXIT_CODE} (resume with --resume auto)")

    def _roll_back(self, finding: SpikeFinding, step: int, metrics) -> bool:
        """Reload the newest good checkpoint before ``step`` and skip the batches around the
        spike. False when there is none (or rollbacks are off): the caller goes on as
        before rollbacks existed (a non-finite step is skipped, a finite spike kept)."""
        cfg = self.cfg
        event = {"kind": "rollback", "step": step, "reason": finding.reason,
                 "loss": finding.value if finding.reason != "grad-norm spike" else None,
                 "value": finding.value, "baseline": finding.baseline,
                 "threshold": finding.threshold}
        if not cfg.spike.enabled:
            return False
        self._finish_saves()
        target = ckpt.latest_checkpoint(self.run_dir, before_step=step, log=self.log)
        if target is None:
            self.log(f"step {step}: {finding.describe()}; no checkpoint before it to roll "
                     "back to")
            metrics.write({**event, "kind": "spike", "action": "none (no checkpoint)"})
            return False
        rollbacks = self.state.get("rollbacks", 0) + 1
        if rollbacks > cfg.spike.max_rollbacks:
            raise UserError(f"stopping at step {step}: {finding.describe()}, and the run "
                            f"has rolled back spike.max_rollbacks = {cfg.spike.max_rollbacks}"
                            f" times already; see {self.run_dir / ROLLBACKS_FILE}, lower "
                            "optimizer.lr or skip more data (train.skip_samples)")
        self.load(target, verified=True)
        start, end = skip_range(cfg, self.state["step"], self.state["consumed_samples"],
                                step, self.skips, self.layout.dp)
        self.skips.add(start, end)
        self.state["skip_samples"] = self.skips.to_list()
        self.state["rollbacks"] = rollbacks
        event.update(checkpoint=str(target), checkpoint_step=self.state["step"],
                     skip=[start, end], rollbacks=rollbacks)
        if self.is_main:
            append_rollback(self.run_dir, event, self.skips)
        metrics.write(event)
        self.log(f"step {step}: {finding.describe()}; rolled back to {target.name} (step "
                 f"{self.state['step']}) and skipping train samples [{start}, {end}) "
                 f"(rollback {rollbacks} of at most {cfg.spike.max_rollbacks})")
        return True

    def _evaluate(self, splits, metrics, step: int) -> None:
        if "valid" not in splits:
            return
        self.guard.watchdog.arm(f"evaluation at step {step}", self.cfg.watchdog.startup_seconds)
        record = {"kind": "valid", "step": step,
                  **self.evaluate(splits["valid"], self.cfg.train.eval_samples)}
        self.guard.watchdog.disarm()
        metrics.write(record)
        self.log(valid_console_line(record))

    def _check_ids(self, micro: list[torch.Tensor], step: int) -> None:
        largest = max(int(batch.max()) for batch in micro)
        if largest >= self.cfg.model.vocab_size:
            raise UserError(f"data.corpus {self.cfg.data.corpus}: token id {largest} in the "
                            f"batch of step {step} is >= model.vocab_size "
                            f"{self.cfg.model.vocab_size}: the data's vocabulary is larger "
                            "than the model's")

    def _count_bad(self, result: dict, step: int) -> None:
        state = self.state
        if not result["skipped"]:
            state["bad_in_row"] = 0
            return
        state["skipped_steps"] += 1
        overflow = self.precision.scaler is not None and math.isfinite(result["loss"])
        if overflow:  # fp16 loss-scale overflow: expected, the scaler backs off
            return
        state["bad_in_row"] += 1
        self.log(f"step {step}: non-finite loss {result['loss']} or gradient norm "
                 f"{result['grad_norm']}; step skipped ({state['bad_in_row']} in a row)")
        if state["bad_in_row"] > self.cfg.train.max_bad_steps:
            raise UserError(f"stopping: {state['bad_in_row']} consecutive steps with a "
                            f"non-finite loss or gradient (train.max_bad_steps = "
                            f"{self.cfg.train.max_bad_steps}); lower optimizer.lr or resume "
                            "from an earlier checkpoint")

    def _record(self, result: dict, lr: float, size: int, length: int, window: dict) -> dict:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        seconds = max(time.perf_counter() - window["start"], 1e-9)
        tokens_per_s = window["tokens"] / seconds
        flops = self.cfg.model.flops_per_token(length) * tokens_per_s
        return {"kind": "train", "step": self.state["step"], "loss": result["loss"], "lr": lr,
                "grad_norm": result["grad_norm"], "tokens_per_s": tokens_per_s,
                "samples_per_s": window["samples"] / seconds,
                "step_time_s": seconds / max(window["steps"], 1),
                # tokens_per_s counts the whole global batch: divide by every device's peak
                "mfu": (flops / (self.peak.flops * self.layout.world_size)
                        if self.peak else 0.0),
                "memory_gb": memory_bytes(self.device) / 1e9,
                "loss_scale": self.precision.loss_scale, "seq_length": length,
                "global_batch_size": size,
                "consumed_samples": self.state["consumed_samples"],
                "consumed_tokens": self.state["consumed_tokens"],
                "skipped_steps": self.state["skipped_steps"],
                # model states this rank holds (its local shards): parallel/memory.py
                **memory_record(self.model, self.optimizer, self.device,
                                self.cfg.parallel.offload)}


class _Profiler:
    """``train.profile_steps = A:B``: a torch.profiler trace of steps A..B-1 into RUN/profile."""

    def __init__(self, spec: str, run_dir: Path, device: torch.device) -> None:
        self.range = tuple(int(v) for v in spec.split(":")) if spec else None
        self.run_dir, self.device = run_dir, device
        self._profile = None

    def at_step(self, step: int) -> None:
        if self.range is None:
            return
        if step == self.range[0] and self._profile is None:
            activities = [torch.profiler.ProfilerActivity.CPU]
            if self.device.type == "cuda":
                activities.append(torch.profiler.ProfilerActivity.CUDA)
            self._profile = torch.profiler.profile(activities=activities, record_shapes=True)
            self._profile.__enter__()
        elif step == self.range[1]:
            self.close()

    def close(self) -> None:
        if self._profile is None:
            return
        self._profile.__exit__(None, None, None)
        out = self.run_dir / "profile"
        out.mkdir(parents=True, exist_ok=True)
        self._profile.export_chrome_trace(str(out / f"trace_steps_{self.range[0]}_"
                                                    f"{self.range[1]}.json"))
        self._profile = None
        self.range = None


