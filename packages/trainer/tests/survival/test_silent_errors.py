"""Silent data corruption, named: a step the spike detector rejects is computed again on the
same samples before the optimizer steps (a transient fault does not recur: the rank whose own
results differ is named and the run goes on with the recomputed step; a data spike recurs and
is rolled back as before, see test_spike_rollback.py), and the data-parallel replicas compare
parameter digests every ``monitor.fingerprint_interval`` steps. The faults are ``bitflip@grad``
and ``bitflip@param`` (``survival/bit_flips.py``). Plus the pure parts on their own.
"""

from __future__ import annotations

import json
import math
import os
import socket
from pathlib import Path

import pytest
import torch
from trainer_fixtures import tiny_config, write_corpus

from bloomline.trainer.config import Config
from bloomline.trainer.loop import Trainer
from bloomline.trainer.parallel.local_processes import run_distributed
from bloomline.trainer.parallel.zero_engine import replicates_parameters
from bloomline.trainer.survival.bit_digest import bits_sum, digest_of
from bloomline.trainer.survival.bit_flips import flip_bit
from bloomline.trainer.survival.fingerprints import Mismatch, odd_replicas
from bloomline.trainer.survival.silent_errors import (
    SilentErrors,
    fingerprint_report,
    recompute_report,
)
from bloomline.trainer.survival.spikes import SpikeDetector, SpikeFinding
from bloomline.trainer.survival.suspect_hosts import add_suspect_hosts, read_suspect_hosts

GRAD_STEP, PARAM_STEP, INTERVAL = 4, 10, 5
FAULTS = f"bitflip@grad:step={GRAD_STEP}:rank=1;bitflip@param:step={PARAM_STEP}:rank=1"


def _settings() -> dict:
    # ZeRO-1 in fp32 at dp2: the buffers engine, whose buckets are read before each reduction;
    # checkpoints every 3 steps, so that a step the recompute failed to clear would roll back
    return {"train": {"train_samples": 48, "log_interval": 1},
            "checkpoint": {"interval": 3, "keep_last": 10},
            "monitor": {"fingerprint_interval": INTERVAL},
            "parallel": {"data_parallel": 2, "zero_stage": 1}}


def _records(run_dir: Path, kind: str) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["kind"] == kind]


def _faulty_and_clean(corpus: str, root: str) -> list[str]:
    """On each rank: run A with both bit flips, run B without; rank 0's console lines of A."""
    root = Path(root)
    lines: list[str] = []
    os.environ["BLOOMLINE_FAULTS"] = FAULTS
    try:
        Trainer(tiny_config(corpus, root / "a", **_settings()), log=lines.append).run()
    finally:
        del os.environ["BLOOMLINE_FAULTS"]
    Trainer(tiny_config(corpus, root / "b", **_settings()), log=lambda *_: None).run()
    return lines


@pytest.mark.slow
def test_bit_flips_are_named_and_a_transient_one_leaves_the_run_unchanged(tmp_path):
    """Bug: a transient gradient fault rolled back (or skipped) like bad data, the wrong rank
    named (the reduction mixes every rank's gradient: only the rank's own, pre-reduction
    results tell), a recompute that starts from dirty gradient buckets or moved random state
    (its result, and the run after it, would differ from a run without the fault), or a
    replica whose parameters were corrupted going unnoticed by the fingerprints. dp2 on the
    buffers engine: rank 1's gradient flipped at step 4 (first attempt only) must be named
    alone, with no rollback, and the losses must equal the fault-free run's bitwise up to the
    parameter flip; rank 1's parameter flipped after step 10 must be caught by the
    fingerprint of step 10 (the buffers engine gathers its parameters anew at each step, so
    the flip lives until step 11) naming both replicas, and not by step 5's."""
    corpus = write_corpus(tmp_path / "corpus")
    lines = run_distributed(2, _faulty_and_clean, corpus, str(tmp_path))[0]
    a, b = tmp_path / "a", tmp_path / "b"
    host = socket.gethostname()
    [suspect] = _records(a, "suspect_hardware")
    assert suspect["step"] == GRAD_STEP and suspect["reason"] == "non-finite"
    assert suspect["ranks"] == [1] and suspect["hosts"] == [host]
    assert suspect["differs"] == {"1": ["gradient"]} and suspect["action"] == "recomputed step"
    assert not math.isfinite(suspect["first"]["grad_norm"])
    assert suspect["recomputed"]["grad_norm"] < 10 and not suspect["recurred"]
    assert not _records(a, "rollback") and not _records(a, "recompute")
    [line] = [line for line in lines if "suspect hardware" in line]
    assert line.startswith(f"step {GRAD_STEP}: the non-finite loss or gradient norm ") and (
        f"did not recur on recompute (loss {suspect['recomputed']['loss']:.4g}, gradient norm "
        ) in line and (f": rank 1 (host {host}) computed a different gradient: suspect "
                       "hardware (RUN/suspect_hosts.txt); going on with the recomputed step "
                       "(no rollback)") in line, line
    assert read_suspect_hosts(a) == [host]
    losses_a = {r["step"]: r["loss"] for r in _records(a, "train")}
    losses_b = {r["step"]: r["loss"] for r in _records(b, "train")}
    assert sorted(losses_a) == sorted(losses_b) == list(range(1, 13))
    # bitwise: fp32 on CPU, the same kernels in the same order; step 11 computes with the
    # flipped parameter on rank 1
    assert [losses_a[s] for s in range(1, PARAM_STEP + 1)] == [
        losses_b[s] for s in range(1, PARAM_STEP + 1)]
    [mismatch] = _records(a, "fingerprint_mismatch")
    assert mismatch["step"] == PARAM_STEP and mismatch["ranks"] == [0, 1]
    [group] = mismatch["groups"]
    assert group["majority"] is False and group["replicas"] == 2 and group["tensor"]
    assert mismatch["suspects"] == []  # two replicas: no majority says which one is wrong
    [line] = [line for line in lines if "fingerprints differ" in line]
    assert line.startswith(f"step {PARAM_STEP}: parameter fingerprints differ: the 2 "
                           f"data-parallel replicas rank 0 (host {host}) and rank 1 (host "
                           f"{host}) hold different parameters (pp 0, tp 0; first differing "
                           f"tensor {group['tensor']}), and no majority says which is "
                           "wrong"), line
    assert not _records(b, "suspect_hardware") and not _records(b, "fingerprint_mismatch")


# -- the step's recompute in one process ------------------------------------------------------
class _Judge:
    """A stand-in for SilentErrors: every step suspect (or none)."""

    def __init__(self, suspect: bool) -> None:
        self.step, self.verdict = 1, suspect

    def suspect(self, loss, grad_norm):
        return SpikeFinding("loss spike", loss, 1.0, 2.0) if self.verdict else None


def test_recompute_runs_only_on_a_suspect_step_and_reproduces_it_bitwise(corpus, tmp_path):
    """Bug: a normal step computed twice (the cost of the recompute paid on every step), or a
    recompute that starts from the first attempt's gradients or random state (with dropout:
    its result would differ, and every data spike would be blamed on the hardware)."""
    from bloomline.trainer.step.recompute import StepRecompute

    cfg = tiny_config(corpus, tmp_path / "run", model={"hidden_dropout": 0.1})
    trainer = Trainer(cfg, log=lambda *_: None)
    runner, calls = trainer.runner, []
    forward_backward = runner.forward_backward
    runner.forward_backward = lambda *a, **k: calls.append(1) or forward_backward(*a, **k)
    batch = [torch.randint(0, 90, (2, 33)) for _ in range(2)]
    runner.recompute = StepRecompute(runner, _Judge(suspect=False))
    plain = trainer.train_step(batch, 1e-3)
    assert len(calls) == 1 and "recompute" not in plain
    runner.recompute = StepRecompute(runner, _Judge(suspect=True))
    checked = trainer.train_step(batch, 1e-3)
    assert len(calls) == 3
    outcome = checked["recompute"]
    assert outcome["recurred"] and outcome["differs"] == [], outcome
    assert outcome["first"] == outcome["second"] == {"loss": checked["loss"],
                                                     "grad_norm": checked["grad_norm"]}


# -- the pure parts ---------------------------------------------------------------------------
def test_bit_digest_sees_any_single_flip_and_not_the_order():
    """Bug: a digest that misses a flipped bit (a low mantissa bit, the sign) or depends on
    how the device sums (two ranks, or two attempts, disagreeing on equal bits)."""
    x = torch.randn(1000)
    base = int(bits_sum(x))
    # integer sums: no rounding, so any grouping of the reduction gives the same digest
    assert int(digest_of(x.split(250))) == base == int(bits_sum(x.clone()))
    for bit in (0, 22, 30, 31):
        y = x.clone()
        flip_bit(y, bit, high_exponent=False)
        assert int(bits_sum(y)) != base, bit
        assert int((y != x).sum()) == 1, bit
    half = x.to(torch.bfloat16)
    flipped = half.clone()
    flip_bit(flipped, -1, high_exponent=True)  # the exponent's top bit: a huge value
    assert flipped.abs().max() > 1e30 and int(bits_sum(flipped)) != int(bits_sum(half))
    assert int(digest_of([x, half])) == base + int(bits_sum(half))
    assert int(digest_of([])) == 0


def test_odd_replicas_by_majority_or_all_without_one():
    """Bug: a majority's rank named instead of the odd one, or one of two differing replicas
    named as if the comparison could tell which is wrong."""
    assert odd_replicas({0: 5, 1: 5, 2: 5}) == ([], True)
    assert odd_replicas({0: 5, 1: 7, 2: 5}) == ([1], True)
    assert odd_replicas({0: 5, 1: 7}) == ([0, 1], False)
    assert odd_replicas({0: 1, 1: 2, 2: 3, 3: 3}) == ([0, 1, 2, 3], False)
    assert odd_replicas({4: 1, 6: 2, 8: 2, 10: 2, 12: 9}) == ([4, 12], True)


def _outcome(recurred: bool, reason: str = "loss spike") -> dict:
    finding = SpikeFinding(reason, 9.1, 3.2, 3.84)
    return {"finding": finding, "first": {"loss": 9.1, "grad_norm": 1.5},
            "second": {"loss": 3.21, "grad_norm": 1.4} if not recurred
            else {"loss": 9.1, "grad_norm": 1.5}, "recurred": recurred, "differs": []}


def test_recompute_report_blames_data_ranks_or_nobody():
    """Bug: a recurring spike reported as hardware (or the rollback skipped), a rank named
    when every rank differs (a nondeterministic step, not a faulty rank), or a changed result
    with no differing rank reported as the data's."""
    hosts = ["node-a", "node-b", "node-c"]
    none = {0: [], 1: [], 2: []}
    line, record, ranks = recompute_report(57, _outcome(True), none, hosts, True)
    assert line == ("step 57: the loss spike (9.1 against a baseline of 3.2) recurred on "
                    "recompute, bitwise: the data, not the hardware")
    assert record["kind"] == "recompute" and record["outcome"] == "recurred" and ranks == []
    line, record, ranks = recompute_report(57, _outcome(False), {**none, 1: ["loss"]}, hosts,
                                           False)
    assert line == ("step 57: the loss spike (9.1 against a baseline of 3.2) did not recur on "
                    "recompute (loss 3.21, gradient norm 1.4): rank 1 (host node-b) computed "
                    "a different loss: suspect hardware (RUN/suspect_hosts.txt); going on "
                    "with the recomputed step (no rollback)")
    assert record["kind"] == "suspect_hardware" and record["ranks"] == [1] == ranks
    assert record["hosts"] == ["node-b"] and record["differs"] == {"1": ["loss"]}
    every = {rank: ["gradient"] for rank in range(3)}
    line, record, ranks = recompute_report(5, _outcome(False), every, hosts, False)
    assert "not reproducible" in line and ranks == [] and record["kind"] == "recompute"
    line, record, ranks = recompute_report(5, _outcome(False), none, hosts, True)
    assert "no rank's own results differ" in line and record["kind"] == "suspect_hardware"
    assert ranks == [] and line.endswith("the spike is handled as before")
    # one process: its differing result is the only rank's
    _, record, ranks = recompute_report(5, _outcome(False), {0: ["gradient"]}, ["h"], False)
    assert ranks == [0] and record["kind"] == "suspect_hardware"


def test_fingerprint_report_names_the_minority_as_suspects():
    """Bug: a two-replica mismatch writing a host to suspect_hosts.txt (half the time the
    healthy one), or a majority's minority left out of the suspects."""
    hosts = ["a", "b", "c", "d"]
    line, record, suspects = fingerprint_report(
        100, [Mismatch(0, 1, [3], True, 3, "h.0.mlp.dense_4h_to_h.weight")], hosts)
    assert suspects == [3] and record["suspects"] == [3] and record["ranks"] == [3]
    assert line == ("step 100: parameter fingerprints differ: rank 3 (host d) holds "
                    "parameters different from the other 2 of 3 data-parallel replicas (pp 0, "
                    "tp 1; first differing tensor h.0.mlp.dense_4h_to_h.weight): suspect "
                    "hardware; suspects in RUN/suspect_hosts.txt; the run goes on (resuming "
                    "from a checkpoint makes the replicas alike again)")
    _, record, suspects = fingerprint_report(7, [Mismatch(0, 0, [0, 2], False, 2, "w")], hosts)
    assert suspects == [] and record["ranks"] == [0, 2]


def test_suspect_hosts_file_lists_each_host_once(tmp_path):
    """Bug: a host listed twice (srun --exclude takes the list as it is) or an earlier
    suspect lost when another is added."""
    add_suspect_hosts(tmp_path, ["node-b", "node-b"])
    add_suspect_hosts(tmp_path, ["node-c", "node-b"])
    assert (tmp_path / "suspect_hosts.txt").read_text() == "node-b\nnode-c\n"
    assert read_suspect_hosts(tmp_path / "elsewhere") == []


def test_suspect_steps_follow_the_run_guards_rules(tmp_path):
    """Bug: an fp16 overflow (the scaler's business, every few hundred steps) recomputed, or
    a finite spike recomputed when spike detection is off."""
    cfg = Config()
    detector = SpikeDetector(window=10, min_history=3, zscore=6.0, loss_rise=0.2,
                             grad_norm_factor=10.0)
    for _ in range(5):
        detector.record(3.0, 1.0)

    class _Layout:
        pp_rank = tp_rank = 0

    def silent(loss_scaled: bool, enabled: bool = True) -> SilentErrors:
        cfg.spike.enabled = enabled
        return SilentErrors(cfg, tmp_path, detector, _Layout(), [], False, loss_scaled,
                            torch.device("cpu"), lambda record: None, print, True)

    assert silent(False).suspect(3.0, 1.0) is None
    assert silent(False).suspect(9.0, 1.0).reason == "loss spike"
    assert silent(False).suspect(3.0, math.inf).reason == "non-finite"
    assert silent(True).suspect(3.0, math.inf) is None  # fp16 overflow
    assert silent(True).suspect(math.nan, 1.0).reason == "non-finite"
    assert silent(False, enabled=False).suspect(9.0, 1.0) is None
    assert silent(False, enabled=False).suspect(math.nan, 1.0).reason == "non-finite"


def test_replicated_parameters_by_engine():
    """Bug: fingerprints compared under ZeRO-2/3 on FSDP2 (each replica holds another shard:
    every comparison a false alarm), or skipped where the replicas do hold the same tensors."""
    cfg = Config()
    cfg.precision.dtype = "bf16"
    assert not replicates_parameters(cfg, 1)
    for stage, engine, expected in [(0, "auto", True), (1, "auto", True), (2, "auto", True),
                                    (3, "auto", False), (2, "fsdp2", False),
                                    (1, "fsdp2", True)]:
        cfg.parallel.zero_stage, cfg.parallel.zero_engine = stage, engine
        assert replicates_parameters(cfg, 4) is expected, (stage, engine)


def _decide_on_rank_one_only() -> tuple[int, str]:
    """One rank of ``test_a_rank_alone_suspect_makes_every_rank_recompute``: the judge finds
    the step suspect on rank 1 only (its copy of a replicated gradient damaged)."""
    from types import SimpleNamespace

    import torch.distributed as dist

    from bloomline.trainer.step.recompute import StepRecompute
    from bloomline.trainer.survival.spikes import SpikeFinding

    dist.init_process_group("gloo")  # run_distributed set the rendezvous in the environment
    rank = dist.get_rank()
    finding = SpikeFinding("non-finite", float("inf"), float("nan"), float("nan"))
    judge = SimpleNamespace(step=1, suspect=lambda *_: finding if rank == 1 else None)
    runner = SimpleNamespace(distributed=None, dp_group=object(), device=torch.device("cpu"),
                             local_loss=torch.tensor(2.0), drop_gradients=lambda: None,
                             model=torch.nn.Linear(1, 1))
    recompute = StepRecompute(runner, judge)
    recompute.begin()
    calls = []

    def again():
        calls.append(1)
        dist.barrier()  # the recompute's collectives: every rank must be here
        return torch.tensor(2.0), None, torch.tensor(1.0)

    _, outcome = recompute.check(torch.tensor(2.0), torch.tensor(1.0), again)
    return len(calls), outcome["finding"].reason


@pytest.mark.slow
def test_a_rank_alone_suspect_makes_every_rank_recompute():
    """Bug: the ranks decide to recompute each on its own values; a gradient norm computed
    from each rank's copy of replicated gradients differs on the rank whose copy was damaged
    after the reduction, and that rank would recompute (running collectives) while the others
    step: a hang. The decision must be every rank's: rank 1 alone finds the step suspect,
    both recompute."""
    from bloomline.trainer.parallel.local_processes import run_distributed

    results = run_distributed(2, _decide_on_rank_one_only, timeout=120)
    assert results == [(1, "suspect on another rank"), (1, "non-finite")]
