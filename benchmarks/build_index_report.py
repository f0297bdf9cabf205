"""The printed result of ``benchmarks.build_index``: the corpus, the builds table against
megatron-core with the floor, random access, the batched reads and the blend-indices rows.

Contract: every function prints from the dicts ``build_index.measure`` returns and measures
nothing; ``report_*`` return 1 where indices or samples differ from megatron-core's, else 0.
"""

from __future__ import annotations

import json
import os

from benchmarks.build_index_access import report_batched
from benchmarks.harness.machine import relative
from benchmarks.harness.stats import median, ratio
from benchmarks.harness.table import cell as table_cell
from benchmarks.harness.table import print_table
from benchmarks.harness.token_corpus import (
    SEED,
    SEQ_LENGTH,
    SIGMA_DOC,
    WEIGHTS,
    token_corpus_root,
)


def _print_corpus(args, stats: dict, cases: dict, res: dict, with_mcore: bool) -> None:
    """The corpus's datasets, then per case what was requested, served and written."""
    mb = 1 / 2**20
    corpus = relative(token_corpus_root(args.cache_dir, args.tokens, args.docs))
    print(f"\ncorpus {corpus} "
          f"(uint16 tokens, lognormal document lengths, sigma {SIGMA_DOC}); "
          f"os.cpu_count() = {os.cpu_count()}")
    for name, s in stats.items():
        print(f"  {name:<10} {s['tokens']:>15,} tokens {s['documents']:>11,} documents  "
              f"mean {s['mean']:.0f}, median {s['median']:.0f}, max {s['max']:,} tokens; "
              f"{s['bin_bytes'] / 1e9:.2f} GB")
    for case in cases:
        ours = res[case]["ours"][0]
        label = (f"{args.epochs} epochs' worth" if case == "single" else
                 "weights " + ", ".join(f"{k}={v}" for k, v in WEIGHTS.items()))
        line = (f"{case}: L={SEQ_LENGTH}, seed {SEED}, {label}: {cases[case]['samples']:,} "
                f"samples requested, {ours['samples']:,} served; index files: ours "
                f"{ours['index_bytes'] * mb:,.0f} MiB")
        if with_mcore:
            line += f", megatron-core {res[case]['megatron'][0]['index_bytes'] * mb:,.0f} MiB"
        print(line)
        for name, row in ours["datasets"].items():
            print(f"  {name}: {row['documents']:,} documents, {row['epochs']} epochs, "
                  f"{row['samples']:,} samples built (requested {row['requested']:,}), "
                  f"separate last epoch: {'yes' if row['separate_last_epoch'] else 'no'}")


def _rows(args, res: dict, floors: list, accesses: list, with_mcore: bool) -> tuple:
    """(table rows, target lines): the builds' seconds and peak MiB against megatron-core's
    and the floor, and random access against megatron-core's two paths and the limit."""
    mb = 1 / 2**20
    rows = []  # (label, ours, megatron-core, gain, floor/limit, ours/floor)
    targets = []
    for case, title in (("single", f"single {args.epochs}-epoch build"),
                        ("blend", f"blend build, {args.blend_samples / 1e6:g}M samples")):
        ours_runs, mc_runs = res[case]["ours"], res[case]["megatron"]
        secs = [r["seconds"] for r in ours_runs]
        mem = [(r["peak"] - r["rss_before"]) * mb for r in ours_runs]
        floor_s = [f[case]["seconds"] for f in floors]
        floor_mem = [f[case]["peak_above"] * mb for f in floors]
        mc_secs = [r["seconds"] for r in mc_runs]
        mc_mem = [(r["peak"] - r["rss_before"]) * mb for r in mc_runs]
        gain = ratio(mc_secs, secs) if with_mcore else None
        mem_gain = ratio(mc_mem, mem) if with_mcore else None
        rows.append((f"{title}, s", median(secs), median(mc_secs), gain, median(floor_s),
                     ratio(secs, floor_s)))
        rows.append((f"{title}, peak MiB", median(mem), median(mc_mem), mem_gain,
                     median(floor_mem), ratio(mem, floor_mem)))
        if with_mcore:
            target = 1.3 if case == "single" else 1.0
            targets.append(f"target: {title} >= {target:g}x megatron-core's speed: "
                           f"{gain:.2f}x {'PASS' if gain >= target else 'FAIL'}; no more memory: "
                           f"{median(mem):,.0f} vs {median(mc_mem):,.0f} MiB "
                           f"{'PASS' if median(mem) <= median(mc_mem) else 'FAIL'}")
    rates = {k: [a["rates"][k] for a in accesses] for k in accesses[0]["rates"]}
    for key, label in (("mcore_getitem", "random access ds[i] (mcore: __getitem__), samples/s"),
                       ("mcore_query", "random access ds[i] (mcore: _query_...), samples/s")):
        theirs = rates.get(key, [])
        rows.append((label, median(rates["ours"]), median(theirs),
                     ratio(rates["ours"], theirs) if theirs else None, median(rates["memcpy"]),
                     ratio(rates["ours"], rates["memcpy"])))

    return rows, targets


def _print_rows(rows: list) -> None:
    def cell(value, fmt, width=14):
        return table_cell(value, fmt, width)

    def line(label, ours, theirs, gain, floor, vs_floor) -> str:
        fmt = ">14.2f" if label.endswith(", s") else ">14,.0f"
        return (f"{label:<52} {cell(ours, fmt)} {cell(theirs, fmt)} {cell(gain, '>6.2f', 6)}"
                f"{'x' if gain is not None else ' '} {cell(floor, fmt)} "
                f"{cell(vs_floor, '>10.2f', 10)}")

    header = (f"{'measurement':<52} {'ours':>14} {'megatron-core':>14} {'gain':>7} "
              f"{'floor/limit':>14} {'ours/floor':>10}")
    print_table(header, (line(*row) for row in rows))
def _print_notes(args, cases: dict, res: dict, floors: list, accesses: list,
                 with_mcore: bool) -> None:
    """What the columns mean, numpy's shuffles, the RSS baselines and the access setup."""
    mb = 1 / 2**20
    rates = {k: [a["rates"][k] for a in accesses] for k in accesses[0]["rates"]}
    print(f"median of {args.repeats} rounds (ours and megatron-core alternate going first). "
          "gain: megatron-core / ours for s and MiB, ours / megatron-core for samples/s, the "
          "median of per-round ratios; > 1 = ours better. peak MiB: ru_maxrss after the build "
          "minus the RSS just before it. floor, s: the shuffles of the document and shuffle "
          "indices alone, ours (compiled, the same permutations as RandomState.shuffle; "
          "numba's import and kernel load apart); floor, MiB: the peak of holding those arrays, "
          "one dataset at a time. limit, samples/s: copying L+1 tokens from each sample's "
          "start in the memory-mapped .bin into a preallocated int64 buffer.")
    numpy_floor = ", ".join(f"{case} {median([f[case]['numpy_seconds'] for f in floors]):.2f} s"
                            for case in cases)
    print(f"the same shuffles by numpy's RandomState.shuffle (megatron-core's): {numpy_floor}; "
          f"numba's import and kernel load before ours: "
          f"{median([f['compiled_load'] for f in floors]):.2f} s (paid by every build process "
          "that shuffles >= 1M entries, inside ours, s)")
    base = f"ours {median([r['rss_before'] * mb for c in cases for r in res[c]['ours']]):,.0f}"
    if with_mcore:
        base += (", megatron-core "
                 f"{median([r['rss_before'] * mb for c in cases for r in res[c]['megatron']]):,.0f}"
                 " (torch imported)")
    peaks = ", ".join(f"{case} {b} {median([r['peak'] * mb for r in res[case][b]]):,.0f}"
                      for case in cases for b in res[case] if res[case][b])
    print(f"baseline RSS after imports (MiB): {base}; absolute peak RSS (MiB): {peaks}")
    warm, first = accesses[0]["warm"], accesses[0]
    print(f"random access: {first['samples']:,} random i of {first['dataset_samples']:,} "
          f"samples, the same i for all; page cache warmed first (the .bin read once: "
          f"{warm['bytes'] / 1e9:.2f} GB at {warm['bytes'] / warm['seconds'] / 1e9:.1f} GB/s); "
          f"the limit moves {median(rates['memcpy']) * (SEQ_LENGTH + 1) * 2 / 1e9:.2f} GB/s "
          "of uint16 tokens")


def _check(args, cases: dict, res: dict, accesses: list, compares: dict, with_mcore: bool,
           targets: list) -> list[str]:
    """Print whether our indices and samples equal megatron-core's, then the targets; the
    problems found (an inexact peak, a difference)."""
    mb = 1 / 2**20
    problems = []
    for case in cases:
        for r in res[case]["ours"] + res[case]["megatron"]:
            if abs(r["peak"] - r["hwm"]) > 0.05 * r["peak"] or r["peak"] <= r["maxrss_before"]:
                problems.append(f"{case}: ru_maxrss {r['peak'] * mb:,.0f} MiB, VmHWM "
                                f"{r['hwm'] * mb:,.0f} MiB, ru_maxrss before the build "
                                f"{r['maxrss_before'] * mb:,.0f} MiB: the peak may be inexact")
    if with_mcore:
        identical = all(c["identical"] for case in cases for c in compares[case])
        details = []
        for case in cases:
            arrays = ", ".join(
                f"{r['array']} {'x'.join(map(str, r['shape']))} {'/'.join(r['dtypes'])}"
                f"{'' if r['equal'] else ' DIFFERS'}" if "shape" in r else
                f"{r['array']} {r['note']}" for r in compares[case][0]["rows"])
            details.append(f"{case}: {arrays}")
        print(f"identical: {'yes' if identical else 'NO'} (every round; arrays "
              f"ours/megatron-core dtype) " + "; ".join(details))
        checked = [a["checked"] for a in accesses]
        print(f"ds[i] tokens equal to megatron-core's _query_document_sample_shuffle_indices "
              f"for {checked[0]['samples']:,} of the random i: "
              f"{'yes' if all(c['equal'] for c in checked) else 'NO'}")
        if not identical or not all(c["equal"] for c in checked):
            problems.append("indices or samples differ from megatron-core's")
        for line in targets:
            print(line)
    else:
        print("megatron-core not measured (--skip-megatron, or not installed): ours only")
    return problems


def report_builds(args, builds: dict, with_mcore: bool) -> int:
    """Print the builds' part of the result; 1 if indices or samples differ."""
    stats, cases, res = builds["stats"], builds["cases"], builds["res"]
    floors, accesses, compares = builds["floors"], builds["accesses"], builds["compares"]
    _print_corpus(args, stats, cases, res, with_mcore)
    rows, targets = _rows(args, res, floors, accesses, with_mcore)
    _print_rows(rows)
    _print_notes(args, cases, res, floors, accesses, with_mcore)
    report_batched(accesses)
    problems = _check(args, cases, res, accesses, compares, with_mcore, targets)
    for problem in problems:
        print(f"warning: {problem}")
    if args.json:
        print(json.dumps({"stats": stats, "builds": res, "floors": floors, "access": accesses,
                          "compare": compares, "rows": rows}, indent=1))
    return 1 if any("differ" in p for p in problems) else 0




def report_blend_rows(args, measured: dict, with_mcore: bool) -> int:
    """Blend indices alone, ours against megatron-core's helper, per dataset count; and the
    first call of a fresh process. Returns 1 if an index differs."""
    samples, result = measured["samples"], measured["result"]
    cold, warm = measured["cold"], measured["warm"]
    rows = result["rows"]
    header = (f"{'blend indices, datasets':<24} {'kernel':>8} {'megatron-core s':>15} "
              f"{'ours s':>8} {'ours/mcore':>10} {'(cpu)':>6} {'other kernel s':>16} "
              f"{'other cores':>11} {'identical':>9}")
    print_table(header, [])
    passed, differ = True, False
    for row in rows:
        ours, theirs = row["runs"]["ours"], row["runs"]["megatron"]
        unchosen = f"{row['unchosen']} {median(row['runs']['unchosen']['wall']):.3f}"
        wall = ratio(ours["wall"], theirs["wall"]) if theirs["wall"] else None
        cpu = ratio(ours["cpu"], theirs["cpu"]) if theirs["cpu"] else None
        other = median(ours["other"] + theirs["other"] + row["runs"]["unchosen"]["other"])
        passed &= wall is not None and wall <= 1
        differ |= row["identical"] is False
        same = "yes" if row["identical"] else "NO"
        print(f"{row['datasets']:<24} {row['kernel']:>8} "
              f"{median(theirs['wall']) or float('nan'):>15.3f} {median(ours['wall']):>8.3f} "
              f"{wall or float('nan'):>9.2f}x {cpu or float('nan'):>5.2f}x {unchosen:>16} "
              f"{other:>11.2f} {same:>9}")
    print(f"median of {args.blend_rows_repeats} rounds (the builders' order reversed every "
          "other round); ours/mcore: the median of per-round ratios of wall seconds, (cpu): of "
          "this process's CPU seconds; other kernel: ours forced to the kernel not chosen; other "
          "cores: cores other processes kept busy meanwhile (median); identical: all three. "
          "Weights lognormal(sigma 1), normalized; megatron-core's helper writes into "
          "numpy.zeros arrays allocated in the timed span, as its BlendedDataset does; "
          "ours allocates its own.")
    print(f"limit: allocating both outputs and writing each once (int16 + int64, "
          f"{samples * 10 / 1e6:.0f} MB), which any builder must: "
          f"{median(result['write_floor']):.3f} s (median)")
    first = (f"first call in a fresh process (not in the rows): ours, numba's import + "
             f"compiling the segment kernel {cold['ours_segments']:.2f} s, the wake kernel "
             f"{cold['ours_wake']:.2f} s; with numba's cache (every later process) "
             f"{warm['ours_segments']:.2f} s + {warm['ours_wake']:.2f} s")
    if with_mcore:
        first += (f"; megatron-core, importing its helpers + the call: "
                  f"{warm['megatron']:.2f} s")
        print(first)
        print(f"target: blend indices at most megatron-core's time at every dataset count: "
              f"{'PASS' if passed else 'FAIL'}; identical: {'NO' if differ else 'yes'}")
    else:
        print(first)
        print("megatron-core not measured (--skip-megatron, or not installed): ours only")
    if args.json:
        print(json.dumps({"blend_rows": rows, "blend_first": {"cold": cold, "warm": warm}},
                         indent=1))
    return 1 if differ else 0
