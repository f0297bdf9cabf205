"""Why dataprep reads JSON lines and Parquet itself: reader throughput against `datasets`.

The tokenize pipeline needs the texts of each chunk, in order, with file:line for errors. This
benchmark times getting every text out of the same corpus three ways, in one run:

  limit     reading the file's bytes in 8 MiB blocks (page cache / disk bandwidth)
  dataprep  ``iter_chunks`` + ``extract_documents`` (what each tokenize worker does)
  datasets  ``datasets.load_dataset(<format>, data_files=...)`` (arrow conversion and its
            on-disk cache, in a fresh cache folder each time) then the text column

for the generated jsonl corpus of ``benchmarks.tokenize`` (``harness.text_corpus``) and a
Parquet copy of it. A reader only matters if it is not far faster than tokenizing (whose rate
per core is ``benchmarks.tokenize``'s result).

Run: ``make bench-readers`` or ``python -m benchmarks.readers [--size-mb 200]``.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from importlib.metadata import version
from pathlib import Path

from benchmarks.harness.machine import header_line, relative
from benchmarks.harness.paths import CACHE_DIR
from benchmarks.harness.text_corpus import jsonl_corpus
from bloomline.dataprep.documents import extract_documents
from bloomline.dataprep.sources import expand_inputs, iter_chunks

__all__ = ["main", "measure", "report"]


def _limit(path: Path) -> int:
    total = 0
    with open(path, "rb") as fh:
        while block := fh.read(8 << 20):
            total += len(block)
    return total


def _dataprep(path: Path) -> int:
    return sum(extract_documents(chunk, ["text"]).num_documents
               for chunk in iter_chunks(expand_inputs([str(path)])))


def _datasets(path: Path, builder: str) -> int:
    import datasets

    datasets.disable_progress_bars()
    cache = tempfile.mkdtemp(prefix="bench_readers_hf_")
    try:
        ds = datasets.load_dataset(builder, data_files=str(path), split="train", cache_dir=cache)
        count = 0
        for batch in ds.with_format("arrow").iter(batch_size=10_000):
            count += len(batch.column("text").to_pylist())
        return count
    finally:
        shutil.rmtree(cache, ignore_errors=True)


def _timed(fn, *args) -> tuple[float, int]:
    start = time.perf_counter()
    result = fn(*args)
    return time.perf_counter() - start, result


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=float, default=200)
    parser.add_argument("--cache-dir", type=Path, default=CACHE_DIR)
    return parser.parse_args(argv)


def measure(args: argparse.Namespace) -> dict:
    """``{"rows": [(name, seconds, file MB/s, documents or None)]}``, three rows (limit,
    dataprep, datasets) per format; asserts that both readers count the same documents."""
    print(header_line(f"datasets {version('datasets')}, pyarrow {version('pyarrow')}"),
          flush=True)
    args.cache_dir.mkdir(parents=True, exist_ok=True)
    jsonl = jsonl_corpus(args.cache_dir, args.size_mb)
    parquet = jsonl.with_suffix(".parquet")
    if not parquet.exists():
        import pyarrow.json as pj
        import pyarrow.parquet as pq

        pq.write_table(pj.read_json(jsonl), parquet, row_group_size=2000)

    rows = []
    for path, builder in ((jsonl, "json"), (parquet, "parquet")):
        size = path.stat().st_size
        secs, _ = _timed(_limit, path)
        rows.append((f"{path.suffix[1:]}: read bytes (limit)", secs, size / secs / 1e6, None))
        secs, count = _timed(_dataprep, path)
        rows.append((f"{path.suffix[1:]}: dataprep reader", secs, size / secs / 1e6, count))
        secs, count_hf = _timed(_datasets, path, builder)
        rows.append((f"{path.suffix[1:]}: datasets.load_dataset", secs, size / secs / 1e6,
                     count_hf))
        assert count == count_hf, f"{relative(path)}: {count} documents vs datasets' {count_hf}"
    return {"rows": rows}


def report(measured: dict) -> int:
    """Print the table: each row's seconds, MB/s, documents and speed against datasets'."""
    rows = measured["rows"]
    base = {name.split(":")[0]: secs for name, secs, _, _ in rows if "datasets" in name}
    print(f"{'reader':38s} {'s':>7s} {'file MB/s':>10s} {'docs':>9s} {'vs datasets':>12s}")
    for name, secs, mbps, count in rows:
        ratio = base[name.split(":")[0]] / secs
        print(f"{name:38s} {secs:7.2f} {mbps:10.1f} {count or '':>9} {ratio:11.2f}x")
    return 0


def main(argv: list[str] | None = None) -> int:
    return report(measure(parse_args(argv)))


if __name__ == "__main__":
    raise SystemExit(main())
