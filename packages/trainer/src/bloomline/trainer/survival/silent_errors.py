"""Silent data corruption, named: what the trainer makes of a step's recompute
(``step/recompute.py``) and of the replicas' parameter fingerprints (``fingerprints.py``).

The loop holds one ``SilentErrors``: ``begin(step)`` before the step, ``end(step, result)``
after it (before the run guard judges it). The step's runner asks ``suspect`` between the
gradient norm and the optimizer step, with the spike detector's verdict (the same values the
guard judges afterwards, the same on every rank: every rank decides alike without a
collective).

After a recompute each rank knows whether its own results (its loss before the data-parallel
mean, its gradient before the reduction where the engine has that point) differ between the
two attempts; one all-gather of those flags (and the host names) names the ranks:

- nothing differs, and the step's result recurred bitwise: the data made it. One line, a
  ``"kind": "recompute"`` record, and the run guard rolls back and skips the data as before;
- some ranks differ: they computed wrongly once (a transient fault). They are named, with
  their hosts, in a line and a ``"kind": "suspect_hardware"`` record, and their hosts are added
  to ``RUN/suspect_hosts.txt`` (``suspect_hosts.py``). The step goes on with its recomputed
  result, which the guard judges as any step's (a recomputed spike still rolls back);
- every rank differs (more than one): the step is not reproducible (nondeterministic kernels,
  or a fault every rank shares): nothing named;
- the result changed but no rank's own results did: the difference arose past them, in a
  reduction (or, on the FSDP2 engine, in a backward, which cannot be read per rank): suspect
  hardware, no rank named.

A fault inside one model replica travels through its tensor-parallel all-reduces and pipeline
sends to every rank of that replica: naming resolves a rank across data-parallel replicas, and
a tp/pp group within one.
"""

from __future__ import annotations

import math
from pathlib import Path

from bloomline.trainer.survival.bit_flips import bitflip_due, flip_bit
from bloomline.trainer.survival.fingerprints import Mismatch, ReplicaFingerprints
from bloomline.trainer.survival.spikes import SpikeFinding
from bloomline.trainer.survival.suspect_hosts import (
    SUSPECT_HOSTS_FILE,
    add_suspect_hosts,
    gather_from_ranks,
    host_name,
)

__all__ = ["SilentErrors", "fingerprint_report", "recompute_report"]


def _g(value: float) -> str:
    return f"{value:.4g}"


def _and(items: list[str]) -> str:
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} and {items[-1]}"


def _finding_phrase(finding: SpikeFinding, first: dict) -> str:
    if finding.reason == "non-finite":
        return (f"the non-finite loss or gradient norm (loss {_g(first['loss'])}, gradient "
                f"norm {_g(first['grad_norm'])})")
    if finding.reason == "suspect on another rank":  # step/recompute.py's agreement
        return (f"the step another rank found suspect (here: loss {_g(first['loss'])}, "
                f"gradient norm {_g(first['grad_norm'])})")
    name = "loss spike" if finding.reason == "loss spike" else "gradient-norm spike"
    return f"the {name} ({_g(finding.value)} against a baseline of {_g(finding.baseline)})"


def _ranks_phrase(ranks: list[int], hosts: list[str], differing: dict[int, list[str]]) -> str:
    return "; ".join(f"rank {rank} (host {hosts[rank]}) computed a different "
                     f"{_and(differing[rank])}" for rank in ranks)


def recompute_report(step: int, outcome: dict, differing: dict[int, list[str]],
                     hosts: list[str], still_suspect: bool) -> tuple[str, dict, list[int]]:
    """The console line, the metrics record and the suspect ranks of a step's recompute.
    ``outcome``: ``StepRecompute.check``'s; ``differing``: rank -> which of its own results
    differ between the attempts (every rank, in order; [] where none); ``hosts``: every
    rank's host; ``still_suspect``: the recomputed result is rejected as well."""
    finding, first, second = outcome["finding"], outcome["first"], outcome["second"]
    what = _finding_phrase(finding, first)
    ranks = [rank for rank in sorted(differing) if differing[rank]]
    every = len(ranks) == len(differing) > 1
    recomputed = f"loss {_g(second['loss'])}, gradient norm {_g(second['grad_norm'])}"
    action = ("the recomputed step is rejected as well: the spike is handled as before"
              if still_suspect else "going on with the recomputed step (no rollback)")
    record = {"kind": "suspect_hardware", "step": step, "reason": finding.reason,
              "value": finding.value, "first": first, "recomputed": second,
              "recurred": outcome["recurred"], "ranks": [], "hosts": [],
              "differs": {}, "action": "rollback" if still_suspect else "recomputed step"}
    if outcome["recurred"] and not ranks:
        record.update(kind="recompute", outcome="recurred", action="rollback")
        return (f"step {step}: {what} recurred on recompute, bitwise: the data, not the "
                "hardware", record, [])
    happened = ("recurred on recompute" if outcome["recurred"]
                else f"did not recur on recompute ({recomputed})")
    if every:
        record.update(kind="recompute", outcome="not reproducible")
        return (f"step {step}: {what} {happened}, and every rank's own results differ "
                "between the two attempts: the step is not reproducible (nondeterministic "
                f"kernels, or a fault every rank shares); no rank named; {action}",
                record, [])
    if not ranks:
        return (f"step {step}: {what} {happened}, yet no rank's own results differ: the "
                "difference arose past them (in a reduction across ranks or, on the FSDP2 "
                "engine, in a backward, which it reduces inside): suspect hardware, no rank "
                f"named; {action}", record, [])
    record.update(ranks=ranks, hosts=[hosts[rank] for rank in ranks],
                  differs={str(rank): differing[rank] for rank in ranks})
    return (f"step {step}: {what} {happened}: {_ranks_phrase(ranks, hosts, differing)}: "
            f"suspect hardware (RUN/{SUSPECT_HOSTS_FILE}); {action}", record, ranks)


def fingerprint_report(step: int, mismatches: list[Mismatch],
                       hosts: list[str]) -> tuple[str, dict, list[int]]:
    """The console line, the metrics record and the ranks to suspect (those outside a
    majority) of a fingerprint comparison that found ``mismatches``."""
    parts, suspects, groups = [], [], []
    for m in mismatches:
        named = _and([f"rank {rank} (host {hosts[rank]})" for rank in m.ranks])
        where = f"pp {m.pp}, tp {m.tp}; first differing tensor {m.tensor}"
        if m.majority:
            suspects += m.ranks
            parts.append(f"{named} {'holds' if len(m.ranks) == 1 else 'hold'} parameters "
                         f"different from the other {m.replicas - len(m.ranks)} of "
                         f"{m.replicas} data-parallel replicas ({where}): suspect hardware")
        else:
            parts.append(f"the {m.replicas} data-parallel replicas {named} hold different "
                         f"parameters ({where}), and no majority says which is wrong")
        groups.append({"pp": m.pp, "tp": m.tp, "ranks": m.ranks,
                       "hosts": [hosts[rank] for rank in m.ranks], "majority": m.majority,
                       "replicas": m.replicas, "tensor": m.tensor})
    record = {"kind": "fingerprint_mismatch", "step": step, "groups": groups,
              "ranks": sorted({rank for m in mismatches for rank in m.ranks}),
              "suspects": sorted(suspects)}
    tail = f"; suspects in RUN/{SUSPECT_HOSTS_FILE}" if suspects else ""
    return (f"step {step}: parameter fingerprints differ: {'; '.join(parts)}{tail}; the run "
            "goes on (resuming from a checkpoint makes the replicas alike again)", record,
            sorted(suspects))


class SilentErrors:
    """One rank's checks for silent data corruption. ``detector``: the run guard's
    ``SpikeDetector``; ``named_parameters``: this rank's ``(name, parameter)`` pairs;
    ``replicated``: whether the dp replicas hold them alike
    (``parallel.zero_engine.replicates_parameters``); ``layout``: the run's (its pp and tp
    ranks); ``loss_scaled``: fp16 (an overflow is the scaler's, not a suspect step);
    ``write``: the metrics sink; ``log``: rank 0's console."""

    def __init__(self, cfg, run_dir: str | Path, detector, layout, named_parameters: list,
                 replicated: bool, loss_scaled: bool, device, write, log,
                 is_main: bool) -> None:
        self.spike_enabled = cfg.spike.enabled
        self.interval = cfg.monitor.fingerprint_interval
        self.detector, self.loss_scaled = detector, loss_scaled
        self.run_dir, self.write, self.log, self.is_main = Path(run_dir), write, log, is_main
        self.named = named_parameters
        self.fingerprints = ReplicaFingerprints(named_parameters if replicated else None,
                                                layout.pp_rank, layout.tp_rank, device)
        self.step = 0  # the step being computed (the bitflip@grad fault's condition)

    def suspect(self, loss: float, grad_norm: float) -> SpikeFinding | None:
        """Why the step with this (global) loss and gradient norm is to be recomputed: the
        detector's finding, under the run guard's rules (a finite spike only with
        ``spike.enabled``); never an fp16 overflow (a finite loss, a non-finite norm: the
        scaler backs off). None: it is not."""
        finding = self.detector.check(loss, grad_norm)
        if finding is None:
            return None
        if finding.reason != "non-finite" and not self.spike_enabled:
            return None
        if finding.reason == "non-finite" and self.loss_scaled and math.isfinite(loss):
            return None
        return finding

    def begin(self, step: int) -> None:
        self.step = step

    def end(self, step: int, result: dict) -> None:
        """After the step (every rank, collective when there is something to name): report
        its recompute, carry out the ``bitflip@param`` fault, compare the fingerprints at
        their interval. Takes ``recompute`` out of ``result``."""
        outcome = result.pop("recompute", None)
        if outcome is not None:
            self._recomputed(step, outcome)
        bit = bitflip_due("param", step)
        if bit is not None:
            tensors = self.fingerprints.tensors() or [p for _, p in self.named]
            flip_bit(tensors[0], bit, high_exponent=False)
        if self.interval and step % self.interval == 0 and self.fingerprints.enabled:
            self._compare_fingerprints(step)

    def _recomputed(self, step: int, outcome: dict) -> None:
        gathered = gather_from_ranks((outcome["differs"], host_name()))
        differing = {rank: row[0] for rank, row in enumerate(gathered)}
        hosts = [row[1] for row in gathered]
        second = outcome["second"]
        still = self.suspect(second["loss"], second["grad_norm"]) is not None
        line, record, ranks = recompute_report(step, outcome, differing, hosts, still)
        self._publish(line, record, [hosts[rank] for rank in ranks])

    def _compare_fingerprints(self, step: int) -> None:
        mismatches, hosts = self.fingerprints.compare()
        if mismatches:
            line, record, ranks = fingerprint_report(step, mismatches, hosts)
            self._publish(line, record, [hosts[rank] for rank in ranks])

    def _publish(self, line: str, record: dict, suspect_hosts: list[str]) -> None:
        if self.is_main and suspect_hosts:
            add_suspect_hosts(self.run_dir, suspect_hosts)
        self.write(record)
        self.log(line)
