"""``inspect-data summary`` and ``verify`` on a ~1B-token corpus, against a plain read.

Both commands must read the whole ``.bin`` once (the largest token id, the vocabulary check)
and the ``.idx`` (lengths, offsets, boundaries), so their physical limit is reading those
files: the baseline is a plain sequential read of both, ``cat``-like (``readinto`` a 64 MiB
buffer, nothing computed), measured in the same run. Each figure is taken

* cold(-ish): the two files' pages dropped from the page cache first
  (``posix_fadvise(DONTNEED)``; the hypervisor below this VM may still cache them, so this
  is the disk as the VM sees it), and
* warm: right after the files were read, so from the page cache (memory speed).

Measured: the read baseline; ``summarize()`` and ``verify_corpus(vocab_size=...)`` called
in-process; and the CLI (``inspect-data summary PREFIX --json``, ``inspect-data verify
PREFIX``) as subprocesses, which adds interpreter start-up and imports. GB/s is the
bytes of ``.bin`` + ``.idx`` over the seconds. ``--repeats`` rounds (default 3) run every
measurement in turn; seconds are medians over rounds, ratios the median of per-round ratios
(this machine's speed drifts from one minute to the next).

The corpus is ``benchmarks.build_index``'s ``single/all`` (1e9 uint16 tokens, 2e6 documents,
ids below 65000; ``harness.token_corpus``), generated if missing (with the blend parts).

Run: ``make bench-inspect`` or ``python -m benchmarks.inspect [--repeats N] [--cache-dir DIR]
[--json]``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from benchmarks.harness.machine import header_line, relative
from benchmarks.harness.paths import CACHE_DIR
from benchmarks.harness.token_corpus import (
    SINGLE,
    VOCAB,
    generate_token_corpus,
    token_corpus_root,
)
from bloomline.tools.summary import summarize
from bloomline.tools.verify import verify_corpus

__all__ = ["main", "measure", "report"]

READ_CHUNK = 64 << 20


def evict(paths: list[Path]) -> None:
    """Drop the files' pages from the page cache (only these files, no root needed)."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def plain_read(paths: list[Path]) -> int:
    """The baseline: every byte read once into one reused buffer, nothing computed."""
    buffer = bytearray(READ_CHUNK)
    total = 0
    for path in paths:
        with open(path, "rb", buffering=0) as fh:
            while count := fh.readinto(buffer):
                total += count
    return total


def cli(*args: str) -> None:
    script = Path(sys.executable).with_name("inspect-data")
    command = [str(script)] if script.exists() else [shutil.which("inspect-data") or
                                                     "inspect-data"]
    proc = subprocess.run(command + list(args), capture_output=True, text=True)
    if proc.returncode != 0:
        shown = " ".join(relative(a) if os.path.isabs(a) else a for a in args)
        raise SystemExit(f"inspect-data {shown} failed: {proc.stderr.strip()}")


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=float, default=1e9)
    parser.add_argument("--docs", type=float, default=2e6)
    parser.add_argument("--repeats", type=int, default=3,
                        help="rounds over all measurements; medians are reported")
    parser.add_argument("--cache-dir", type=Path, default=CACHE_DIR)
    parser.add_argument("--json", action="store_true", help="also print the results as JSON")
    return parser.parse_args(argv)


def _cases(prefix: Path, paths: list[Path]) -> dict:
    return {
        "plain read (limit)": lambda: plain_read(paths),
        "summary (in-process)": lambda: summarize(prefix),
        "verify (in-process)": lambda: verify_corpus(prefix, vocab_size=VOCAB),
        "summary (CLI)": lambda: cli("summary", str(prefix), "--json"),
        "verify (CLI)": lambda: cli("verify", str(prefix)),
    }


def measure(args: argparse.Namespace) -> dict:
    """``{"seconds": {"cold"|"warm": {case: [seconds per round]}}, "nbytes", "repeats",
    "json"}``; the corpus generated first when missing."""
    print(header_line(), flush=True)
    root = token_corpus_root(args.cache_dir, args.tokens, args.docs)
    prefix = root / "single" / SINGLE
    if not prefix.with_suffix(".idx").exists():
        print(f"generating {relative(root)} (benchmarks.build_index's corpus) ...", flush=True)
        generate_token_corpus({"root": str(root), "tokens": int(args.tokens),
                               "docs": int(args.docs)})
    paths = [prefix.with_suffix(".bin"), prefix.with_suffix(".idx")]
    nbytes = sum(p.stat().st_size for p in paths)
    cases = _cases(prefix, paths)
    # a sanity check of what is being timed: the figures the commands report
    result = summarize(prefix)
    row = result["datasets"][SINGLE]
    print(f"corpus {relative(prefix)}: {row['documents']:,} documents, {row['tokens']:,} tokens "
          f"({row['dtype']}), largest id {row['largest_token_id']}, .bin + .idx = "
          f"{nbytes / 1e9:.2f} GB; {os.cpu_count()} cores", flush=True)
    seconds = {mode: {name: [] for name in cases} for mode in ("cold", "warm")}
    for round_no in range(1, args.repeats + 1):
        for mode in ("cold", "warm"):
            if mode == "warm":
                plain_read(paths)  # fill the page cache
            for name, fn in cases.items():
                if mode == "cold":
                    evict(paths)
                seconds[mode][name].append(timed(fn))
            print(f"round {round_no}/{args.repeats} {mode}: " + ", ".join(
                f"{name.split(' (')[0]}"
                f"{' cli' if 'CLI' in name else ''} {values[-1]:.2f}s"
                for name, values in seconds[mode].items()), flush=True)
    return {"seconds": seconds, "nbytes": nbytes, "repeats": args.repeats, "json": args.json}


def report(measured: dict) -> int:
    """Print the cold/warm table against the plain read, the target and, with ``--json``, the
    results as JSON."""
    seconds, nbytes = measured["seconds"], measured["nbytes"]
    cases = list(seconds["cold"])
    limit = "plain read (limit)"
    table = [["", "cold s", "cold GB/s", "x read", "warm s", "warm GB/s", "x read"]]
    results = {}
    for name in cases:
        cells = [name]
        results[name] = {}
        for mode in ("cold", "warm"):
            values = seconds[mode][name]
            med = float(np.median(values))
            ratio = float(np.median([v / r for v, r in zip(values, seconds[mode][limit],
                                                             strict=True)]))
            cells += [f"{med:.2f}", f"{nbytes / med / 1e9:.2f}", f"{ratio:.2f}"]
            results[name][mode] = {"seconds": med, "gb_per_s": nbytes / med / 1e9,
                                   "ratio_to_read": ratio, "all_seconds": values}
        table.append(cells)
    widths = [max(len(r[i]) for r in table) for i in range(len(table[0]))]
    print(f"\nsummary and verify of {nbytes / 1e9:.2f} GB (.bin + .idx), medians of "
          f"{measured['repeats']} rounds; 'x read' = time / plain read time in the same round")
    for r in table:
        print("  " + "  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                               for i, (c, w) in enumerate(zip(r, widths, strict=True))))
    worst = max(results[name][mode]["seconds"] for name in cases if name != limit
                for mode in ("cold", "warm"))
    print(f"\ntarget: seconds, not minutes, at about the read limit; slowest figure "
          f"{worst:.1f} s: {'met' if worst < 10 else 'NOT met'}")
    if measured["json"]:
        print(json.dumps({"bytes": nbytes, "results": results}, indent=1))
    return 0


def main(argv: list[str] | None = None) -> int:
    return report(measure(parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
