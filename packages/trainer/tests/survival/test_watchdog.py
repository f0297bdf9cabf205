"""The hang watchdog leaves a report only where something hung: not after a save called outside
a run, not as a run's leftover once the run starts again after its process was killed; a
real report (the timer fired) is kept. The hang itself, through the command line and two ranks,
is ``test_run_survival.py``'s test."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from trainer_fixtures import tiny_config

from bloomline.trainer.loop import Trainer
from bloomline.trainer.survival.watchdog import Watchdog


def _in_a_process(run: Path, body: str) -> subprocess.CompletedProcess:
    """Run ``body`` in a fresh interpreter with ``w``, a started watchdog of ``run``'s rank 0
    (a process of its own: the watchdog's timer ends it, or it kills itself)."""
    code = ("import os, signal, time\n"
            "from bloomline.trainer.survival.watchdog import Watchdog\n"
            f"w = Watchdog({str(run)!r}, 0, factor=20.0, floor_seconds=600.0, "
            "startup_seconds=600.0)\n"
            "w.start()\n" + body)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)


def test_a_save_outside_a_run_leaves_no_hang_report(corpus, tmp_path):
    """Bug: ``Trainer.save()`` called outside ``Trainer.run`` (a script or test that builds a
    trainer to write a checkpoint, e.g. of ``checkpoint.init_from``'s weights) armed the
    watchdog, whose file only the run's end removes: RUN/watchdog/rank_0.txt was left saying
    "checkpoint of step 0 took more than 1800 s" although nothing hung (and the process kept
    an armed exit timer)."""
    run = tmp_path / "run"
    Trainer(tiny_config(corpus, run), log=lambda *_: None).save()
    assert (run / "checkpoints").is_dir()
    assert not (run / "watchdog").exists(), list((run / "watchdog").iterdir())


@pytest.mark.slow
def test_a_killed_process_leaves_no_hang_report_and_a_real_one_is_kept(tmp_path):
    """Bug: a process killed while a step was timed (SIGKILL, the OOM killer, torchrun ending
    the other ranks) left RUN/watchdog/rank_R.txt claiming the step "took more than 600 s",
    and the next start kept it aside as an earlier hang report. Its header must claim no hang,
    the next start must remove it, and a report whose timer did fire must still be kept."""
    run = tmp_path / "run"
    report = run / "watchdog" / "rank_0.txt"
    killed = _in_a_process(run, "w.arm('step 3')\nos.kill(os.getpid(), signal.SIGKILL)\n")
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    leftover = report.read_text()
    assert "nothing hung" in leftover and "took more than" not in leftover, leftover
    Watchdog(run, 0, 20.0, 600.0, 600.0).start()
    assert not report.exists()

    hung = _in_a_process(run, "w.arm('step 4', seconds=1.0)\ntime.sleep(60)\n")
    assert hung.returncode == 1, hung.stderr
    fired = report.read_text()
    assert fired.startswith("watchdog: timing step 4 with a limit of 1 s"), fired
    assert "Timeout (0:00:01)!" in fired and "in <module>" in fired, fired
    again = Watchdog(run, 0, 20.0, 600.0, 600.0)
    again.start()
    kept = [p for p in report.parent.iterdir() if p.name.startswith("rank_0-")]
    assert [p.read_text() for p in kept] == [fired]
    assert not report.exists()
    again.arm("step 1")
    again.close()  # a normal end: its own file goes, the earlier report stays
    assert sorted(os.listdir(report.parent)) == [kept[0].name]

