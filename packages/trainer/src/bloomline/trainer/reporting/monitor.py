"""What a run reports, in one place: the per-step record, its MFU (checked by ``mfu.py``'s
guard), the run files (``RUN/run_info.json``, ``RUN/config.toml``, ``RUN/summary.json``), the
profiler window and the console lines, with the elapsed time and ETA (``clock.py``), the
start-up's lines (``start_phases.py``) and the logged loss, the mean over the log interval
(``loss_interval.py``). Records go to ``metrics.py``'s sink (metrics.jsonl and TensorBoard).

Adding a metric touches this file only: put it in ``RunMonitor.train_record`` (the sink
mirrors every number to TensorBoard) and, to see it on the console, in ``console_line``.

Invariants: only rank 0 writes files and prints (the others keep the same state, so every
rank can call every method); a record's keys and the console line's format are what readers
of metrics.jsonl and logs parse, so they change only together with those readers.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch

from bloomline.common.config_loader import thawed_copy, to_toml
from bloomline.trainer.parallel.memory import memory_record
from bloomline.trainer.reporting.clock import RunClock, format_hms, now
from bloomline.trainer.reporting.loss_interval import LossInterval
from bloomline.trainer.reporting.metrics import MetricsWriter, memory_bytes
from bloomline.trainer.reporting.mfu import (
    MfuGuard,
    Peak,
    PeakCache,
    machine_key,
    measure_peak_flops,
    resolve_peak,
)
from bloomline.trainer.reporting.start_phases import StartPhases
from bloomline.trainer.reporting.summary import RunEnd, run_summary, summary_lines, write_summary
from bloomline.trainer.reporting.wandb_sink import WandbSink

__all__ = ["Profiler", "RunMonitor", "Window", "console_line", "source_loss_record",
           "valid_console_line"]


def console_line(record: dict, total_steps: int | None) -> str:
    """The console line of a train record: ``step 5/60 | loss 7.1234 | lr ... | gbs 16 |
    mem 0.68 GB | elapsed 0:01:02 | ETA 0:11:40 | ...`` (the loss: the mean over the log
    interval; elapsed and ETA in h:mm:ss, when the record has them)."""
    step = f"step {record['step']}" + (f"/{total_steps}" if total_steps else "")
    parts = [step, f"loss {record['loss']:.4f}", f"lr {record['lr']:.2e}",
             f"gnorm {record['grad_norm']:.3f}", f"{record['tokens_per_s']:,.0f} tok/s",
             f"mfu {100 * record['mfu']:.1f}%"
             + (" (measurement error: see mfu_flag)" if record.get("mfu_flag") else ""),
             f"seq {record['seq_length']}",
             f"gbs {record['global_batch_size']}", f"mem {record['memory_gb']:.2f} GB"]
    if "elapsed_s" in record:
        parts += [f"elapsed {format_hms(record['elapsed_s'])}",
                  f"ETA {format_hms(record.get('eta_s'))}"]
    if record.get("loss_scale") is not None:
        parts.append(f"scale {record['loss_scale']:g}")
    if record.get("skipped_steps"):
        parts.append(f"skipped {record['skipped_steps']}")
    # a blend's per-source losses of this step (source_loss_record), compactly at the end
    sources = [f"{key.split('/', 1)[1]} {value:.2f}" for key, value in record.items()
               if key.startswith("train_loss/")]
    if sources:
        parts.append(" · ".join(sources))
    return " | ".join(parts)


def valid_console_line(record: dict, split: str = "valid") -> str:
    """``step 300 | valid loss 5.1300 | ppl 169.02 | en 4.98 · code 5.60``: the blend, then
    each dataset's loss (two decimals: it is a glance; metrics.jsonl has them all)."""
    line = (f"step {record['step']} | {split} loss {record[f'{split}_loss']:.4f} | "
            f"ppl {record[f'{split}_ppl']:.2f}")
    prefix = f"{split}_loss/"
    parts = [f"{key[len(prefix):]} {value:.2f}" for key, value in record.items()
             if key.startswith(prefix)]
    return line + (" | " + " · ".join(parts) if parts else "")


def source_loss_record(totals, names: list[str], prefix: str = "train") -> dict[str, float]:
    """``{"train_loss/NAME": mean}`` for every dataset with samples in ``totals`` ([sums,
    counts], as ``losses.source_totals``)."""
    sums, counts = totals
    return {f"{prefix}_loss/{name}": float(s) / float(c)
            for name, s, c in zip(names, sums, counts, strict=True) if c > 0}


@dataclass
class Window:
    """The steps since the last log step: their throughput is the record's."""

    start: float = field(default_factory=now)
    tokens: int = 0
    samples: int = 0
    steps: int = 0

    def add(self, size: int, length: int) -> None:
        self.tokens += size * length
        self.samples += size
        self.steps += 1


class Profiler:
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


class RunMonitor:
    """One rank's reporting for a run: built with the trainer, ``start``ed once the run's
    starting point is known, ``summarize``d when it completes or stops, ``close``d at its end.

    Args:
        cfg: The run's config (its ``monitor`` section, the model's FLOP count, the profiler
            window).
        layout: The parallel layout (world size for MFU, its description).
        device, precision: Where and in what dtype the run computes (peak, memory, scale).
        model, optimizer: For the record's memory of model states.
        is_main: Rank 0: writes files and logs.
        log: Where console lines go.
        started: When the run began (a ``clock.now()`` reading: the trainer's start,
            before the model was built); the elapsed time counts from it.
        start_up: The start-up's lines (``start_phases.py``; by default on ``log``).
    """

    def __init__(self, cfg, layout, device: torch.device, precision, model, optimizer,
                 is_main: bool, log, started: float | None = None,
                 start_up: StartPhases | None = None) -> None:
        self.cfg, self.layout, self.device, self.precision = cfg, layout, device, precision
        self.model, self.optimizer = model, optimizer
        self.is_main, self.log = is_main, log
        self.run_dir = Path(cfg.train.run_dir)
        self.peak: Peak | None = None  # per device, resolved in start()
        self._guard: MfuGuard | None = None
        self._flagged = False
        self._run_info: dict = {}
        self._metrics: MetricsWriter | None = None
        self.profiler = Profiler(cfg.train.profile_steps, self.run_dir, device)
        self.window = Window()
        self.clock = RunClock(started)
        self.start_up = start_up or StartPhases(log, self.clock)
        self._first_step: Window | None = None  # the process's first step, kept apart
        self.losses = LossInterval()  # the steps' losses since the last log line
        self.steps_here = 0
        self.last_loss: tuple[int, float] | None = None  # the step and its logged loss

    # -- the run's start and end ----------------------------------------------------------
    def start(self, resumed: Path | None, initialized: Path | None, init_format: str,
              zero: str = "") -> None:
        """Resolve the matmul peak (while nothing else of this run computes: the loader
        workers, TensorBoard's writer and checkpoint threads start later), write the run
        files and log the run's first line (``zero``: the ZeRO stage and its engine, in
        words; ``parallel.zero_engine.describe_zero``)."""
        cfg = self.cfg
        self.peak = resolve_peak(cfg.monitor.peak_flops, self.device, self.precision.dtype,
                                 self.run_dir, self._measure_start_peak,
                                 is_writer=self.is_main)
        self._guard = MfuGuard(self.peak, self._measure_peak,
                               PeakCache(self.run_dir) if self.is_main else None,
                               machine_key(self.device, self.precision.dtype))
        self._run_info = {"parameters": cfg.model.num_parameters(), "device": str(self.device),
                          "layout": self.layout.describe(), "resumed_from": str(resumed or "")}
        if initialized:
            self._run_info["initialized_from"] = str(initialized)
        if zero:
            self._run_info["zero"] = zero
        self._write_run_files()
        # document masking (trainer README, Document masking), said where it changes the run
        documents = "".join(f"{words}; " for on, words in (
            (cfg.data.reset_attention_mask, "attention within documents"),
            (cfg.data.eod_mask_loss, "no loss on EOD inputs")) if on)
        self.log(f"model: {self._run_info['parameters']:,} parameters; "
                 f"{self.layout.describe()}; " + (f"{zero}; " if zero else "")
                 + f"device {self.device}; {self.precision.name}; {documents}"
                 f"matmul peak {self.peak.describe()}"
                 + (f"; resumed from {resumed}" if resumed else "")
                 + (f"; weights from {initialized} ({init_format}), optimizer "
                    "fresh, step 0" if initialized else ""))

    def open_metrics(self) -> None:
        """Start the metrics sink (after ``start``: TensorBoard's writer is a thread), and
        the W&B run with ``monitor.wandb``."""
        if self.is_main and self.cfg.monitor.wandb:
            self.start_up.begin("W&B: opening the run (monitor.wandb)")
        wandb = (WandbSink.open(self.cfg, self.run_dir)
                 if self.is_main and self.cfg.monitor.wandb else None)
        self._metrics = MetricsWriter(self.run_dir, self.cfg.monitor.tensorboard
                                      and self.is_main, enabled=self.is_main, wandb=wandb)

    def close(self, failed: bool = False) -> None:
        """End the profiler and the sinks; ``failed``: the run ends with an error."""
        self.profiler.close()
        if self._metrics is not None:
            self._metrics.close(failed)
            self._metrics = None

    def _measure_start_peak(self) -> float:
        self.start_up.measuring_peak()  # only when the peak is measured (no table, no cache)
        return self._measure_peak()

    def _measure_peak(self) -> float:
        # through this module's name: tests replace monitor.measure_peak_flops to save time
        return measure_peak_flops(self.device, self.precision.dtype)

    def _write_run_files(self) -> None:
        """RUN/config.toml (the resolved config, with the peak in use) and RUN/run_info.json."""
        if not self.is_main:
            return
        resolved = thawed_copy(self.cfg)  # the run's spec is frozen; this file adds the peak
        resolved.monitor.peak_flops = self.peak.flops
        (self.run_dir / "config.toml").write_text(to_toml(resolved))
        info = {**self._run_info, **self.peak.record()}
        (self.run_dir / "run_info.json").write_text(json.dumps(info, indent=1))

    # -- each step --------------------------------------------------------------------------
    def steps_begin(self) -> None:
        """The step loop starts: the throughput window and the clock's step times, and the
        start-up's last line (the first step's own line comes when it ends)."""
        self.start_up.first_step(self.cfg.train.compile)
        self.restart_window()
        self.clock.steps_begin()

    def at_step(self, step: int) -> None:
        """Before step ``step`` runs: the profiler's window."""
        self.profiler.at_step(step)

    def step_done(self, step: int, size: int, length: int, loss: float,
                  skipped: bool = False) -> None:
        """Step ``step`` of ``size`` samples of ``length`` tokens was taken with ``loss``
        (``skipped``: not applied; counts for throughput, the ETA, the logged loss and the
        summary)."""
        self.clock.step_ended()
        self.steps_here += 1
        self.losses.add(loss, skipped)
        self.last_loss = (step, self.losses.mean())
        if self._first_step is None:
            # The process's first step carries the start-up (the loader's first batch,
            # compilation, the kernels' and allocator's warm-up): throughput is measured from
            # its end, so the first figure logged is the run's pace, not its start-up's.
            self._first_step = self.window
            self._first_step.add(size, length)
            self.window = Window()
        else:
            self.window.add(size, length)

    def restart_window(self) -> None:
        """Throughput and the logged loss from now on (after a log step, or a rollback's
        reload: the steps after its checkpoint are trained again)."""
        self.window = Window()
        self.losses = LossInterval()

    def wants_activation_stats(self, step: int) -> bool:
        interval = self.cfg.monitor.activation_stats_interval
        return bool(interval and step % interval == 0)

    def log_step(self, result: dict, lr: float, size: int, length: int, state,
                 total_steps: int, source_names: list[str] | None = None) -> None:
        """Write the train record of a log step, print its console line, restart the window."""
        record = self.train_record(result, lr, size, length, state)
        record["elapsed_s"] = self.clock.elapsed()
        record["eta_s"] = self.clock.eta(total_steps - state.step)
        self._check_mfu(record)
        if "source_totals" in result:
            record.update(source_loss_record(result["source_totals"], source_names))
        self.write(record)
        self.log(console_line(record, total_steps))
        self.restart_window()

    def train_record(self, result: dict, lr: float, size: int, length: int,
                     state) -> dict:
        """The train record of the step just taken (``state``: the trainer's counters after
        it), its loss and throughput over the current window (the steps since the last log
        step: ``loss`` their mean, ``loss_last`` this step's, ``result``'s when no step was
        counted; throughput not over the process's first step unless it is the only one)."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        window = self.window if self.window.steps or self._first_step is None \
            else self._first_step
        seconds = max(now() - window.start, 1e-9)
        tokens_per_s = window.tokens / seconds
        flops = self.cfg.model.flops_per_token(length) * tokens_per_s
        return {"kind": "train", "step": state.step, **self.losses.record(result["loss"]),
                "lr": lr,
                "grad_norm": result["grad_norm"], "tokens_per_s": tokens_per_s,
                "samples_per_s": window.samples / seconds,
                "step_time_s": seconds / max(window.steps, 1),
                # tokens_per_s counts the whole global batch: divide by every device's peak
                "mfu": (flops / (self.peak.flops * self.layout.world_size)
                        if self.peak else 0.0),
                "memory_gb": memory_bytes(self.device) / 1e9,
                "loss_scale": self.precision.loss_scale, "seq_length": length,
                "global_batch_size": size,
                "consumed_samples": state.consumed_samples,
                "consumed_tokens": state.consumed_tokens,
                "skipped_steps": state.skipped_steps,
                # the ranks' time per section of the step, when the loop gathered them
                # (reporting/stragglers.py: time_SECTION_s and time_SECTION_max_s)
                **result.get("section_times", {}),
                # model states this rank holds (its local shards): parallel/memory.py
                **memory_record(self.model, self.optimizer, self.device,
                                self.cfg.parallel.offload)}

    def _check_mfu(self, record: dict) -> None:
        """No MFU above 100% without a reason: the guard measures the peak again when a step
        beats it, and flags an MFU that stays above (mfu.py). Rank 0, which logs, only."""
        if self._guard is None or not self.is_main:
            return
        step = record["step"]
        achieved = (self.cfg.model.flops_per_token(record["seq_length"])
                    * record["tokens_per_s"] / self.layout.world_size)
        mfu, flag, event = self._guard.check(achieved, step)
        record["mfu"] = mfu
        if event is not None:
            self.write(event)
            raised = self._guard.peak is not self.peak
            self.log(f"step {step}: {achieved / 1e9:,.1f} GFLOP/s per device, above the "
                     f"matmul peak of {self.peak.flops / 1e9:,.1f} ({self.peak.source}); "
                     f"measured again: {event['measured_flops'] / 1e9:,.1f} GFLOP/s"
                     + ("; using it" if raised else "; keeping the old figure"))
            self.peak = self._guard.peak
            self._write_run_files()
        if flag:
            record["mfu_flag"] = flag
            if not self._flagged:  # once a streak; each record carries its own flag
                self.log(f"step {step}: mfu {100 * mfu:.1f}% is a measurement error: {flag}")
        self._flagged = bool(flag)

    def activation_stats(self, step: int, readings: dict) -> None:
        self.write({"kind": "activation_stats", "step": step, **readings})

    def valid(self, record: dict) -> None:
        """A validation record (``kind`` valid) and its console line."""
        self.write(record)
        self.log(valid_console_line(record))

    def write(self, record: dict) -> None:
        """Any record (events: rollbacks, spikes, stops, MFU re-measurements) to the sink."""
        if self._metrics is not None:
            self._metrics.write(record)

    # -- the run's end ------------------------------------------------------------------------
    def summarize(self, state, total_steps: int, stop_reason: str,
                  checkpoint: Path | None, has_valid: bool) -> dict | None:
        """Rank 0: print the end-of-run summary and write ``RUN/summary.json``
        (``summary.py``); returns the summary (None on other ranks)."""
        if not self.is_main:
            return None
        end = RunEnd(self.run_dir, state, total_steps, stop_reason, self.clock.elapsed(),
                     self.steps_here, self.last_loss, checkpoint, has_valid,
                     bool(self.cfg.data.tokenizer))
        summary = run_summary(end)
        path = write_summary(self.run_dir, summary)
        for line in summary_lines(summary, path):
            self.log(line)
        return summary
