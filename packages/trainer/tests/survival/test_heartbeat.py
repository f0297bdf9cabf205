"""The heartbeat's verdicts on the ranks it watches (``survival/heartbeat.py``), fed by hand:
what the store held and when, on the watcher's clock. No store, thread or process here (the
real thing, a stopped and a stuck rank of a two-rank run, is ``test_rank_health.py``)."""

from __future__ import annotations

import json

from bloomline.trainer.survival.heartbeat import Heartbeat, _Watched

SILENT = 2.0


def _beat(n: int, step: int, section: str, entries: int) -> bytes:
    return json.dumps({"n": n, "step": step, "section": section, "entries": entries,
                       "host": "node-b", "pid": 4321}).encode()


def _watcher() -> tuple[Heartbeat, list[str], list[dict]]:
    """Rank 0 watching rank 1, its lines and records collected."""
    lines: list[str] = []
    records: list[dict] = []
    heartbeat = Heartbeat(0, SILENT)
    heartbeat.report_to(lines.append, records.append)
    heartbeat._watched = [_Watched(1)]
    return heartbeat, lines, records


def test_a_silent_rank_is_named_once_and_again_when_it_answers_without_a_stuck_line():
    """Bug: a stopped rank named at every beat of the watcher, or never said to be back; or,
    once back, named "stuck" at once because its first beat still shows the place where it
    was stopped (long ago, and the others are past it)."""
    heartbeat, lines, records = _watcher()
    heartbeat.at(8, "backward", 3)  # rank 0 waits in backward
    heartbeat._judge({1: _beat(1, 8, "forward", 2)}, now=0.0)
    for now in (1.0, 2.5, 3.0, 4.0):  # no new beat: stopped at 0.0
        heartbeat._judge({1: _beat(1, 8, "forward", 2)}, now=now)
    heartbeat._judge({1: _beat(2, 8, "forward", 2)}, now=5.0)  # back, same place
    heartbeat._judge({1: _beat(3, 8, "forward", 2)}, now=5.2)
    assert [r["event"] for r in records] == ["silent", "answered"], lines
    assert lines[0] == ("watchdog: rank 1 (host node-b, pid 4321) has not answered for 2 s "
                        "(last seen in step 8, forward); the other ranks wait for it at their "
                        "next collective")
    assert lines[1] == ("watchdog: rank 1 (host node-b, pid 4321) answers again after 5 s "
                        "(now in step 8, forward)")


def test_a_rank_is_stuck_only_when_another_has_been_past_it_as_long():
    """Bug: a rank whose newest beat still shows it in a collective the watcher has just
    left (the heartbeat's lag) is named "stuck" when its place had not changed for a while
    (a long wait in that collective): the watcher being past it for a moment proves
    nothing. Past it for silent_seconds, it is named, once, and said to move on."""
    heartbeat, lines, records = _watcher()
    heartbeat.at(12, "backward", 3)
    heartbeat._judge({1: _beat(1, 12, "backward", 3)}, now=0.0)
    for n, now in enumerate((1.0, 2.0, 3.0, 4.0), start=2):  # both wait in backward
        heartbeat._judge({1: _beat(n, 12, "backward", 3)}, now=now)
    heartbeat.at(12, "reduce", 4)  # the watcher moved on; rank 1's next beat is late
    heartbeat._judge({1: _beat(6, 12, "backward", 3)}, now=4.5)
    assert records == [], lines
    heartbeat._judge({1: _beat(7, 12, "backward", 3)}, now=6.0)
    heartbeat._judge({1: _beat(8, 12, "backward", 3)}, now=7.0)
    assert [r["event"] for r in records] == ["stuck"], lines
    assert lines[0].startswith("watchdog: rank 1 (host node-b, pid 4321) has been in step 12, "
                               "backward for 7 s while others are past it")
    heartbeat._judge({1: _beat(9, 12, "reduce", 4)}, now=8.0)
    assert [r["event"] for r in records] == ["stuck", "moved"], lines


def test_a_rank_that_ended_its_run_is_not_named():
    """Bug: the rank that finishes first (its heartbeat stopped) is named silent while rank 0
    still writes its last checkpoint and summary."""
    heartbeat, lines, records = _watcher()
    heartbeat.at(20, "other", 0)
    heartbeat._judge({1: _beat(1, 20, "other", 0)}, now=0.0)
    heartbeat._judge({1: _beat(-1, 20, "done", 0)}, now=0.5)
    for now in (3.0, 10.0, 60.0):
        heartbeat._judge({1: _beat(-1, 20, "done", 0)}, now=now)
    assert records == [] and lines == []
