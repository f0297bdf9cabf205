"""Launching: ``trainer pretrain --nproc N`` starts N ranks through torchrun's launcher, trains
as one process would, writes logs and checkpoints once; a rank's error ends every rank with
one line and a non-zero exit instead of a hang.

Run as a module (``python -m test_parallel_launch``), this file is also the probe the error
test launches: rank 1 fails after the process group is up while rank 0 waits for it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).parent


def _env() -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(TESTS), *filter(None, [os.environ.get("PYTHONPATH")])]))
    env.pop("LOGLEVEL", None)
    return env


def _trainer(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bloomline.trainer", *args], env=_env(),
                          capture_output=True, text=True, timeout=timeout)


def test_a_bad_layout_ends_every_rank_with_one_line():
    """Bug: a config error raised on every rank prints N tracebacks and torchrun's failure
    table, or leaves the launcher waiting: the run must exit non-zero with the one message."""
    done = _trainer("pretrain", "--nproc", "2", "parallel.tensor_parallel=3", timeout=120)
    assert done.returncode == 1, done.stderr
    lines = done.stderr.strip().splitlines()
    assert lines == ["error: world size 2 is not divisible by parallel.tensor_parallel 3 x "
                     "parallel.pipeline_parallel 1"], done.stderr


def test_an_error_on_one_rank_stops_the_rank_waiting_for_it():
    """Bug: rank 1 raises a UserError after the process group is up while rank 0 waits in a
    collective for it: without the launcher stopping the survivors the run hangs forever (the
    timeout fails the test); the one-line message must be rank 1's."""
    done = subprocess.run([sys.executable, "-m", "test_parallel_launch", "launch"],
                          env=_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 3, done.stderr
    assert done.stderr.strip().splitlines()[-1] == "error: rank 1 has no data for you", \
        done.stderr


def test_multi_node_options_need_a_rendezvous_and_nproc():
    """Bug: --nnodes without a rendezvous endpoint starts a job that waits forever for the
    other nodes, or --nnodes without --nproc is silently ignored."""
    done = _trainer("pretrain", "--nproc", "2", "--nnodes", "2", timeout=60)
    assert done.returncode == 1
    assert done.stderr.startswith("error: --nnodes 2 needs --rdzv-endpoint HOST:PORT")
    done = _trainer("pretrain", "--nnodes", "2", timeout=60)
    assert done.returncode == 1
    assert done.stderr.startswith("error: --nnodes and --rdzv-endpoint go with --nproc")


# -- the probe: ``python -m test_parallel_launch launch|rank`` --------------------------------
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


def _probe(command: str) -> None:
    from bloomline.common.errors import exit_on_user_error
    from bloomline.trainer.parallel.launch import launch, report_user_errors

    if command == "launch":
        exit_on_user_error(lambda: launch(2, [], module="test_parallel_launch", command="rank"))
    else:
        exit_on_user_error(lambda: report_user_errors(_probe_rank))


if __name__ == "__main__":
    _probe(sys.argv[1])
