"""The GPU check: what a CPU cannot check, in one command on a machine with NVIDIA GPUs.

``python3 -m benchmarks.gpu_check [--only a,b] [--skip c] [--quick] [--results PREFIX]``, run
from the repository root with the machine's own Python (the one whose torch has CUDA). Offline:
what that Python lacks of bloomline and its dependencies is installed from ``wheelhouse/``
(``make wheelhouse`` on a machine with network) with ``--no-index``
(``gpu_checks/environment.py``). The checks live in ``benchmarks/gpu_checks/`` (one module
each); ``measure`` runs them and returns their rows and times, ``report`` prints the table,
and the results go to ``PREFIX.md`` and ``PREFIX.json`` (default
``build/gpu_check/DATE-DEVICE``), to be committed under ``docs/perf/``. What each check does
and its tolerance: benchmarks/README.md.

Sized for one GPU: a and b run on one (each within its budget, :data:`CHECKS`), c and d need
two or more and say so. ``--cpu-dry-run`` runs every check's plumbing on the CPU (gloo, the
eager kernel, tiny shapes): what CI runs, and a way to try an installation without a GPU.
``--setup-only`` prepares the environment and stops.

Exit status: 0 every check that ran passed (skips allowed); 1 one failed (or a usage error);
2 no usable CUDA GPU: one line on stderr, nothing installed or run; 3 this Python cannot run
the checks (older than 3.11, no torch, a dependency missing and not in the wheelhouse): one
line on stderr naming it and the command that provides it.
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

from benchmarks.gpu_checks.environment import WHEELHOUSE, interpreter_problem, prepare
from benchmarks.gpu_checks.results import (
    FAIL,
    SKIPPED,
    Row,
    exit_code,
    format_table,
    write_results,
)

NO_GPU, NOT_READY = 2, 3
REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Check:
    """What a check is, the GPUs it needs, and the seconds it may take (None: no bound)."""

    what: str
    min_gpus: int
    budget_s: float | None


CHECKS = {
    "a": Check("flex vs eager ALiBi attention", 1, 150),
    "b": Check("a bf16 run of 350m beside trainer plan", 1, 270),
    "c": Check("nccl dp2/tp2 vs one GPU", 2, None),
    "d": Check("gpu_throughput.sh beside trainer plan", 2, None),
}
# the probe, the offline installation and the demo corpus (about 10 s of dataprep); with a and
# b's budgets, what one GPU may take in all: within 8 minutes
SETUP_BUDGET_S = 30
ONE_GPU_BUDGET_S = SETUP_BUDGET_S + sum(c.budget_s for c in CHECKS.values() if c.min_gpus == 1)
# --cpu-dry-run: check b on the tiny recipe at L 128 in fp32 (the plumbing, not the numbers)
DRY_RUN_B = ("train.device=cpu", "precision.dtype=fp32", "data.seq_length=128")
DRY_RUN_B_CONFIG = "configs/tiny-cpu.toml"
# --cpu-dry-run: gpu_throughput.sh on the tiny recipe, 2 gloo processes, 3 steps
DRY_RUN_D_ENV = {"DEVICE": "cpu", "NGPU": "2", "CONFIGS": "configs/tiny-cpu.toml",
                 "STEPS": "3", "WARMUP": "1", "LOG": "1"}


@dataclass(frozen=True)
class Target:
    """Where the checks run: ``device`` cuda (or cpu for a dry run), how many, the plan's
    device key for them and its caveat, and what the results file says of the machine."""

    device: str
    gpus: int
    plan_key: str
    note: str
    name: str
    machine: dict


class _Parser(argparse.ArgumentParser):
    """A usage error exits 1, not argparse's 2: status 2 means "no GPU" here."""

    def error(self, message: str):
        self.print_usage(sys.stderr)
        self.exit(1, f"{self.prog}: error: {message}\n")


def _letters(text: str) -> set[str]:
    letters = {part.strip() for part in text.split(",") if part.strip()}
    unknown = letters - set(CHECKS)
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown check {', '.join(sorted(unknown))}; "
                                         f"known: {', '.join(CHECKS)}")
    return letters


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = _Parser(
        prog="python3 -m benchmarks.gpu_check",
        description="The GPU checks: " + "; ".join(f"{k}: {c.what}" for k, c in CHECKS.items()),
        epilog="exit 0: all passed; 1: a check failed; 2: no usable CUDA GPU; 3: this Python "
               "lacks what the checks need")
    parser.add_argument("--only", type=_letters, default=set(CHECKS),
                        help="comma-separated checks to run (default: all)")
    parser.add_argument("--skip", type=_letters, default=set(), help="checks not to run")
    parser.add_argument("--quick", action="store_true",
                        help="check a at L 256 only (for a short d, set STEPS)")
    parser.add_argument("--wheelhouse", type=Path, default=WHEELHOUSE,
                        help="where missing packages come from (default: wheelhouse/)")
    parser.add_argument("--results", type=Path, default=None,
                        help="write PREFIX.md and PREFIX.json (default: "
                             "build/gpu_check/DATE-DEVICE)")
    parser.add_argument("--setup-only", action="store_true",
                        help="prepare this Python (offline) and stop")
    parser.add_argument("--cpu-dry-run", action="store_true",
                        help="every check's plumbing on the CPU, no GPU needed")
    return parser.parse_args(argv)


def _driver() -> str:
    import subprocess

    try:
        done = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=30)
        return done.stdout.strip().splitlines()[0] if done.returncode == 0 else "unknown"
    except (OSError, IndexError, subprocess.SubprocessError):
        return "unknown"


def find_target(cpu_dry_run: bool) -> Target:
    """This machine's GPUs as the checks see them (CUDA must be usable: ``main`` asks first),
    or the CPU stand-in of a dry run (two gloo processes, planned as H100s)."""
    import platform

    import torch

    from benchmarks.gpu_checks.plan_device import plan_device
    from benchmarks.harness.machine import cpu_model, git_commit

    machine = {"commit": git_commit(), "torch": torch.__version__,
               "CUDA": torch.version.cuda or "none", "Python": platform.python_version(),
               "CPU": f"{os.cpu_count()} x {cpu_model()}"}
    if cpu_dry_run:
        return Target("cpu", 2, "h100-80gb", "CPU dry run: planned as H100s", "CPU (dry run)",
                      {"GPU": "none (CPU dry run)", **machine})
    props = torch.cuda.get_device_properties(0)
    key, note = plan_device(props.name, props.total_memory)
    gpus = torch.cuda.device_count()
    return Target("cuda", gpus, key, note, props.name,
                  {"GPU": f"{gpus} x {props.name}, {props.total_memory / 2**30:.0f} GiB",
                   "driver": _driver(), "plan device": key, **machine})


def _run_check(letter: str, args: argparse.Namespace, target: Target) -> list[Row]:
    # imported here: the no-GPU path must not pay for (or fail in) the checks' imports
    dry = target.device == "cpu"
    budget = CHECKS[letter].budget_s
    if letter == "a":
        from benchmarks.gpu_checks.attention_check import check_flex_attention
        if dry:  # flex has no CPU backward; bf16 autocast on CPU is not what a GPU runs
            return check_flex_attention("cpu", (64,), cases=((8, 4, 4),), backward=False,
                                        bf16=False, batch=1, document_cases=())
        return check_flex_attention("cuda", (256,) if args.quick else (256, 1024),
                                    budget_s=budget)
    if letter == "b":
        from benchmarks.gpu_checks.step_check import check_one_gpu_run
        if dry:
            return check_one_gpu_run(target.plan_key, DRY_RUN_B_CONFIG, DRY_RUN_B, budget)
        return check_one_gpu_run(target.plan_key, budget_s=budget)
    if letter == "c":
        from benchmarks.gpu_checks.equivalence_check import check_layouts
        return check_layouts(target.gpus, ("train.device=cpu",) if dry else ())
    from benchmarks.gpu_checks.throughput_check import check_throughput
    return check_throughput(target.plan_key, target.note, env=DRY_RUN_D_ENV if dry else None)


def measure(args: argparse.Namespace, target: Target) -> dict:
    """Run the chosen checks on ``target``; ``{"header": line, "rows": [Row, ...], "timing":
    {letter: {"what", "seconds", "budget_s"}}}``. Progress goes to stdout; a check that raises
    becomes a failed row and the others still run; a check needing more GPUs than there are
    is a skipped row."""
    header = (f"# gpu_check at {target.machine['commit']}: {target.machine['GPU']} (plan "
              f"device {target.plan_key}), torch {target.machine['torch']}, CUDA "
              f"{target.machine['CUDA']}, Python {target.machine['Python']}")
    print(header, flush=True)
    rows: list[Row] = []
    timing: dict[str, dict] = {}
    for letter, check in CHECKS.items():
        if letter not in args.only or letter in args.skip:
            continue
        if target.gpus < check.min_gpus:
            rows.append(Row(check.what, SKIPPED,
                            detail=f"{target.gpus} GPU: needs {check.min_gpus} or more"))
            continue
        print(f"== {letter}: {check.what}", flush=True)
        began = time.monotonic()
        try:
            new = _run_check(letter, args, target)
        except Exception as error:  # one broken check must not hide the others' results
            traceback.print_exc()
            new = [Row(check.what, FAIL, detail=f"{type(error).__name__}: {error}")]
        timing[letter] = {"what": check.what, "seconds": time.monotonic() - began,
                          "budget_s": check.budget_s}
        for row in new:
            print(f"   {row.name}: {row.status} {row.figures} {row.detail}".rstrip(), flush=True)
        rows.extend(new)
    return {"header": header, "rows": rows, "timing": timing}


def report(result: dict) -> int:
    """Print the table of ``measure``'s rows; the exit status they give."""
    print()
    print(result["header"])
    print("\n".join(format_table(result["rows"])))
    return exit_code(result["rows"])


def _results_prefix(args: argparse.Namespace, target: Target, date: str) -> Path:
    if args.results is not None:
        return args.results
    device = "cpu-dry-run" if target.device == "cpu" else target.plan_key
    return REPO / "build" / "gpu_check" / f"{date}-{device}"


def main(argv: list[str] | None = None) -> int:
    began = time.monotonic()
    args = parse_args(argv)
    problem = interpreter_problem()
    if problem:
        print(f"gpu_check: {problem}", file=sys.stderr)
        return NOT_READY
    if not (args.setup_only or args.cpu_dry_run):
        from benchmarks.gpu_checks.cuda_probe import why_no_gpu

        why = why_no_gpu()
        if why:
            print(f"gpu_check: no usable CUDA GPU: {why}; no check was run", file=sys.stderr)
            return NO_GPU
    problem = prepare(args.wheelhouse)
    if problem:
        print(f"gpu_check: {problem}", file=sys.stderr)
        return NOT_READY
    if args.setup_only:
        print(f"gpu_check: {sys.executable} can run the checks (bloomline from this checkout, "
              f"every declared dependency installed)")
        return 0
    target = find_target(args.cpu_dry_run)
    result = measure(args, target)
    status = report(result)
    date = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d")
    paths = write_results(_results_prefix(args, target, date), {
        "date": date, "gpu": target.name, "gpus": target.gpus, "machine": target.machine,
        "command": " ".join(["python3 -m benchmarks.gpu_check", *(argv or sys.argv[1:])]),
        "exit_status": status, "total_s": time.monotonic() - began,
        "one_gpu_budget_s": ONE_GPU_BUDGET_S, "timing": result["timing"],
        "rows": result["rows"]})
    print(f"results: {', '.join(str(p) for p in paths)} (commit them under docs/perf/)")
    return status


if __name__ == "__main__":
    sys.exit(main())
