"""``run_distributed`` (parallel/local_processes.py): the ranks are forked from a server
process started at the first call, yet each call's ranks run in that call's environment, and
a rank's failure comes back with its traceback."""

from __future__ import annotations

import os

import pytest

from bloomline.trainer.parallel.local_processes import run_distributed

pytestmark = pytest.mark.slow

VARIABLE = "BLOOMLINE_TEST_LOCAL_PROCESSES"


def _environment(name: str) -> tuple[str | None, str, str, int]:
    """(the variable, RANK, WORLD_SIZE, torch threads) as a rank sees them."""
    import torch

    return (os.environ.get(name), os.environ["RANK"], os.environ["WORLD_SIZE"],
            torch.get_num_threads())


def _fail_on_rank_1() -> None:
    if os.environ["RANK"] == "1":
        raise ValueError("rank 1 fails here")


def test_each_call_runs_its_ranks_in_the_callers_environment_of_that_call(monkeypatch):
    """Bug: ranks forked from the server see the environment it started with (that of the
    first call): a variable set later (a test's BLOOMLINE_FAULTS) never reaches them, and one
    removed since still does."""
    monkeypatch.setenv(VARIABLE, "first")
    assert run_distributed(1, _environment, VARIABLE) == [("first", "0", "1", 1)]
    monkeypatch.setenv(VARIABLE, "second")
    assert run_distributed(2, _environment, VARIABLE) == [("second", "0", "2", 1),
                                                          ("second", "1", "2", 1)]
    monkeypatch.delenv(VARIABLE)
    assert run_distributed(1, _environment, VARIABLE) == [(None, "0", "1", 1)]


def test_a_failing_rank_raises_here_with_its_traceback():
    """Bug: a rank's exception lost (the call hangs waiting for its result, or returns
    without it) or reported without the rank and the traceback that say where it failed."""
    with pytest.raises(AssertionError, match=r"(?s)rank 1:.*ValueError: rank 1 fails here"):
        run_distributed(2, _fail_on_rank_1, timeout=120)
