"""``make gpu-check``: the checks a CPU cannot run, on a machine with NVIDIA GPUs.

``python -m benchmarks.gpu_check [--only a,b] [--skip c] [--quick]``. The checks live in
``benchmarks/gpu_checks/`` (one module each); ``measure`` runs them and returns their rows,
``report`` prints the table. What each check does and its tolerance: benchmarks/README.md.

Exit status: 0 every check that ran passed (skips allowed), 1 one failed (or a usage error),
2 no usable CUDA GPU: one line on stderr, nothing run.
"""

from __future__ import annotations

import argparse
import sys
import traceback

from benchmarks.gpu_checks.cuda_probe import why_no_gpu
from benchmarks.gpu_checks.results import FAIL, Row, exit_code, format_table

CHECKS = {"a": "flex vs eager ALiBi attention", "b": "one bf16 run of 350m",
          "c": "nccl dp2/tp2 vs one GPU", "d": "gpu_throughput.sh beside trainer plan"}


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
        prog="python -m benchmarks.gpu_check",
        description="The GPU checks: " + "; ".join(f"{k}: {v}" for k, v in CHECKS.items()),
        epilog="exit 0: all passed; 1: a check failed; 2: no usable CUDA GPU")
    parser.add_argument("--only", type=_letters, default=set(CHECKS),
                        help="comma-separated checks to run (default: all)")
    parser.add_argument("--skip", type=_letters, default=set(), help="checks not to run")
    parser.add_argument("--quick", action="store_true",
                        help="check a at L 256 only (for a short d, set STEPS)")
    return parser.parse_args(argv)


def _run_check(letter: str, args: argparse.Namespace, gpu: str, note: str,
               gpus: int) -> list[Row]:
    # imported here: the no-GPU path must not pay for (or fail in) the checks' imports
    if letter == "a":
        from benchmarks.gpu_checks.attention_check import check_flex_attention
        return check_flex_attention("cuda", (256,) if args.quick else (256, 1024))
    if letter == "b":
        from benchmarks.gpu_checks.step_check import check_one_step
        return [check_one_step()]
    if letter == "c":
        from benchmarks.gpu_checks.equivalence_check import check_layouts
        return check_layouts(gpus)
    from benchmarks.gpu_checks.throughput_check import check_throughput
    return check_throughput(gpu, note)


def measure(args: argparse.Namespace) -> dict:
    """Run the chosen checks on this machine's GPUs (CUDA must be there: ``main`` asks
    first); ``{"header": line, "rows": [Row, ...]}``. Progress goes to stdout; a check that
    raises becomes a failed row and the others still run."""
    import torch

    from benchmarks.gpu_checks.plan_device import plan_device
    from benchmarks.harness.machine import git_commit

    gpus = torch.cuda.device_count()
    props = torch.cuda.get_device_properties(0)
    gpu, note = plan_device(props.name, props.total_memory)
    header = (f"# gpu_check at {git_commit()}: {gpus} x {props.name} "
              f"({props.total_memory / 2**30:.0f} GiB; plan device {gpu}), "
              f"torch {torch.__version__}, CUDA {torch.version.cuda}")
    print(header, flush=True)
    rows: list[Row] = []
    for letter in CHECKS:
        if letter not in args.only or letter in args.skip:
            continue
        print(f"== {letter}: {CHECKS[letter]}", flush=True)
        try:
            new = _run_check(letter, args, gpu, note, gpus)
        except Exception as error:  # one broken check must not hide the others' results
            traceback.print_exc()
            new = [Row(CHECKS[letter], FAIL, detail=f"{type(error).__name__}: {error}")]
        for row in new:
            print(f"   {row.name}: {row.status} {row.figures} {row.detail}".rstrip(), flush=True)
        rows.extend(new)
    return {"header": header, "rows": rows}


def report(result: dict) -> int:
    """Print the table of ``measure``'s rows; the exit status they give."""
    print()
    print(result["header"])
    print("\n".join(format_table(result["rows"])))
    return exit_code(result["rows"])


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    why = why_no_gpu()
    if why:
        print(f"gpu_check: no usable CUDA GPU: {why}; no check was run", file=sys.stderr)
        return 2
    return report(measure(args))


if __name__ == "__main__":
    sys.exit(main())
