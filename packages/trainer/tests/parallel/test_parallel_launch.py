"""Launching: ``trainer pretrain --nproc N`` starts N ranks through torchrun's launcher, trains
as one process would, writes logs and checkpoints once; a rank's error ends every rank with
one line and a non-zero exit instead of a hang.

Run as a module (``python -m test_parallel_launch``), this file is also the probe the error
tests launch: rank 1 fails after the process group is up while rank 0 waits for it (``launch``),
both ranks wait until the launcher is stopped (``launch-wait``), both wait for SIGUSR1 or
SIGTERM and then stop as a preempted run does (``launch-preempt``, with one restart allowed), or
rank 1 dies on every start (``launch-die``, with one restart allowed).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).parent  # this folder (``python -m test_parallel_launch``) and above it
ROOT = TESTS.parents[3]          # the helper modules, on the PYTHONPATH of what it runs


def _env() -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(TESTS), str(TESTS.parent), *filter(None, [os.environ.get("PYTHONPATH")])]))
    env.pop("LOGLEVEL", None)
    return env


def _trainer(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bloomline.trainer", *args], env=_env(),
                          capture_output=True, text=True, timeout=timeout)


def slurm_env(tmp_path: Path, recipe: Path, **extra: str) -> dict:
    """The environment of ``configs/slurm/pretrain.sbatch`` under stand-ins: srun drops its
    options and runs the command; ``scontrol show hostnames`` prints this host and
    ``scontrol requeue JOB`` is recorded in ``tmp_path/requeued``; one node, 2 processes,
    job 4242."""
    from bloomline.trainer.parallel.local_processes import free_port

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text('#!/bin/sh\nwhile [ "${1#-}" != "$1" ]; do shift; done\n'
                                  'exec "$@"\n')
    (bin_dir / "scontrol").write_text(
        '#!/bin/sh\ncase "$1" in\n  show) echo localhost ;;\n'
        f'  requeue) echo "requeue $2" >> "{tmp_path / "requeued"}" ;;\n'
        '  *) exit 1 ;;\nesac\n')
    for tool in ("srun", "scontrol"):
        (bin_dir / tool).chmod(0o755)
    return dict(_env(), PATH=os.pathsep.join([str(bin_dir), str(Path(sys.executable).parent),
                                              os.environ["PATH"]]),
                SLURM_NNODES="1", SLURM_JOB_NODELIST="localhost", SLURM_JOB_ID="4242",
                GPUS_PER_NODE="2", PORT=str(free_port()), RECIPE=str(recipe), **extra)


def run_sbatch(env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(ROOT / "configs" / "slurm" / "pretrain.sbatch"), *args],
                          env=env, capture_output=True, text=True, timeout=300)


def _train_records(run_dir) -> list[dict]:
    lines = (Path(run_dir) / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["kind"] == "train"]


@pytest.mark.slow
def test_nproc_2_trains_like_one_process_and_writes_once(corpus, tmp_path, make_config):
    """Bug: --nproc starts ranks that each train alone (world size 1), every rank writes
    metrics.jsonl / checkpoints over the others', the arguments (--config, overrides) are not
    forwarded, or dp2 trains on other samples than one process: 5 steps at dp2 must log each
    step once, save a checkpoint both ranks wrote, and match one process's losses."""
    from bloomline.common.config_loader import to_toml
    from bloomline.trainer.loop import Trainer

    settings = {"train": {"train_samples": 20, "log_interval": 1}}
    recipe = tmp_path / "recipe.toml"
    recipe.write_text(to_toml(make_config(corpus, tmp_path / "two", **settings)))
    done = _trainer("pretrain", "--nproc", "2", "--config", str(recipe),
                    "parallel.data_parallel=2")
    assert done.returncode == 0, done.stderr
    assert "pp1 x dp2 x tp1 = 2 processes" in done.stdout
    Trainer(make_config(corpus, tmp_path / "one", **settings), log=lambda *_: None).run()
    two, one = _train_records(tmp_path / "two"), _train_records(tmp_path / "one")
    assert [r["step"] for r in two] == [1, 2, 3, 4, 5]  # once each: rank 0 writes
    for got, want in zip(two, one, strict=True):
        assert abs(got["loss"] - want["loss"]) <= 1e-5 * abs(want["loss"]), (got, want)
    checkpoint = tmp_path / "two" / "checkpoints" / "step_00000005"
    assert sorted(p.name for p in checkpoint.glob("*.distcp")) == ["__0_0.distcp",
                                                                    "__1_0.distcp"]


@pytest.mark.slow
def test_slurm_script_starts_the_launcher_with_a_rendezvous(corpus, tmp_path, make_config):
    """Bug: the SLURM example does not run (a typo in the launcher's flags, the rendezvous
    host, MAX_RESTARTS) or ignores its extra arguments, or requeues a run that finished: run
    under a stand-in srun/scontrol on one node with 2 processes, it must train and checkpoint
    at tp2, exit 0 and not requeue."""
    from bloomline.common.config_loader import to_toml

    recipe = tmp_path / "recipe.toml"
    recipe.write_text(to_toml(make_config(corpus, tmp_path / "run",
                                          train={"train_samples": 8, "log_interval": 1})))
    done = run_sbatch(slurm_env(tmp_path, recipe, MAX_RESTARTS="1"),
                      "parallel.tensor_parallel=2")
    assert done.returncode == 0, done.stderr
    assert "pp1 x dp1 x tp2 = 2 processes" in done.stdout
    assert [r["step"] for r in _train_records(tmp_path / "run")] == [1, 2]
    assert (tmp_path / "run" / "checkpoints" / "step_00000002" / ".metadata").is_file()
    assert not (tmp_path / "requeued").exists()


@pytest.mark.slow
def test_a_bad_layout_ends_every_rank_with_one_line():
    """Bug: a config error raised on every rank prints N tracebacks and torchrun's failure
    table, or leaves the launcher waiting: the run must exit non-zero with the one message."""
    done = _trainer("pretrain", "--nproc", "2", "parallel.tensor_parallel=3", timeout=120)
    assert done.returncode == 1, done.stderr
    lines = done.stderr.strip().splitlines()
    assert lines == ["error: world size 2 is not divisible by parallel.tensor_parallel 3 x "
                     "parallel.pipeline_parallel 1"], done.stderr


@pytest.mark.slow
def test_an_error_on_one_rank_stops_the_rank_waiting_for_it():
    """Bug: rank 1 raises a UserError after the process group is up while rank 0 waits in a
    collective for it: without the launcher stopping the survivors the run hangs forever (the
    timeout fails the test); the one-line message must be rank 1's."""
    done = subprocess.run([sys.executable, "-m", "test_parallel_launch", "launch"],
                          env=_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 3, done.stderr
    assert done.stderr.strip().splitlines()[-1] == "error: rank 1 has no data for you", \
        done.stderr


@pytest.mark.slow
def test_sigterm_to_the_launcher_stops_every_rank():
    """Bug: SLURM's SIGTERM at the time limit (or Ctrl-C) leaves ranks running as orphans, or
    ends the launcher with a traceback: it must stop both ranks (each waiting in a
    collective) and exit 128 + 15 with one line."""
    import signal

    launcher = subprocess.Popen([sys.executable, "-m", "test_parallel_launch", "launch-wait"],
                                env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
    try:
        pids = []
        for _ in range(2):  # both ranks waiting
            line = launcher.stdout.readline()
            if not line.startswith("rank "):
                launcher.kill()
                raise AssertionError(f"probe did not start: {line!r}\n{launcher.stderr.read()}")
            pids.append(int(line.split()[-1]))
        launcher.send_signal(signal.SIGTERM)
        _, stderr = launcher.communicate(timeout=120)
    finally:
        launcher.kill()
    assert launcher.returncode == 128 + signal.SIGTERM, stderr
    assert stderr.strip().splitlines()[-1] == (
        "error: stopped by SIGTERM; the agent stopped every rank"), stderr
    for pid in pids:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            continue
        raise AssertionError(f"rank process {pid} is still running")


def test_a_rank_reports_user_and_file_errors_to_the_launcher(tmp_path, monkeypatch):
    """Bug: a rank's error on a named file (a run folder that cannot be made) is not handed to
    the launcher, which then prints a bare "rank 0 failed" instead of the cause; or a bug's
    exception is dressed up as the user's."""
    from bloomline.common.errors import UserError
    from bloomline.trainer.parallel.launch import report_user_errors

    error_file = tmp_path / "error.json"
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(error_file))
    monkeypatch.setenv("BLOOMLINE_LAUNCHED", "1")

    def fail(error):
        def main():
            raise error
        return main

    with pytest.raises(SystemExit) as stopped:
        report_user_errors(fail(NotADirectoryError(20, "Not a directory", "/runs/x")))
    assert stopped.value.code == 1
    assert json.loads(error_file.read_text())["message"] == "/runs/x: Not a directory"
    with pytest.raises(SystemExit):
        report_user_errors(fail(UserError("data.corpus: not set")))
    assert json.loads(error_file.read_text())["message"] == "data.corpus: not set"
    error_file.unlink()
    with pytest.raises(ZeroDivisionError):
        report_user_errors(fail(ZeroDivisionError()))
    # recorded for the restart policy (its signature), not as the user's error
    recorded = json.loads(error_file.read_text())
    assert "bloomline_user_error" not in recorded, recorded
    assert recorded["bloomline_exception"].startswith("ZeroDivisionError:  (test_parallel_"), \
        recorded


@pytest.mark.slow
def test_multi_node_options_need_a_rendezvous_and_nproc():
    """Bug: --nnodes without a rendezvous endpoint starts a job that waits forever for the
    other nodes, or --nnodes without --nproc is silently ignored."""
    done = _trainer("pretrain", "--nproc", "2", "--nnodes", "2", timeout=60)
    assert done.returncode == 1
    assert done.stderr.startswith("error: --nnodes 2 needs --rdzv-endpoint HOST:PORT")
    done = _trainer("pretrain", "--nnodes", "2", timeout=60)
    assert done.returncode == 1
    assert done.stderr.startswith("error: --nnodes and --rdzv-endpoint go with --nproc")


# -- the probe: ``python -m test_parallel_launch launch[-wait|-preempt|-die]|RANKS`` ----------
def _probe_rank() -> None:
    from datetime import timedelta

    import torch.distributed as dist

    from bloomline.common.errors import UserError

    dist.init_process_group("gloo")
    if dist.get_rank() == 1:
        error = UserError("rank 1 has no data for you")
        error.exit_code = 3
        raise error
    # waits for rank 1 the way a NCCL collective does: without noticing that the peer died
    # (gloo's barrier would notice and fail by itself); the agent's store outlives rank 1
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                          is_master=False, timeout=timedelta(seconds=600))
    store.wait(["rank 1 is done"])


def _probe_wait() -> None:
    """Both ranks wait in a collective that never completes."""
    from datetime import timedelta

    import torch.distributed as dist

    dist.init_process_group("gloo")
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                          is_master=False, timeout=timedelta(seconds=600))
    # one write(2) of a whole line: the ranks share the pipe, and print() under torchrun's
    # unbuffered stdout writes the text and its newline apart, so two ranks' lines interleave
    os.write(1, f"rank {dist.get_rank()} waiting: pid {os.getpid()}\n".encode())
    store.wait(["never"])


def _probe_preempt() -> None:
    """Both ranks wait (up to a minute) for SIGUSR1 or SIGTERM, then stop as a preempted run
    does, with the worker side's own pieces: ``StopRequests`` and ``exit_preempted``."""
    import time

    from bloomline.trainer.survival.preemption import StopRequests, exit_preempted

    stops = StopRequests()
    stops.install()
    os.write(1, f"rank {os.environ['RANK']} waiting: pid {os.getpid()}\n".encode())
    deadline = time.monotonic() + 60
    while stops.signal is None:
        if time.monotonic() > deadline:
            raise SystemExit(f"rank {os.environ['RANK']}: no signal came")
        time.sleep(0.02)
    exit_preempted()


def _probe_die() -> None:
    """Rank 1 is SIGKILLed on every start (a node failure); rank 0 waits to be stopped."""
    import signal
    import time

    attempt = os.environ["TORCHELASTIC_RESTART_COUNT"]
    if os.environ["RANK"] == "1":
        os.write(1, f"rank 1 start {attempt}\n".encode())
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(120)


# launcher command: (the ranks' probe command, --max-restarts)
_LAUNCHES = {"launch": ("rank", 0), "launch-wait": ("wait", 0),
             "launch-preempt": ("preempt", 1), "launch-die": ("die", 1)}
_RANKS = {"rank": _probe_rank, "wait": _probe_wait, "preempt": _probe_preempt,
          "die": _probe_die}


def _probe(command: str) -> None:
    from bloomline.common.errors import exit_on_user_error
    from bloomline.trainer.parallel.launch import launch, report_user_errors

    if command in _LAUNCHES:
        ranks, max_restarts = _LAUNCHES[command]
        exit_on_user_error(lambda: launch(2, [], module="test_parallel_launch", command=ranks,
                                          max_restarts=max_restarts))
    else:
        exit_on_user_error(lambda: report_user_errors(_RANKS[command]))


if __name__ == "__main__":
    _probe(sys.argv[1])
