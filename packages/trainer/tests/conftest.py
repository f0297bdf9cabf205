"""Shared fixtures: a tiny corpus of random-ish token documents and a config that trains on it
in a second (helpers in trainer_fixtures.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

# trainer_fixtures and equivalence are imported by name in tests and, pickled by
# reference, in the processes run_distributed spawns (which inherit sys.path). Appended, not
# prepended: the repository root's conftest must stay the one `from conftest import` finds.
# The tests are grouped in folders as the source is (parallel/, survival/, ...); a folder is
# on sys.path too, for the test modules imported by name from another test (test_run_restarts
# uses test_parallel_launch's helpers): test file names stay unique across the folders.
TESTS = Path(__file__).parent
sys.path.append(str(TESTS))
sys.path.extend(str(folder) for folder in sorted(TESTS.iterdir())
                if folder.is_dir() and any(folder.glob("test_*.py")))

from trainer_fixtures import tiny_config, write_corpus  # noqa: E402


@pytest.fixture
def corpus(tmp_path):
    return write_corpus(tmp_path / "corpus")


@pytest.fixture
def make_config():
    """``make_config(corpus, run_dir, section={field: value})``: the tiny test config."""
    return tiny_config
