"""Stragglers and ranks that stop answering are named, in a real two-rank run
(``trainer pretrain --nproc 2``, gloo on CPU, faults injected with ``BLOOMLINE_FAULTS``): one
run, rank 1 made slow, stopped and stuck in turn, so that its start-up is paid once.

- slow: every forward of rank 1 sleeps 0.1 s (``delay@section``), so rank 0 waits for it in
  backward (the gradient reduction) at every step;
- stopped: rank 1 SIGSTOPs itself inside step 7's forward (``stop@section``: at a known place
  of a step, never after the run's end), and the test sends SIGCONT once the watchdog has
  named it: the run must then complete;
- stuck: rank 1 sleeps 4 s in step 12's data wait, beating all along, while rank 0 waits for
  it in a collective.

``watchdog.silent_seconds`` is 2 s: long enough for a step of this tiny model on a busy
machine, short enough for a test.

The pure rule (who is a straggler given the ranks' times) is ``reporting/test_stragglers.py``.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from trainer_fixtures import tiny_config, write_corpus

from bloomline.common.config_loader import to_toml

pytestmark = pytest.mark.slow

TESTS = Path(__file__).parents[1]  # the tests root: the helper modules
STEPS = 15
FAULTS = ("delay@section:section=forward:rank=1:seconds=0.1;"
          "stop@section:section=forward:step=7:rank=1;"
          "delay@section:section=data:step=12:rank=1:seconds=4")


class _Output:
    """A command's merged output, its lines collected by a thread as they come."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.proc, self.lines = proc, []
        self._arrived = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            with self._arrived:
                self.lines.append(line.rstrip("\n"))
                self._arrived.notify_all()
        with self._arrived:
            self._arrived.notify_all()

    def wait_for(self, pattern: str, timeout: float = 120) -> re.Match:
        """The first line matching ``pattern``; fails if the output ends or the timeout
        passes first."""
        deadline = time.monotonic() + timeout
        with self._arrived:
            while True:
                for line in self.lines:
                    if found := re.search(pattern, line):
                        return found
                left = deadline - time.monotonic()
                if left <= 0 or not self._reader.is_alive():
                    self.proc.kill()
                    raise AssertionError(f"no line matching {pattern!r}:\n" + self.text)
                self._arrived.wait(left)

    @property
    def text(self) -> str:
        return "\n".join(self.lines)


@pytest.fixture(scope="module")
def health_run(tmp_path_factory):
    """The run (its folder and output), with rank 1 continued by the test after its stop;
    the pid the watchdog named and that process's state when it was named."""
    root = tmp_path_factory.mktemp("rank_health")
    corpus = write_corpus(root / "corpus")
    run_dir = root / "run"
    recipe = root / "recipe.toml"
    recipe.write_text(to_toml(tiny_config(
        corpus, run_dir, train={"train_samples": 4 * STEPS, "log_interval": 5},
        watchdog={"silent_seconds": 2.0})))
    env = dict(os.environ, BLOOMLINE_FAULTS=FAULTS, PYTHONPATH=os.pathsep.join(
        [str(TESTS), *filter(None, [os.environ.get("PYTHONPATH")])]))
    proc = subprocess.Popen([sys.executable, "-m", "bloomline.trainer", "pretrain", "--nproc",
                             "2", "--config", str(recipe)], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    out = _Output(proc)
    try:
        named = out.wait_for(r"watchdog: rank 1 \(host \S+, pid (\d+)\) has not answered")
        pid = int(named.group(1))
        with open(f"/proc/{pid}/stat") as fh:  # the named pid is the stopped rank
            state = fh.read().rsplit(")", 1)[1].split()[0]
        os.kill(pid, signal.SIGCONT)
        code = proc.wait(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
    out._reader.join(timeout=30)
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {"code": code, "out": out.text, "pid": pid, "state": state, "records": records}


def test_the_slow_rank_is_named_with_its_section_and_the_waiting_rank_never(health_run):
    """Bug: the rank that waits is named with the one it waits for (rank 0's backward grows by
    rank 1's delay: the gradient reduction waits there), or the slow rank is not named, or
    named without its host and pid. Every interval must name rank 1's forward, on the console
    and in metrics.jsonl, and nothing ever names rank 0."""
    assert health_run["code"] == 0, health_run["out"]
    named = [r for r in health_run["records"] if r["kind"] == "straggler"]
    assert {r["rank"] for r in named} == {1}, named
    forward = [r for r in named if r["section"] == "forward"]
    # the process's first step (its start-up) is left out
    assert [r["steps"] for r in forward] == [[2, 5], [6, 10], [11, 15]], named
    assert all(r["seconds"] >= 0.1 and r["seconds"] > 1.5 * r["median"] for r in forward)
    # the 4 s data wait of step 12 is rank 1's too; nothing else of it is named
    assert {r["section"] for r in named} <= {"forward", "data"}, named
    assert any(r["section"] == "data" and r["steps"] == [11, 15] for r in named), named
    lines = [line for line in health_run["out"].splitlines() if line.startswith("straggler:")]
    assert len(lines) == len(named) and all(
        re.match(rf"straggler: rank 1 \(host \S+, pid {health_run['pid']}\) (forward|data) "
                 r"[\d.]+ s/step vs median [\d.]+ s/step( \(x[\d.]+\))? over steps \d+-\d+$",
                 line) for line in lines), lines
    # the process's first step (its start-up) has no section times, though it is logged
    train = [r for r in health_run["records"] if r["kind"] == "train" and r["step"] > 1]
    assert all(r["time_forward_max_s"] >= 0.1 > r["time_forward_s"] for r in train), train


def test_a_stopped_rank_is_named_by_the_watchdog_and_the_run_completes(health_run):
    """Bug: a SIGSTOPped rank leaves every other rank waiting in a collective without a word
    until the collective's timeout (30 min on gloo) or the hang watchdog ends the run: rank 0
    must name it (host, pid: the process that is stopped) within seconds, say when it answers
    again, and the run complete once it does."""
    assert health_run["state"] == "T"  # stopped: the pid named is the rank that was
    assert health_run["code"] == 0, health_run["out"]
    events = [(r["event"], r["rank"], r["pid"]) for r in health_run["records"]
              if r["kind"] == "watchdog"]
    pid = health_run["pid"]
    assert events[:2] == [("silent", 1, pid), ("answered", 1, pid)], events
    assert re.search(rf"watchdog: rank 1 \(host \S+, pid {pid}\) answers again after \d+ s",
                     health_run["out"]), health_run["out"]


def test_a_rank_stuck_outside_a_collective_is_named_while_it_still_beats(health_run):
    """Bug: a rank whose process runs (its heartbeat goes on) but stays in one place, its data
    wait, while the other waits for it in a collective, is named by nothing: it must be named
    as stuck in step 12's data wait, once, and said to move on."""
    events = [(r["event"], r["rank"]) for r in health_run["records"] if r["kind"] == "watchdog"]
    assert events[2:] == [("stuck", 1), ("moved", 1)], events
    stuck = [r for r in health_run["records"] if r.get("event") == "stuck"][0]
    assert (stuck["step"], stuck["section"]) == (12, "data"), stuck
    assert re.search(r"watchdog: rank 1 \(host \S+, pid \d+\) has been in step 12, data for "
                     r"\d+ s while others are past it", health_run["out"]), health_run["out"]
