"""Where the benchmarks find the repository and keep their caches and results.

Contract: ``REPO`` is the repository root whatever the working directory; ``CACHE_DIR``
(git-ignored) holds generated corpora and trained tokenizers, reused between runs;
``RESULTS_DIR`` holds the committed result files.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["CACHE_DIR", "REPO", "RESULTS_DIR"]

REPO = Path(__file__).resolve().parents[2]
CACHE_DIR = REPO / "benchmarks" / ".cache"
RESULTS_DIR = REPO / "benchmarks" / "results"
