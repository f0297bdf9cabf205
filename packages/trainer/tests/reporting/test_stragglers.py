"""Who is named a straggler, given the ranks' section times of a log interval
(``reporting/stragglers.find_stragglers``): the slow rank and the section it was slow in,
never the ranks that waited for it. Pure function: no processes (the end-to-end check, one
rank delayed in a real two-rank run, is ``survival/test_rank_health.py``)."""

from __future__ import annotations

from bloomline.trainer.reporting.step_sections import SECTIONS
from bloomline.trainer.reporting.stragglers import Straggler, find_stragglers, straggler_line

STEPS = 10


def _row(**seconds: float) -> list[float]:
    """A rank's interval: seconds per step in each named section (the rest 0), x STEPS."""
    return [STEPS * seconds.get(name, 0.0) for name in SECTIONS]


def _named(rows, groups=None, factor=1.5, min_seconds=0.05) -> set[tuple[int, str]]:
    found = find_stragglers(rows, groups or [0] * len(rows), STEPS, factor, min_seconds)
    return {(s.rank, s.section) for s in found}


# what a normal step looks like on every rank: the verdict's all-reduce waits a little
NORMAL = {"other": 0.001, "data": 0.001, "forward": 0.1, "backward": 0.2, "reduce": 0.02,
          "optimizer": 0.03, "verdict": 0.001}


def _with(**changes: float) -> dict[str, float]:
    return {**NORMAL, **{name: NORMAL.get(name, 0.0) + extra
                         for name, extra in changes.items()}}


def test_two_ranks_the_slow_forward_is_named_not_the_rank_that_waited_in_backward():
    """Bug: comparing each section's time with the median names the waiter too: rank 0,
    done with its forward early, waits for rank 1 in backward (the gradient reduction runs
    there), so its backward is 0.5 s longer than rank 1's. Only rank 1's forward is slow."""
    rows = [_row(**_with(backward=0.5)), _row(**_with(forward=0.5))]
    assert _named(rows) == {(1, "forward")}


def test_a_slow_data_wait_is_named_where_the_others_wait_in_forward():
    """Bug: rank 2's loader is slow; the others wait in their first collective (ZeRO-3's
    all-gather in forward): neither their forward nor anything else of theirs may be named."""
    slow = _with(data=0.4)
    waiting = _with(forward=0.4)
    rows = [_row(**waiting), _row(**waiting), _row(**slow), _row(**waiting)]
    found = find_stragglers(rows, [0] * 4, STEPS, 1.5, 0.05)
    assert [(s.rank, s.section) for s in found] == [(2, "data")]
    assert abs(found[0].behind - 0.4) < 1e-9 and abs(found[0].seconds - 0.401) < 1e-9
    assert abs(found[0].median - 0.001) < 1e-9


def test_a_fast_rank_that_waits_is_not_named():
    """Bug: lateness measured against the median without a floor at 0: rank 0, with less
    work in forward (an uneven split), is ahead of the median, then waits in backward and
    "falls behind" up to it there: it must not be named."""
    rows = [_row(**_with(forward=-0.09, backward=0.09)), _row(**NORMAL), _row(**NORMAL)]
    assert _named(rows) == set()


def test_noise_below_the_floor_or_the_factor_is_not_named_and_factor_0_names_nobody():
    """Bug: a straggler line at every log step for noise: 20 ms per step of a busy machine
    (under straggler_min_seconds), or a forward 30% slower (under the factor 1.5); and
    factor 0 must turn the naming off."""
    assert _named([_row(**NORMAL), _row(**_with(forward=0.02, backward=-0.02))]) == set()
    assert _named([_row(**NORMAL), _row(**_with(forward=0.03))], min_seconds=0.0) == set()
    slow = [_row(**_with(backward=2.0)), _row(**_with(forward=2.0))]
    assert _named(slow) == {(1, "forward")}
    assert _named(slow, factor=0) == set()


def test_pipeline_stages_are_compared_within_their_stage():
    """Bug: comparing across pipeline stages names the stage that finishes the schedule last
    (every interval, on a healthy run): stages do different work. Within a stage (two dp
    ranks each), a slow rank is still named, and a stage of one rank is compared with
    nobody."""
    stage0 = {"data": 0.001, "forward_backward": 1.0, "reduce": 0.01, "optimizer": 0.02}
    stage1 = {"data": 0.001, "forward_backward": 0.6, "reduce": 0.41, "optimizer": 0.02}
    rows = [_row(**stage0), _row(**stage0), _row(**stage1), _row(**stage1)]
    assert _named(rows, groups=[0, 0, 1, 1]) == set()
    rows[3] = _row(**{**stage1, "data": 0.5, "forward_backward": 0.1})  # waits less after
    assert _named(rows, groups=[0, 0, 1, 1]) == {(3, "data")}
    assert _named(rows[2:], groups=[0, 1]) == set()


def test_the_console_line_names_rank_host_pid_section_and_steps():
    """Bug: a line that does not say where the rank runs (a person must find the node)."""
    line = straggler_line(Straggler(3, "forward", 2.41, 0.82, 1.59), "node-a", 1234, 11, 20)
    assert line == ("straggler: rank 3 (host node-a, pid 1234) forward 2.410 s/step vs "
                    "median 0.820 s/step (x2.9) over steps 11-20")
