"""The parts of ``make gpu-check`` (``benchmarks/gpu_check.py`` and its checks in
``benchmarks/gpu_checks/``) that run without a GPU: the no-GPU exit, the comparisons every
check relies on, the device mapping, the judging of the 350m run, the result line of
``gpu_throughput.sh`` and the plan beside it, and FlexAttention's forward on CPU.

The GPU paths themselves (flex backward, bf16 on CUDA, NCCL, the throughput runs) can only run
on a machine with NVIDIA GPUs: ``make gpu-check`` there.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from benchmarks.gpu_checks.equivalence_check import check_layouts
from benchmarks.gpu_checks.plan_device import FALLBACK, plan_device
from benchmarks.gpu_checks.results import FAIL, PASS, SKIPPED, Row, exit_code, relative_error
from benchmarks.gpu_checks.trainer_runs import compare_losses, train_records
from bloomline.trainer.plan.devices import DEVICES

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_without_a_gpu_it_exits_2_with_one_line_and_runs_nothing():
    """Catches: a machine without CUDA getting a traceback, a table of failures or a silent
    exit 0 (a CI job would read "all passed"), or more than the one line that says why."""
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    done = subprocess.run([sys.executable, "-m", "benchmarks.gpu_check"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("gpu_check: no usable CUDA GPU: torch ")


@pytest.mark.slow
def test_a_usage_error_is_not_mistaken_for_no_gpu():
    """Catches: argparse's own exit status 2 for a bad option, which a caller would read as
    "no GPU here"."""
    done = subprocess.run([sys.executable, "-m", "benchmarks.gpu_check", "--only", "x"],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert "unknown check x" in done.stderr


def test_relative_error_passes_equal_tensors_and_fails_a_perturbed_one():
    """Catches: a comparison that cannot fail (a NaN that max() skips, an error taken
    relative to the perturbed tensor, broadcasting over mismatched shapes)."""
    torch.manual_seed(0)
    want = torch.randn(4, 32, 16)
    assert relative_error(want.clone(), want) == 0.0
    got = want.clone()
    got[1, 2, 3] += 1e-3 * want.abs().max()
    assert relative_error(got, want) == pytest.approx(1e-3, rel=1e-4)  # fp32 rounding
    assert relative_error(got, want) > 1e-4  # the fp32 tolerance of check a rejects it
    got[0, 0, 0] = float("nan")
    assert relative_error(got, want) == math.inf
    with pytest.raises(ValueError, match="shapes differ"):
        relative_error(want[:2], want)


def test_the_exit_status_fails_on_any_failure_but_not_on_a_skip():
    """Catches: a skipped check (one GPU, no dp2) turning the run red, or a failure hidden
    among passes."""
    assert exit_code([Row("a", PASS), Row("c", SKIPPED)]) == 0
    assert exit_code([Row("a", PASS), Row("b", FAIL), Row("c", SKIPPED)]) == 1


def test_one_gpu_skips_the_layouts_without_running_them():
    """Catches: dp2/tp2 launched on a single GPU (two ranks on one device) instead of the
    "skipped: 1 GPU" row."""
    rows = check_layouts(1)
    assert [row.status for row in rows] == [SKIPPED, SKIPPED]
    assert all("1 GPU" in row.detail for row in rows)


def test_checks_b_and_c_start_each_recipe_at_a_world_it_states(monkeypatch):
    """Catches: a check starting a recipe on another number of processes than its
    parallel.world_size without overriding it (b: 350m, a layout for 8 GPUs, on one; c:
    tiny-cpu, a layout for 1 process, under --nproc 2), which pretrain refuses: the check would
    fail on every GPU machine. Each start is held to the trainer's own rule
    (``config_rules.parallel_sizes``) for the processes it starts; the runs themselves are stubs."""
    from types import SimpleNamespace

    from benchmarks.gpu_checks import equivalence_check, step_check
    from bloomline.trainer.config import load_trainer_config
    from bloomline.trainer.config_rules import parallel_sizes

    started = []

    def pretrain(config, run_dir, overrides, nproc=0, timeout=None):
        cfg = load_trainer_config(REPO / config, overrides)
        started.append((Path(config).stem, nproc or 1, parallel_sizes(cfg, nproc or 1)))
        one_gpu_reference = nproc == 0 and "tiny" in config  # c compares its runs with it
        return SimpleNamespace(ok=one_gpu_reference, returncode=1, output_tail="stub",
                               records=[])

    for module in (step_check, equivalence_check):
        monkeypatch.setattr(module, "pretrain", pretrain)
        monkeypatch.setattr(module, "ensure_demo_corpus", lambda: [])
    monkeypatch.setattr(step_check, "start_plan", lambda *args: None)
    monkeypatch.setattr(step_check, "stop", lambda planning: None)
    step_check.check_one_gpu_run("h100-80gb")
    check_layouts(2)
    assert started == [("350m", 1, (1, 1, 1)), ("tiny-cpu", 1, (1, 1, 1)),
                       ("tiny-cpu", 2, (1, 2, 1)), ("tiny-cpu", 2, (1, 1, 2))]


@pytest.mark.parametrize("name, memory_gib, key", [
    ("NVIDIA H100 80GB HBM3", 80, "h100-80gb"),
    ("NVIDIA H100 PCIe", 80, "h100-80gb"),
    ("NVIDIA H200", 141, "h200"),
    ("NVIDIA A100-SXM4-80GB", 80, "a100-80gb"),
    ("NVIDIA A100-SXM4-40GB", 40, "a100-40gb"),
    ("NVIDIA A100-PCIE-40GB", 40, "a100-40gb"),
])
def test_gpu_names_map_to_the_plans_device_table(name, memory_gib, key):
    """Catches: an H200 planned as an H100 (or the reverse), an A100 40GB planned with 80 GB,
    or a key the planner's table does not have."""
    got, note = plan_device(name, memory_gib * 2**30)
    assert got == key and got in DEVICES
    assert ("PCIe" in name) == bool(note)


def test_an_unknown_gpu_is_planned_as_the_fallback_and_says_so():
    """Catches: a GPU outside the table planned silently as another one."""
    key, note = plan_device("NVIDIA L40S", 48 * 2**30)
    assert key == FALLBACK and key in DEVICES
    assert "L40S" in note and FALLBACK in note


def _metrics(path: Path, losses: dict[int, float]) -> Path:
    path.mkdir(parents=True)
    lines = [json.dumps({"kind": "train", "step": step, "loss": loss})
             for step, loss in losses.items()]
    lines.insert(1, json.dumps({"kind": "thermometer", "step": 1, "loss": 99.0}))
    (path / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    return path


def test_loss_comparison_of_two_metrics_files(tmp_path):
    """Catches: a layout comparison that cannot fail (records of other kinds compared, a
    missing step ignored by zip, an absolute instead of a relative tolerance, the gradient
    norm not compared) or that fails on roundoff."""
    reference = {1: 9.0123, 2: 8.5, 3: 7.9, 4: 7.25}
    one = train_records(_metrics(tmp_path / "one", reference))
    assert [r["step"] for r in one] == [1, 2, 3, 4]
    close = train_records(_metrics(tmp_path / "close",
                                   {s: x * (1 + 2e-5) for s, x in reference.items()}))
    result = compare_losses(close, one, 1e-4)
    assert result.problem is None and result.worst == pytest.approx(2e-5, rel=1e-3)
    off = train_records(_metrics(tmp_path / "off", {**reference, 3: 7.9 * 1.001}))
    result = compare_losses(off, one, 1e-4)
    assert result.worst_step == 3 and "step 3" in result.problem
    short = train_records(_metrics(tmp_path / "short", {1: 9.0123, 2: 8.5, 3: 7.9}))
    assert "steps differ" in compare_losses(short, one, 1e-4).problem
    nan = train_records(_metrics(tmp_path / "nan", {**reference, 2: float("nan")}))
    assert compare_losses(nan, one, 1e-4).problem is not None
    for record in off:
        record["grad_norm"] = 2.0 * record["loss"]  # gradients summed, not averaged
    for record in one:
        record["grad_norm"] = record["loss"]
    assert "grad_norm" in compare_losses(off, one, 1e-4, key="grad_norm").problem
    assert train_records(tmp_path / "missing") == []


def _steps(losses: list[float], memory: float = 7.9) -> list[dict]:
    return [{"kind": "train", "step": i + 1, "loss": loss, "step_time_s": 0.2 + i,
             "tokens_per_s": 1000.0 * (i + 1), "mfu": 0.01 * (i + 1), "memory_gb": memory,
             "seq_length": 2048, "global_batch_size": 8}
            for i, loss in enumerate(losses)]


@pytest.mark.parametrize("losses, memory, problem", [
    ([18.6, 9.9, 9.5], 7.9, ""),  # the recipe's untrained model: far above ln V, then falls
    ([2.1, 1.9, 1.8], 7.9, "below uniform"),  # labels leaking into the inputs
    ([18.6, 18.7, 18.9], 7.9, "did not fall"),  # no update reaches the weights
    ([18.6, float("nan"), 9.5], 7.9, "non-finite"),
    ([18.6, 9.9, 9.5], 0.0, "no peak memory"),
    ([18.6, 9.9], 7.9, "logged steps"),
])
def test_the_350m_run_is_judged_by_floor_fall_and_memory(losses, memory, problem):
    """Catches: check b passing a run whose labels leak (a loss below the uniform guess),
    whose loss never falls, is NaN, that logged no memory or stopped early; or failing the
    recipe's real start (an untrained tied-embedding model copies its input token, so its
    first loss lies far above ln V; benchmarks/README.md)."""
    from benchmarks.gpu_checks.step_check import judge

    row, _ = judge("b", _steps(losses, memory), 50304, steps=3, warmup=1)
    assert row.status == (FAIL if problem else PASS), row
    assert problem in row.detail
    assert "16,384 tokens/step" in row.figures


def test_the_350m_run_measures_after_the_warmup_and_sits_beside_the_plan():
    """Catches: check b's throughput taken over the compiling first steps (a median that
    includes them), the peak memory of one step instead of the run's, or the plan's traced
    peak read from another field than ``trainer plan --json`` writes (a ratio of unlike
    things)."""
    from benchmarks.gpu_checks.step_check import beside, judge

    records = _steps([18.6, 12.0, 11.0, 10.0, 9.5], 7.9)
    records[0]["step_time_s"], records[0]["memory_gb"] = 30.0, 9.0  # compiling, its peak
    _, measured = judge("b", records, 50304, steps=5, warmup=2)
    # steps 3..5: step times 2.2, 3.2, 4.2; tokens/s 3000, 4000, 5000; MFU 3, 4, 5 %
    assert measured == {"step_time_s": pytest.approx(3.2), "tokens_per_s": 4000.0,
                        "mfu": pytest.approx(0.04), "memory_gb": 9.0}
    plan = {"step_time_s": 1.6, "mfu": 0.5, "traced": True,
            "ranks": [{"memory_bytes": {"total": 18e9}}]}
    row = beside("plan", measured, plan, "h100-80gb")
    assert row.status == PASS
    assert "step time 2, memory 0.5" in row.figures and "18.0 GB (traced)" in row.figures


def _script_summary() -> str:
    """The Python summary that gpu_throughput.sh runs on each finished run (its heredoc)."""
    text = (REPO / "benchmarks" / "gpu_throughput.sh").read_text()
    return text.split("<<'EOF'\n", 1)[1].split("\nEOF\n", 1)[0]


@pytest.mark.slow
def test_throughput_result_line_and_the_plan_beside_it(tmp_path, monkeypatch):
    """Catches: gpu_throughput.sh's JSON line missing or renamed fields that check d reads,
    or check d asking ``trainer plan`` for another world size, batch or length than the run's
    (the ratio would compare different steps). A hand-made run folder of 350m on 8 GPUs."""
    from benchmarks.gpu_checks import throughput_check

    run = tmp_path / "350m.abcd"
    run.mkdir()
    records = [{"kind": "train", "step": s, "tokens_per_s": 4e5, "step_time_s": 1.31,
                "memory_gb": 30.0, "mfu": 0.4, "seq_length": 2048} for s in (2, 4, 6)]
    (run / "metrics.jsonl").write_text("\n".join(map(json.dumps, records)) + "\n")
    (run / "run_info.json").write_text(json.dumps({"parameters": 3.5e8, "layout": "dp8",
                                                   "peak_flops": 989e12}))
    (run / "config.toml").write_text((REPO / "configs" / "350m.toml").read_text())
    results = tmp_path / "results.jsonl"
    done = subprocess.run([sys.executable, "-", str(run), "8", "2", "configs/350m.toml", "256"],
                          input=_script_summary(), env=dict(os.environ, RESULTS=str(results)),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "400,000 tokens/s" in done.stdout  # the human line stays
    (line,) = results.read_text().splitlines()
    measured = json.loads(line)
    assert measured["windows"] == 2  # steps after WARMUP 2
    asked = []

    def plan(config, gpus, gpu, overrides):
        asked.append((config, gpus, gpu, overrides))
        return {"step_time_s": 1.0, "tokens_per_s": 5.2e5, "mfu": 0.5}

    monkeypatch.setattr(throughput_check, "plan_prediction", plan)
    row = throughput_check._row(measured, "h100-80gb", "", [])
    assert asked == [("configs/350m.toml", 8, "h100-80gb",
                      ["train.global_batch_size=256", "data.seq_length=2048"])]
    assert row.status == PASS and "measured/plan step time 1.31" in row.figures


@pytest.mark.compat
def test_flex_matches_eager_on_cpu_for_a_tensor_parallel_shard(monkeypatch):
    """Catches: check a failing to compare what it says (weights not shared, the shard's head
    offset lost) or unable to fail: flex's forward on CPU (the backward is GPU-only) for
    heads 4..7 of 8 passes, and with the shard's slopes recomputed for its own 4 heads (the
    tensor-parallel bug ALiBi invites) it fails."""
    from benchmarks.gpu_checks.attention_check import check_flex_attention
    from bloomline.trainer.model.alibi import AlibiPositions

    def run():
        return check_flex_attention("cpu", (64,), cases=((8, 4, 4),), backward=False,
                                    bf16=False, batch=1, document_cases=())

    (row,) = run()
    assert row.status == PASS, row
    local = AlibiPositions.score_mod

    def own_count(self, total, start, end, device):
        return local(self, end - start, 0, end - start, device)

    monkeypatch.setattr(AlibiPositions, "score_mod", own_count)
    (row,) = run()
    assert row.status == FAIL, row


@pytest.mark.compat
def test_flex_with_documents_matches_eager_on_cpu_and_can_fail(monkeypatch):
    """Catches: check a's packed-documents rows comparing what they do not say (the document
    ids not reaching one kernel, so both run plain causal attention and agree) or unable to
    fail: flex's per-sample BlockMask against eager's per-sample bias passes on CPU (forward),
    and with flex's mask reduced to the causal one it fails."""
    from benchmarks.gpu_checks import attention_check
    from bloomline.trainer.model import attention as attention_module

    def run():
        return attention_check.check_flex_attention(
            "cpu", (64,), cases=(), backward=False, bf16=False, batch=2)

    (row,) = run()
    assert row.status == PASS and row.name.startswith("flex-alibi-documents"), row
    ids = attention_check.document_ids(2, 64, "cpu")
    assert ids[0].max() == 3 and ids[1].max() == 1  # the layouts the check claims

    def causal_only(ids):
        return attention_module._causal_block_mask(ids.shape[1], str(ids.device))

    monkeypatch.setattr(attention_module, "document_block_mask", causal_only)
    (row,) = run()
    assert row.status == FAIL, row


def test_a_check_that_raises_fails_its_row_and_the_others_still_run(monkeypatch, capsys,
                                                                     tmp_path):
    """Catches: one check's exception (a compile error, a missing file) ending the whole run
    without the table, or hiding the other checks' rows; --only/--skip not honoured; a check
    that needs two GPUs run on one instead of skipped with the reason; a results file that
    loses a row or a check's time. The GPU and the checks are stand-ins: the driver only."""
    from benchmarks import gpu_check
    from benchmarks.gpu_checks.results import write_results

    target = gpu_check.Target("cuda", 1, "h100-80gb", "", "NVIDIA H100 80GB HBM3",
                              {"GPU": "1 x NVIDIA H100 80GB HBM3", "commit": "abc",
                               "torch": "2.11.0", "CUDA": "13.0", "Python": "3.12.3"})
    ran = []

    def fake(letter, args, target):
        ran.append((letter, target.plan_key, target.gpus))
        if letter == "b":
            raise RuntimeError("compile failed")
        return [Row(letter, PASS)]

    monkeypatch.setattr(gpu_check, "_run_check", fake)
    result = gpu_check.measure(gpu_check.parse_args(["--skip", "d"]), target)
    assert ran == [("a", "h100-80gb", 1), ("b", "h100-80gb", 1)]
    assert [row.status for row in result["rows"]] == [PASS, FAIL, SKIPPED]
    assert "compile failed" in result["rows"][1].detail
    assert "1 GPU: needs 2" in result["rows"][2].detail
    assert set(result["timing"]) == {"a", "b"}
    assert gpu_check.report(result) == 1
    assert "compile failed" in capsys.readouterr().out.splitlines()[-2]
    md, js = write_results(tmp_path / "r", {
        "date": "2026-11-26", "gpu": target.name, "gpus": 1, "machine": target.machine,
        "command": "python3 -m benchmarks.gpu_check", "exit_status": 1, "total_s": 12.0,
        "timing": result["timing"], "rows": result["rows"]})
    saved = json.loads(js.read_text())
    assert [row["status"] for row in saved["rows"]] == [PASS, FAIL, SKIPPED]
    text = md.read_text()
    assert "| b: a bf16 run of 350m beside trainer plan |" in text
    assert text.count("\n| ") >= 3 + 5 + 2 + 3  # machine, timing and row tables


def test_one_gpu_fits_the_eight_minutes():
    """Catches: a budget raised past what one GPU was promised (the check must end within
    8 minutes on one H100, compilation included: the budgets are how that is known)."""
    from benchmarks import gpu_check

    assert gpu_check.ONE_GPU_BUDGET_S <= 8 * 60
    assert all(c.budget_s is not None for c in gpu_check.CHECKS.values() if c.min_gpus == 1)


def test_check_a_skips_what_its_budget_leaves_no_time_for():
    """Catches: check a running its cases past its budget (each compiles afresh: minutes on a
    GPU) instead of reporting the ones it did not start as skipped rows."""
    from benchmarks.gpu_checks.attention_check import check_flex_attention

    rows = check_flex_attention("cpu", (32, 64), cases=((8, 4, 4), (8, 0, 8)), backward=False,
                                bf16=False, batch=1, budget_s=0.0, document_cases=())
    assert rows[0].status == PASS  # the first case always runs
    assert [row.status for row in rows[1:]] == [SKIPPED] * 3
    assert "budget" in rows[1].detail


@pytest.mark.slow
def test_a_budget_ends_a_run_whose_helpers_hold_its_output():
    """Catches: a check's budget that cannot end a run. Killing the trainer alone leaves its
    multiprocessing helpers (resource tracker, loader workers) holding the captured output
    open, and reading it waited for them: a 3 s budget hung for minutes. A stand-in trainer
    that starts such a helper and never finishes must come back as a timeout, helper gone."""
    from benchmarks.gpu_checks import trainer_runs

    child = ("import subprocess, sys, time; "
             "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']); "
             "print(p.pid, flush=True); time.sleep(600)")
    with pytest.raises(subprocess.TimeoutExpired) as caught:
        trainer_runs._run([sys.executable, "-c", child], timeout=2)
    output = caught.value.output or ""
    if output.strip():  # the helper's pid, when the child printed it before the kill
        assert _ends(int(output.split()[0]), within=10.0)


def _ends(pid: int, within: float) -> bool:
    """Whether process ``pid`` is gone, or a zombie nobody has reaped yet (its parent was
    killed with it), within ``within`` seconds: a SIGKILL sent to a process group takes effect
    when the kernel next schedules each member, which on a loaded machine is not at once."""
    import time

    stat = Path(f"/proc/{pid}/stat")
    deadline = time.monotonic() + within
    while True:
        try:
            if stat.read_text().rsplit(")", 1)[1].split()[0] == "Z":
                return True
        except FileNotFoundError:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
