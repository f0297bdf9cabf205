"""The matmul peak that MFU divides by: measured so that it can be trusted, cached per machine in
the run folder, and checked against what the run achieves.

A peak measured while something else holds the cores is too low, and every MFU logged against
it too high (measurements: docs/perf/trainer-step.md). Hence:

- ``measure_peak_flops`` warms up, then runs back-to-back tries of ~20 ms of products each and
  keeps the best. Other work can only slow a try down, never speed it up, so the best try is
  the estimate of the idle machine; 20 ms is long against timer and thread wake-up noise and
  short against a competing process's time slices, so a quiet moment is caught when there is
  one. It goes on for at least ``seconds`` and until two more tries came within 3% of the best
  (the machine was quiet more than once), at most ``max_seconds``.
- The trainer measures before its loader workers, TensorBoard writer and checkpoint threads
  start, and caches the figure in ``RUN/peak_flops.json`` under a key of what the figure
  depends on (host, processor, device type, dtype, threads, ranks per host, torch version):
  a resumed run reuses a figure taken idle instead of measuring again under whatever runs
  then.
- On CPU the ranks of a multi-process run share the host's cores, so they measure at the
  same moment (after a barrier): each one's figure is its share of the machine while the
  others compute too, and the job's peak is their sum (the mean per rank is cached). One GPU
  per rank measures its own device; known GPUs take their dense bf16 peak from a table.
- Each measurement records the conditions it was taken under: the cores other processes kept
  busy meanwhile (``cpu_load.py``) and whether its best try was confirmed. A cached figure
  taken under load (or under unrecorded conditions: a cache from before they were recorded)
  is measured again at the next start; the higher figure is kept, under the new conditions,
  so a run on a quiet machine replaces a figure a busy one left behind.
- ``MfuGuard``: a step's achieved FLOP/s above the peak proves the peak too low. The guard
  measures again right then (the machine has just shown more capacity), keeps the higher
  figure (and caches it), and if the MFU is still above 100% the record carries ``mfu_flag``
  with the reason. An MFU above 100% is never logged without it. Rank 0, which logs, does
  this alone (no collective at a log step): while the other ranks wait in the next step's
  collective its figure can exceed its share of shared cores, so the MFU errs low, not high.
"""

from __future__ import annotations

import datetime
import json
import os
import socket
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from bloomline.common.atomic import atomic_write_bytes
from bloomline.common.machine import cpu_model
from bloomline.trainer.kernels.cpu.linear import onednn_available, onednn_matmul
from bloomline.trainer.reporting.cpu_load import CpuLoadMeter

__all__ = ["CACHE_FILE", "MfuGuard", "Peak", "PeakCache", "PeakMeasurement", "conditions",
           "describe_conditions", "known_gpu_peak", "machine_key", "measure_peak_flops",
           "resolve_peak", "under_load"]

CACHE_FILE = "peak_flops.json"

# Dense bf16 tensor-core peaks of common GPUs (FLOP/s); others are measured.
_GPU_PEAKS = {"H100": 989e12, "H200": 989e12, "A100": 312e12, "L40S": 362e12}

_TRY_SECONDS = 0.02  # one try: a few products, timed together
_AGREE = 0.97  # a try within 3% of the best confirms it
_CONFIRMATIONS = 2  # ... tries besides the best one
_MIN_TRIES = 3
# Other processes using a quarter of a core on average during the measurement make it "taken
# under load": an idle host's daemons stay well below, and one competing busy thread is above.
_BUSY_CORES = 0.25
_clock = time.perf_counter  # a name of its own: tests drive the measurement with a fake clock


class PeakMeasurement(float):
    """A measured peak in FLOP/s (a float) that also says how it was measured (``detail``)
    and under what conditions (``conditions``: see ``conditions()``; None when unknown)."""

    detail: str
    conditions: dict | None

    def __new__(cls, value: float, detail: str, conditions: dict | None = None
                ) -> PeakMeasurement:
        measurement = super().__new__(cls, value)
        measurement.detail = detail
        measurement.conditions = conditions
        return measurement


def conditions(load, stable: bool) -> dict:
    """What a measurement was taken under, as cached: ``load`` (a ``cpu_load.CpuLoad`` or
    None, as on GPU where the host's CPUs do not matter), whether its best try was confirmed
    (``stable``), the 1-minute load average for a person to read, and the verdict
    ``under_load``."""
    record = load.record() if load is not None else {"other_cpu_cores": None}
    record["stable"] = bool(stable)
    try:
        record["loadavg_1m"] = round(os.getloadavg()[0], 2)
    except OSError:  # not on every platform
        record["loadavg_1m"] = None
    record["under_load"] = under_load(record)
    return record


def under_load(recorded: dict | None) -> bool:
    """Whether a figure taken under ``recorded`` conditions may be too low: unknown
    conditions, a best try never confirmed, or other processes keeping ``_BUSY_CORES`` or
    more busy."""
    if not isinstance(recorded, dict) or not isinstance(recorded.get("stable"), bool):
        return True
    other = recorded.get("other_cpu_cores")
    return not recorded["stable"] or (isinstance(other, int | float) and other >= _BUSY_CORES)


def describe_conditions(recorded: dict | None) -> str:
    """``idle (other processes: 0.02 of 16 cores; repeats agree)`` and the like."""
    if not isinstance(recorded, dict):
        return "conditions not recorded"
    other = recorded.get("other_cpu_cores")
    parts = []
    if isinstance(other, int | float):
        parts.append(f"other processes: {other:.2f} of {recorded.get('cores', '?')} cores")
    parts.append("repeats agree" if recorded.get("stable") else "best try not confirmed")
    return f"{'under load' if under_load(recorded) else 'idle'} ({'; '.join(parts)})"


def known_gpu_peak(device: torch.device) -> tuple[float, str] | None:
    """(FLOP/s, GPU name) for a GPU in the table of dense bf16 peaks; None otherwise."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    for key, peak in _GPU_PEAKS.items():
        if key in name:
            return peak, name
    return None


def measure_peak_flops(device: torch.device, dtype: torch.dtype, seconds: float = 0.6,
                       max_seconds: float = 1.5) -> PeakMeasurement:
    """Achievable matmul FLOP/s on ``device`` in ``dtype``: the known dense peak for a known
    GPU; otherwise the best of back-to-back tries (~20 ms each) of 1024^3 (CPU) / 8192^3 (GPU)
    products, for ``seconds`` and until the best is confirmed (see the module docstring), at
    most ``max_seconds``. On CPU in fp32 both ATen's product (MKL) and oneDNN's (the two the
    model's linear layers choose from, see kernels/cpu/linear.py) are timed, half the time each,
    and the faster counts: the limit is the best product the machine offers, not the one a
    baseline happens to call."""
    known = known_gpu_peak(device)
    if known is not None:
        return PeakMeasurement(known[0], f"dense bf16 peak of the {known[1]}")
    n = 8192 if device.type == "cuda" else 1024
    # a generator of its own: this runs after a resume has restored the checkpoint's RNG
    # states, and draws from the global one would change every dropout mask after it
    generator = torch.Generator(device=device)
    a = torch.randn(n, n, device=device, generator=generator).to(dtype)
    b = torch.randn(n, n, device=device, generator=generator).to(dtype)
    products = [torch.matmul]
    if device.type == "cpu" and dtype == torch.float32 and onednn_available():
        products.append(onednn_matmul)
    with CpuLoadMeter() as meter:
        timed = [_best_try(product, a, b, seconds / len(products), max_seconds / len(products))
                 for product in products]
    best, _, agreeing, _ = max(timed)
    tries, spent = sum(t[1] for t in timed), sum(t[3] for t in timed)
    name = str(dtype).removeprefix("torch.")
    # a GPU's products do not compete with the host's other processes for its cores
    load = meter.load if device.type == "cpu" else None
    return PeakMeasurement(best, f"best of {tries} tries of {n}^3 {name} matmuls in "
                                 f"{spent:.1f} s, {agreeing} within 3% of it",
                           conditions(load, stable=agreeing > _CONFIRMATIONS))


def _best_try(product, a: torch.Tensor, b: torch.Tensor, seconds: float, max_seconds: float
              ) -> tuple[float, int, int, float]:
    """(best FLOP/s, tries, tries within 3% of the best, seconds spent) of one product."""
    flops = 2.0 * a.shape[0] * a.shape[1] * b.shape[1]
    begin = _clock()
    for _ in range(2):  # warm-up: the thread pool, oneDNN's JIT, the caches
        product(a, b)
    _sync(a.device)
    single = _clock() - begin  # two products, an upper bound on one
    per_try = max(1, round(_TRY_SECONDS / max(single / 2, 1e-6)))
    rates: list[float] = []
    while True:
        tick = _clock()
        for _ in range(per_try):
            product(a, b)
        _sync(a.device)
        now = _clock()
        rates.append(per_try * flops / (now - tick))
        best = max(rates)
        agreeing = sum(rate >= _AGREE * best for rate in rates)
        confirmed = len(rates) >= _MIN_TRIES and agreeing > _CONFIRMATIONS
        if (now - begin >= seconds and confirmed) or now - begin >= max_seconds:
            return best, len(rates), agreeing, now - begin


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# -- what the figure depends on, and the cache ----------------------------------------------
def _processor(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return cpu_model()


def machine_key(device: torch.device, dtype: torch.dtype) -> str:
    """The cache key: everything the measured figure depends on, readable."""
    threads = f"{torch.get_num_threads()} threads" if device.type == "cpu" else device.type
    ranks = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    return (f"{socket.gethostname()} | {_processor(device)} | {device.type} | "
            f"{str(dtype).removeprefix('torch.')} | {threads} | {ranks} ranks per host | "
            f"torch {torch.__version__}")


class PeakCache:
    """``RUN/peak_flops.json``: ``{"entries": {KEY: {"peak_flops", "how", "measured_at",
    "conditions"}}}`` (``conditions``: what ``conditions()`` recorded; absent in caches
    written before it was, which count as taken under load). A file that does not parse
    counts as empty (it is a cache) and is rewritten."""

    def __init__(self, run_dir: str | Path) -> None:
        self.path = Path(run_dir) / CACHE_FILE

    def _entries(self) -> dict:
        try:
            entries = json.loads(self.path.read_text())["entries"]
            return entries if isinstance(entries, dict) else {}
        except (OSError, ValueError, KeyError, TypeError):
            return {}

    def get(self, key: str) -> dict | None:
        entry = self._entries().get(key)
        if isinstance(entry, dict) and isinstance(entry.get("peak_flops"), int | float) \
                and entry["peak_flops"] > 0:
            return entry
        return None

    def put(self, key: str, peak_flops: float, how: str,
            recorded: dict | None = None) -> None:
        entries = self._entries()
        entries[key] = {"peak_flops": float(peak_flops), "how": how,
                        "measured_at": datetime.datetime.now().astimezone().isoformat(
                            timespec="seconds"),
                        "conditions": recorded}
        atomic_write_bytes(self.path, (json.dumps({"entries": entries}, indent=1) + "\n")
                           .encode())


# -- the run's peak ---------------------------------------------------------------------------
_SAID = {"config": "given in config", "table": "from the GPU table", "measured": "measured now",
         "cached": "cached", "re-measured": "measured again during the run"}


@dataclass
class Peak:
    """The peak of one device the run divides by: FLOP/s, where it came from (``config``,
    ``table``, ``measured``, ``cached``, ``re-measured``), a phrase saying how, and for a
    cached figure when it was measured (``measured_at``, ISO 8601)."""

    flops: float
    source: str
    detail: str
    measured_at: str = ""

    @property
    def measurable(self) -> bool:
        """Whether measuring again could correct it (not a number given or a GPU's table)."""
        return self.source in ("measured", "cached", "re-measured")

    def describe(self) -> str:
        """``432.1 GFLOP/s, measured now (best of ...)``; ``..., cached from 2026-11-26
        00:15:48+00:00 (...)``; ``..., given in config (monitor.peak_flops)``."""
        said = _SAID.get(self.source, self.source)
        if self.source == "cached" and self.measured_at:
            said += f" from {self.measured_at.replace('T', ' ')}"
        return f"{self.flops / 1e9:,.1f} GFLOP/s, {said} ({self.detail})"

    def record(self) -> dict:
        return {"peak_flops": self.flops, "peak_source": self.source,
                "peak_detail": self.detail}


def resolve_peak(setting: float, device: torch.device, dtype: torch.dtype,
                 run_dir: str | Path, measure: Callable[[], float], is_writer: bool) -> Peak:
    """The run's peak per device: ``setting`` (``monitor.peak_flops``) when above 0, a known
    GPU's table entry, the run folder's cached figure for this machine when it was taken
    idle, or ``measure()`` (on every rank at once, after a barrier, when a process group is
    up; the mean is kept), then cached by ``is_writer``. A cached figure taken under load is
    measured again: the higher of the two is used and cached with the new conditions.
    Collective under a process group unless ``setting`` or the table decides (the same on
    every rank)."""
    if setting > 0:
        return Peak(float(setting), "config", "monitor.peak_flops")
    known = known_gpu_peak(device)
    if known is not None:
        return Peak(known[0], "table", f"dense bf16 peak of the {known[1]}")
    import torch.distributed as dist

    group = dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
    cache, key = PeakCache(run_dir), machine_key(device, dtype)
    entry = [cache.get(key)]
    if group:  # rank 0's cache decides for everyone: all measure or none
        dist.broadcast_object_list(entry, src=0)
    cached = entry[0]
    if cached is not None and not under_load(cached.get("conditions")):
        return _cached_peak(cached, "")
    value, detail, recorded = _measure(measure, group)
    if cached is not None:  # taken under load: the higher figure is the better estimate
        why = (f"the cached {cached['peak_flops'] / 1e9:,.1f} GFLOP/s of "
               f"{cached.get('measured_at', '?')} was "
               f"{describe_conditions(cached.get('conditions'))}; measured again")
        if cached["peak_flops"] > value:
            if is_writer:
                cache.put(key, cached["peak_flops"], cached.get("how", ""), recorded)
            return _cached_peak(cached, f"; {why} {value / 1e9:,.1f} GFLOP/s, "
                                        f"{describe_conditions(recorded)}: lower, kept")
        detail = f"{detail}; {why}: higher, used"
    if is_writer:
        cache.put(key, value, detail, recorded)
    return Peak(float(value), "measured", f"{detail}; {describe_conditions(recorded)}")


def _cached_peak(entry: dict, note: str) -> Peak:
    return Peak(float(entry["peak_flops"]), "cached",
                f"{CACHE_FILE}: {entry.get('how', '')}; "
                f"{describe_conditions(entry.get('conditions'))}{note}",
                measured_at=str(entry.get("measured_at", "")))


def _measure(measure: Callable[[], float], group: bool) -> tuple[float, str, dict | None]:
    """(FLOP/s, how, conditions) of ``measure()``: this process's, or under a process group
    the mean of every rank's, measured together after a barrier (ranks sharing a host's cores
    get their share), with the conditions of the job as a whole (``_job_conditions``)."""
    import torch.distributed as dist

    if group:
        dist.barrier()
    value = measure()
    detail = getattr(value, "detail", "measured")
    recorded = getattr(value, "conditions", None)
    if group:
        gathered: list = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, (float(value), recorded))
        values = [v for v, _ in gathered]
        recorded = _job_conditions([c for _, c in gathered])
        value = statistics.fmean(values)
        detail = (f"mean of {len(values)} ranks measured together "
                  f"({min(values) / 1e9:,.1f}-{max(values) / 1e9:,.1f} GFLOP/s); rank 0: "
                  f"{detail}")
    return float(value), detail, recorded


def _job_conditions(per_rank: list) -> dict | None:
    """Rank 0's conditions, with the CPU use of the ranks on its host taken out of "other
    processes" (they measured at the same moment, by design), and stable only if every rank's
    measurement was. None if any rank's are unknown."""
    if not all(isinstance(c, dict) for c in per_rank):
        return None
    first = dict(per_rank[0])
    other = first.get("other_cpu_cores")
    if isinstance(other, int | float):
        mates = sum(c.get("own_cpu_cores") or 0.0 for c in per_rank[1:]
                    if c.get("host") == first.get("host"))
        first["other_cpu_cores"] = round(max(0.0, other - mates), 3)
    first["stable"] = all(bool(c.get("stable")) for c in per_rank)
    first["under_load"] = under_load(first)
    return first


class MfuGuard:
    """MFU from a step's achieved FLOP/s per device, never above 100% without a reason.

    When the achieved FLOP/s exceed the peak, a measurable peak is measured again (at most
    ``max_remeasures`` times a run) and the higher figure kept and cached; an MFU still above
    100% comes with a flag naming the reason.
    """

    def __init__(self, peak: Peak, measure: Callable[[], float], cache: PeakCache | None,
                 key: str, max_remeasures: int = 2) -> None:
        self.peak = peak
        self.measure = measure
        self.cache = cache
        self.key = key
        self.remeasures_left = max_remeasures

    def check(self, achieved: float, step: int) -> tuple[float, str | None, dict | None]:
        """(MFU, flag or None, a ``peak`` event when the peak was measured again) for
        ``achieved`` FLOP/s per device at ``step``."""
        peak, event = self.peak, None
        if achieved > peak.flops and peak.measurable and self.remeasures_left > 0:
            self.remeasures_left -= 1
            fresh = self.measure()
            event = {"kind": "peak", "step": step, "achieved_flops": achieved,
                     "previous_peak_flops": peak.flops, "measured_flops": float(fresh),
                     "reason": "the step's achieved FLOP/s exceeded the peak"}
            if fresh > peak.flops:
                how = (f"re-measured at step {step} after the run achieved "
                       f"{achieved / 1e9:,.1f} GFLOP/s above the {peak.flops / 1e9:,.1f} "
                       f"measured before; {getattr(fresh, 'detail', 'measured')}")
                self.peak = Peak(float(fresh), "re-measured", how)
                if self.cache is not None:
                    self.cache.put(self.key, float(fresh), how,
                                   getattr(fresh, "conditions", None))
            event["peak_flops"] = self.peak.flops
        mfu = achieved / self.peak.flops
        flag = self._reason(achieved) if mfu > 1.0 else None
        return mfu, flag, event

    def _reason(self, achieved: float) -> str:
        peak = self.peak
        said = (f"achieved {achieved / 1e9:,.1f} GFLOP/s per device against a peak of "
                f"{peak.flops / 1e9:,.1f}")
        if peak.source == "config":
            return (f"{said} set by monitor.peak_flops: the setting is too low (0 measures "
                    "it)")
        if peak.source == "table":
            return (f"{said}, the {peak.detail}: the model's FLOP count (flops_per_token) "
                    "exceeds what ran")
        return (f"{said} ({peak.source}: {peak.detail}): the peak was measured while other "
                "work held the device, and measuring again did not reach the achieved rate")
