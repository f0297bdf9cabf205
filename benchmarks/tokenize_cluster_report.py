"""The printed result of ``benchmarks.tokenize_cluster``: the engines against the local pool
and the 2-process limit, the per-chunk overhead, the splice against the machine's plain rates,
and the derived figures for the multi-node design; written to ``--out`` with the header.

Contract: every function prints from ``measure``'s dict and measures nothing.
"""

from __future__ import annotations

import json
import os
from importlib.metadata import version
from types import SimpleNamespace

from benchmarks.harness.machine import header_line, relative
from benchmarks.harness.table import write_result
from benchmarks.tokenize_cluster_ray import HEAD, WORKER
from benchmarks.tokenize_cluster_steps import WORKERS, med
from bloomline.dataprep.sources import DEFAULT_CHUNK_BYTES

__all__ = ["report"]


def _ratio(S, num: str, den: str, what: str = "seconds") -> float:  # noqa: N803
    return med([x / y for x, y in zip(getattr(S[num], what), getattr(S[den], what),
                                      strict=True)])


def _adjusted(secs: list[float], other: list[float]) -> list[float]:
    """Seconds scaled to all cores free: time x (cores - other) / cores, per round."""
    cores = os.cpu_count() or 1
    return [x * max(cores - o, 0.1) / cores for x, o in zip(secs, other, strict=True)]


def _intro(m: dict, out) -> None:
    """The corpus, the load per round, the cluster and the niced processes."""
    a, stats = m["args"], m["stats"]
    text_bytes, jsonl_bytes, counts = stats["text_bytes"], m["jsonl_bytes"], m["counts"]
    corpus, folder, round_other = m["corpus"], m["folder"], m["round_other"]
    out(f"corpus {corpus.name} (in {relative(a.cache_dir)}): {stats['documents']:,} "
        f"documents, {jsonl_bytes / 1e6:.1f} MB jsonl, {text_bytes / 1e6:.1f} MB of text; "
        f"tokenizer {folder.name}/tokenizer.json; {len(counts)} chunks at --workers 2 "
        f"(default --chunk-mb {DEFAULT_CHUNK_BYTES / 2**20:g}); {a.repeats} rounds")
    out("other processes kept " + ", ".join(f"{c:.2f}" for c in round_other)
        + " cores busy in rounds " + ", ".join(map(str, range(1, a.repeats + 1)))
        + (" (WARNING: shared machine, timings noisy)" if max(round_other) > 0.25 else ""))
    out(f"Ray {version('ray')} cluster: head {HEAD} + worker {WORKER}, 1 CPU each, token auth; "
        f"start-up (before timing): head {m['head_s']:.1f} s + worker node "
        f"{m['worker_s']:.1f} s; its "
        f"daemons idle: {m['cluster_idle']:.3f} cores (counted as ours in every row)"
        + (f"; restarted {m['restarts']} time(s) between rows after something else stopped "
           "it" if m['restarts'] else ""))
    niced = ", ".join(f"{cmd} at nice {nice}" for cmd, nice in sorted(m['niced'].items()))
    out(f"processes of this benchmark that ran niced (the rest at nice 0, the local pool's "
        f"workers too): {niced or 'none'}; a niced process yields the CPU to other processes "
        "first, which matters on a shared machine only")
    out()


def _engines_table(m: dict, out) -> None:
    """The engines' table: (a) the limit, (1) the baseline, (2)-(4), with the legend."""
    S, text_bytes, out_bytes = m["S"], m["stats"]["text_bytes"], m["out_bytes"]  # noqa: N806
    base_tokens = S["base"].tokens
    header = (f"{'variant':<56} {'s':>6} {'adj s':>6} {'MB/s':>5} {'tokens/s':>10} "
              f"{'%2-lim':>6} {'vs base':>7} {'raw vs':>6} {'start s':>7} {'splice s':>8} "
              f"{'cpu s':>6}  seconds per round | other")
    out(header)
    out("-" * len(header))
    limit_adj = _adjusted(S["limit"].seconds, S["limit"].other)
    base_adj = _adjusted(S["base"].seconds, S["base"].other)

    def row(label: str, key: str, secs: list[float] | None = None, tokens: int | None = None,
            start: str | None = None, splice_key: str | None = "splice", full: bool = True,
            ratios: bool = True) -> None:
        s = S[key]
        secs = s.seconds if secs is None else secs
        adj = _adjusted(secs, s.other)
        t, t_adj = med(secs), med(adj)
        tokens = s.tokens if tokens is None else tokens
        lim = med([x / y for x, y in zip(limit_adj, adj, strict=True)]) * 100
        vs = med([x / y for x, y in zip(base_adj, adj, strict=True)])
        raw = med([x / y for x, y in zip(S["base"].seconds, secs, strict=True)])
        st = s.extra.get(start) if start else None
        sp = s.extra.get(splice_key) if splice_key else None
        out(f"{label:<56} {t:>6.2f} {t_adj:>6.2f} {text_bytes / t_adj / 1e6:>5.2f} "
            + (f"{tokens / t_adj:>10,.0f} " if tokens else f"{'':>11}")
            + (f"{lim:>5.1f}% {vs:>6.2f}x {raw:>5.2f}x " if ratios else f"{'':>23}")
            + (f"{med(st):>7.2f} " if st else f"{'':>8}")
            + (f"{med(sp):>8.2f} " if sp else f"{'':>9}")
            + (f"{med(s.cpu):>6.1f}  " if full else f"{'':>8}")
            + " ".join(f"{x:.2f}" for x in secs)
            + (" | " + " ".join(f"{c:.2f}" for c in s.other) if full else ""))

    row("(a) encode_batch_fast + .ids, 2 processes = 2-core limit", "limit", splice_key=None)
    row("(1) tokenize_corpus, local pool, workers=2 = baseline", "base")
    row("(2) --ray HEAD:PORT, 2-node loopback cluster (1+1 CPU)", "ray", start="start")
    row('(3) --ray (local instance started per run, 2 CPUs)', "ray_local", start="start")
    row("(4) SLURM way: 2 x --shard k/2 --workers 1 + merge", "slurm", start="start",
        splice_key="merge")
    row("    of which the 2 parts, run at once", "slurm", secs=S["slurm"].extra["parts"],
        start="start", splice_key=None, full=False)
    row("    of which dataprep merge (its own process)", "slurm", secs=S["slurm"].extra["merge"],
        tokens=0, splice_key=None, full=False, ratios=False)
    out("s: median of rounds (wall); adj s: the same with each round's time x (cores - other) "
        "/ cores, the time had the cores been free (other processes took `other` of them; a "
        "first-order correction for this shared machine: it ignores the slowdown of sharing a "
        "core's caches); MB/s (text bytes) and tokens/s (the output's, with EOD; the limit's "
        "without) per adj s; %2-lim: the 2-process limit's adj s / adj s; vs base: the "
        "baseline's adj s / adj s; raw vs: the same with wall times; ratios are medians of "
        "per-round ratios. start s: ray.init + "
        "ray.shutdown inside the run (cluster: connect, the job's worker processes start on "
        "the first tasks; local: starting and stopping the instance); SLURM: the parts' wall "
        "- the slower part's own time (interpreter start, imports, shard plan). splice s: the "
        "driver's IndexedDatasetWriter.add_index + finalize inside the run; SLURM: the merge's "
        "wall time. cpu s: CPU seconds of all the benchmark's processes (Ray daemons and "
        "workers included). other: cores other processes kept busy during the row.")
    out(f"correctness: the outputs of (2), (3), (4), the tiny-chunk runs and the re-spliced "
        f"shards are byte-identical to the baseline's ({base_tokens:,} tokens, "
        f"{out_bytes / 1e6:.1f} MB .bin + .idx)")


def _per_chunk_table(m: dict, out) -> dict:
    """The per-chunk overhead of the pool and of Ray, and the Tokenizer's unpickling;
    returns engine -> (wall, cpu, driver cpu) seconds per chunk."""
    S = m["S"]  # noqa: N806
    out()
    tiny, few_chunks = m["tiny"], m["few_chunks"]
    out(f"per-chunk overhead: corpus head {m['small'].name} ({m['small_bytes'] / 1e6:.1f} MB), "
        f"{few_chunks} chunks (default size) vs, for the pool, {tiny['pool'][1]:,} chunks of "
        f"{tiny['pool'][0]:,} B (--chunk-mb {tiny['pool'][0] / 2**20:.4f}) and for Ray "
        f"{tiny['raychunks'][1]:,} chunks of {tiny['raychunks'][0]:,} B; workers=2")
    header = (f"{'engine':<34} {'chunks':>6} {'s':>6} {'cpu s':>6} {'driver cpu s':>12} "
              f"{'start s':>7} {'overhead/chunk: wall':>20} {'cpu':>8} {'driver':>8}  "
              "seconds per round | other")
    out(header)
    out("-" * len(header))
    per_chunk = {}
    for engine, label in (("pool", "local pool"), ("raychunks", "Ray 2-node cluster")):
        few, many = S[f"{engine}_few"], S[f"{engine}_many"]
        many_chunks = tiny[engine][1]
        n = many_chunks - few_chunks
        wall = med([(m - f) / n for m, f in zip(many.seconds, few.seconds, strict=True)])
        cpu = med([(m - f) / n for m, f in zip(many.cpu, few.cpu, strict=True)])
        drv = med([(m - f) / n for m, f in zip(many.driver_cpu, few.driver_cpu, strict=True)])
        per_chunk[engine] = (wall, cpu, drv)
        for s, chunks in ((few, few_chunks), (many, many_chunks)):
            st = s.extra.get("start", [0])
            out(f"{label + (' (few)' if s is few else ' (many)'):<34} {chunks:>6,} "
                f"{med(s.seconds):>6.2f} {med(s.cpu):>6.2f} {med(s.driver_cpu):>12.2f} "
                + (f"{med(st):>7.2f} " if engine != "pool" else f"{'':>8}")
                + (f"{wall * 1e6:>17,.0f} us {cpu * 1e6:>5,.0f} us {drv * 1e6:>5,.0f} us  "
                   if s is many else f"{'':>41}  ")
                + " ".join(f"{x:.2f}" for x in s.seconds) + " | "
                + " ".join(f"{c:.2f}" for c in s.other))
    unpickle = med(S["unpickle"].seconds) / 5
    out(f"unpickling the Tokenizer (it loads tokenizer.json again): {unpickle * 1e3:.1f} ms ("
        + " ".join(f"{x / 5 * 1e3:.1f}" for x in S["unpickle"].seconds) + " per round); Ray "
        "deserializes a task's arguments for every task, so ray_tasks ships the init args as "
        "pickled bytes and only a worker process new to the job unpickles them (before that, "
        "every task reloaded the tokenizer: ~120 ms per chunk on this machine)")
    out("overhead/chunk = (many-chunk run - few-chunk run) / (difference in chunks), medians "
        "of per-round values: wall (what the job waits for, 2 workers sharing the work), cpu "
        "(all the benchmark's processes: workers, driver, Ray daemons), driver (this process "
        "alone: submitting, collecting results, the splice).")
    return per_chunk


def _splice_table(m: dict, out) -> dict:
    """The splice loop, the merge and the machine's plain rates; returns their MB/s."""
    S, jsonl_bytes = m["S"], m["jsonl_bytes"]  # noqa: N806
    out_bytes, bin_bytes, counts = m["out_bytes"], m["bin_bytes"], m["counts"]
    out()
    out(f"the splice and the machine: output {bin_bytes / 1e6:.1f} MB .bin + "
        f"{(out_bytes - bin_bytes) / 1e6:.2f} MB .idx from {len(counts)} shards (.bin + .idx "
        f"of {min(m['shard_sizes']) / 1e6:.2f}-{max(m['shard_sizes']) / 1e6:.2f} MB, median "
        f"{med(m['shard_sizes']) / 1e6:.2f}); corpus {jsonl_bytes / 1e6:.1f} MB; all on one local "
        "disk (no shared filesystem on this machine)")
    header = (f"{'operation':<70} {'MB':>6} {'s':>6} {'MB/s':>7} {'ms/shard':>8}  "
              "seconds per round | other")
    out(header)
    out("-" * len(header))
    rates = {}
    n_shards = len(counts)
    sp = S["splice"].extra
    for key, label, nbytes, secs in (
            ("splice", f"splice loop: add_index of the {n_shards} shards + unlink + finalize",
             out_bytes, S["splice"].seconds),
            ("copy", "    of which add_index (copy_file_range + the index arrays)", out_bytes,
             sp["copy"]),
            ("unlink", "    of which unlinking each shard's .bin and .idx", None, sp["unlink"]),
            ("finalize", "    of which finalize (writes the .idx, renames)", None,
             sp["finalize"]),
            ("merge_fn", "merge_indexed_datasets of the 2 SLURM parts (dataprep merge, in "
             "process)", out_bytes, None),
            ("copyfile", "shutil.copyfile of the output's .bin (page cache)", bin_bytes, None),
            ("read_cached", "sequential read of the corpus, page cache", jsonl_bytes, None),
            ("read_direct", "sequential read of the corpus, O_DIRECT (the disk)", jsonl_bytes,
             None),
            ("write_fsync", "write + fsync of the .bin's size (the disk)", bin_bytes, None)):
        full = secs is None or key == "splice"
        secs = S[key].seconds if secs is None else secs
        per_shard = key in ("splice", "copy", "unlink")
        rates[key] = med([nbytes / x / 1e6 for x in secs]) if nbytes else 0.0
        out(f"{label:<70} " + (f"{nbytes / 1e6:>6.1f} " if nbytes else f"{'':>7}")
            + f"{med(secs):>6.3f} " + (f"{rates[key]:>7,.0f} " if nbytes else f"{'':>8}")
            + (f"{med(secs) / n_shards * 1e3:>8.2f}  " if per_shard else f"{'':>10}")
            + " ".join(f"{x:.3f}" for x in secs)
            + (" | " + " ".join(f"{c:.2f}" for c in S[key].other) if full else ""))
    out("MB/s: median over rounds of bytes / seconds (splice and merge: .bin + .idx written); "
        "the shards are cut from the baseline's output at its chunks' document boundaries and "
        "written (untimed) just before, so they are in the page cache as a worker leaves them.")
    return rates


def _figures(m: dict, per_chunk: dict) -> SimpleNamespace:
    """The scalars the derived lines use (medians)."""
    a, S, stats = m["args"], m["S"], m["stats"]  # noqa: N806
    text_bytes, jsonl_bytes, out_bytes = stats["text_bytes"], m["jsonl_bytes"], m["out_bytes"]
    base_t = med(S["base"].seconds)
    out_per_text = out_bytes / text_bytes
    jsonl_per_text = jsonl_bytes / text_bytes
    # per core-second of the baseline's processes (driver included): unlike its wall time,
    # this does not depend on how much of the 2 cores other processes took meanwhile
    per_core = text_bytes / med(S["base"].cpu) / 1e6
    node_text = per_core * a.node_cores
    node_out = node_text * out_per_text
    fleet_out = node_out * a.nodes

    chunk_core_s = DEFAULT_CHUNK_BYTES * (text_bytes / jsonl_bytes) / (per_core * 1e6)
    pool_w, pool_c, pool_d = per_chunk["pool"]
    ray_w, ray_c, ray_d = per_chunk["raychunks"]
    in_run_splice = med([sp / t for sp, t in zip(S["base"].extra["splice"], S["base"].seconds,
                                                 strict=True)]) * 100
    tasks_per_s = a.node_cores * a.nodes / chunk_core_s
    n_shards = len(m["counts"])
    unlink_ms = med(S["splice"].extra["unlink"]) / n_shards * 1e3
    unpickle = med(S["unpickle"].seconds) / 5
    return SimpleNamespace(**{k: v for k, v in locals().items()
                              if k not in ("a", "S", "m", "stats", "per_chunk")})


def _derived_engines(m: dict, f: SimpleNamespace, out) -> None:
    """Overheads against the pool, per chunk, output per text, the per-core rate."""
    a, S, stats = m["args"], m["S"], m["stats"]  # noqa: N806
    text_bytes, base_tokens = stats["text_bytes"], S["base"].tokens
    cores = os.cpu_count() or 1
    base_adj = _adjusted(S["base"].seconds, S["base"].other)

    def overhead(key: str) -> str:
        """Extra time against the baseline, per round, median: load-adjusted, the same
        without the start-up part, wall, CPU seconds."""
        adj = _adjusted(S[key].seconds, S[key].other)
        start = S[key].extra["start"]
        pct = med([x / b - 1 for x, b in zip(adj, base_adj, strict=True)]) * 100
        wo = med([(x - st) / b - 1 for x, st, b in zip(adj, start, base_adj, strict=True)]) * 100
        raw = (_ratio(S, key, "base") - 1) * 100
        cpu = (_ratio(S, key, "base", "cpu") - 1) * 100
        return (f"{pct:+.1f}% ({wo:+.1f}% without the {med(start):.2f} s of start-up; wall "
                f"{raw:+.1f}%, CPU {cpu:+.1f}%)")

    out()
    out("derived (medians; assumption: every core of a node tokenizes at this machine's "
        "measured rate per CPU-second):")
    out(f"- overhead vs the local pool on the same {cores} cores (load-adjusted times): "
        f"Ray 2-node cluster {overhead('ray')}; Ray local {overhead('ray_local')}, its "
        f"ray.init alone {med(S['ray_local'].extra['init']):.2f} s; SLURM way "
        f"{overhead('slurm')}, of which the merge {med(S['slurm'].extra['merge']):.2f} s")
    out(f"- overhead per chunk: local pool {f.pool_w * 1e3:.2f} ms wall / {f.pool_c * 1e3:.2f} ms "
        f"CPU; Ray cluster {f.ray_w * 1e3:.2f} ms wall / {f.ray_c * 1e3:.2f} ms CPU (driver "
        f"{f.ray_d * 1e3:.2f} ms). A default {DEFAULT_CHUNK_BYTES / 2**20:g} MiB chunk takes "
        f"{f.chunk_core_s:.2f} core-seconds here, so Ray's per-chunk CPU is "
        f"{f.ray_c / f.chunk_core_s * 100:.3f}% of a chunk's work (the pool's "
        f"{f.pool_c / f.chunk_core_s * 100:.3f}%)")
    out(f"- output per text: {f.out_per_text:.3f} bytes of .bin + .idx per byte of text "
        f"({text_bytes / base_tokens:.2f} text bytes per token, "
        f"{m['itemsize']} bytes per token); input read per text byte: "
        f"{f.jsonl_per_text:.3f} (jsonl)")
    out(f"- per-core text rate: {f.per_core:.2f} MB/s (the baseline's text / its CPU seconds, "
        f"driver included; wall: {text_bytes / f.base_t / WORKERS / 1e6:.2f} MB/s per worker) -> "
        f"one {a.node_cores}-core "
        f"node: {f.node_text:.0f} MB/s of text, {f.node_out:.0f} MB/s of tokens to splice; "
        f"{a.nodes} nodes: {f.node_text * a.nodes / 1e3:.1f} GB/s of text, "
        f"{f.fleet_out / 1e3:.2f} GB/s of tokens through one splice")


def _derived_fleet(m: dict, f: SimpleNamespace, rates: dict, out) -> None:
    """The splice, the network and the task rate at ``--nodes`` nodes."""
    a = m["args"]
    out(f"- the splice, one driver process, page cache, these shard sizes: the loop "
        f"{rates['splice']:,.0f} MB/s = {rates['splice'] / f.node_out:.1f} nodes' worth; "
        f"add_index alone {rates['copy']:,.0f} MB/s = {rates['copy'] / f.node_out:.1f} nodes; "
        f"plain copyfile {rates['copyfile']:,.0f} MB/s = {rates['copyfile'] / f.node_out:.0f} "
        f"nodes. {a.nodes} nodes need {f.fleet_out:,.0f} MB/s: "
        f"{f.fleet_out / rates['splice']:.1f}x "
        f"the loop, {f.fleet_out / rates['copyfile']:.2f}x a plain copy. This disk: read "
        f"{rates['read_direct']:,.0f} MB/s, write + fsync {rates['write_fsync']:,.0f} MB/s. "
        f"merge_indexed_datasets (2 parts): {rates['merge_fn']:,.0f} MB/s. In the baseline run "
        f"the driver's add_index + finalize took {f.in_run_splice:.1f}% of the wall time")
    out(f"- bytes over the network per byte of text with one driver splicing from a shared "
        f"filesystem: {f.jsonl_per_text:.2f} (workers read jsonl) + "
        f"{f.out_per_text:.2f} (workers "
        f"write shards) + {f.out_per_text:.2f} (driver reads them) + {f.out_per_text:.2f} (driver "
        f"writes the output) = {f.jsonl_per_text + 3 * f.out_per_text:.2f}; at {a.nodes} nodes "
        f"{f.node_text * a.nodes * (f.jsonl_per_text + 3 * f.out_per_text) / 1e3:.1f} GB/s "
        "through "
        f"the filesystem, {2 * f.fleet_out / 1e3:.1f} GB/s of it through the driver's node")
    out(f"- chunks at {a.nodes} nodes with default {DEFAULT_CHUNK_BYTES / 2**20:g} MiB chunks: "
        f"{f.tasks_per_s:,.0f} tasks (and shards) per second; at the driver's measured "
        f"{f.ray_d * 1e3:.2f} ms CPU per Ray task (submit, collect, splice) that is "
        f"{f.tasks_per_s * f.ray_d:.1f} driver cores; unlinking the shards alone "
        f"({f.unlink_ms:.2f} ms per shard on this disk) "
        f"{f.tasks_per_s * f.unlink_ms / 1e3:.1f} s per "
        f"second; loading the tokenizer ({f.unpickle * 1e3:.0f} ms) once per worker process and "
        f"job is {f.unpickle / f.chunk_core_s * 100:.1f}% of one chunk's work")


def report(m: dict) -> int:
    """Print every part, then write ``--out`` with the header and, with ``--json``, print
    the series as JSON."""
    a = m["args"]
    lines: list[str] = []

    def out(line: str = "") -> None:
        print(line)
        lines.append(line)

    _intro(m, out)
    _engines_table(m, out)
    per_chunk = _per_chunk_table(m, out)
    rates = _splice_table(m, out)
    figures = _figures(m, per_chunk)
    _derived_engines(m, figures, out)
    _derived_fleet(m, figures, rates, out)
    header = (header_line(f"ray {version('ray')}, tokenizers {version('tokenizers')}",
                          started=m["started"])
              + f"\n{m['load_before']}; os.cpu_count() = {os.cpu_count()}\n")
    write_result(a.out, header, lines)
    if a.json:
        print(json.dumps({k: v.__dict__ for k, v in m["S"].items()}, indent=1))
    return 0
