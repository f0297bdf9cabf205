"""Starting the processes of a run: ``trainer pretrain --nproc N`` hands the command to torch's
own launcher (torchrun's ``torch.distributed.run``), and every rank reports a ``UserError``
back to it so that the run ends with that one line.

- One node: ``trainer pretrain --nproc 4 --config ...`` is ``torchrun --standalone
  --nproc-per-node 4 -m bloomline.trainer pretrain --config ...``.
- Several nodes: the same command on every node with ``--nnodes 2 --rdzv-endpoint
  HOST:PORT`` (HOST: the first node; c10d rendezvous, as torchrun's ``--rdzv-backend c10d``).
  ``configs/slurm/pretrain.sbatch`` does it under SLURM.

A rank that fails stops the others: torchrun's agent watches its workers and terminates all of
them when one exits non-zero, so a rank left waiting in a collective for a dead peer is killed
rather than left to hang. A ``UserError`` on a rank is written into the error file torchrun
gives each worker (``TORCHELASTIC_ERROR_FILE``), and the launcher prints the first one as
``error: ...`` (once, instead of once per rank) and exits non-zero.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable, Sequence
from typing import TypeVar

from bloomline.common.errors import UserError

__all__ = ["LaunchError", "launch", "report_user_errors"]

T = TypeVar("T")

# set by ``launch`` for its workers: the launcher prints their UserErrors, so they stay quiet
_LAUNCHED = "BLOOMLINE_LAUNCHED"
_MARK = "bloomline_user_error"


class LaunchError(UserError):
    """A worker of ``launch`` failed; exits with that worker's exit code."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def report_user_errors(fn: Callable[[], T]) -> T:
    """Run ``fn`` (a rank's main); a ``UserError`` (or an OS error on a named file, which
    ``exit_on_user_error`` treats alike) is also written into torchrun's error file for this
    worker, where the launcher finds it. Re-raised for ``exit_on_user_error`` to print, except
    under ``launch``, which prints it once for all ranks."""
    try:
        return fn()
    except (UserError, OSError) as err:
        if isinstance(err, UserError):
            message, code = str(err), err.exit_code
        elif err.filename is not None:
            message, code = f"{err.filename}: {err.strerror}", 1
        else:
            raise
        error_file = os.environ.get("TORCHELASTIC_ERROR_FILE")
        if error_file:
            # torchrun's ProcessFailure reads {"message": str, "timestamp": int}
            with open(error_file, "w") as out:
                json.dump({"message": message, "timestamp": int(time.time()), _MARK: True}, out)
        if os.environ.get(_LAUNCHED) == "1":
            raise SystemExit(code) from None
        raise


def launch(nproc: int, args: Sequence[str], nnodes: int = 1, rdzv_endpoint: str = "",
           rdzv_id: str = "", module: str = "bloomline.trainer",
           command: str = "pretrain") -> None:
    """Run ``python -m MODULE COMMAND ARGS`` in ``nproc`` processes on this node through
    torchrun; with ``nnodes`` > 1 every node runs this and they meet at ``rdzv_endpoint``.
    Returns when all finished; raises ``LaunchError`` (one line) when one failed."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import get_args_parser, run

    if nproc < 1:
        raise UserError(f"--nproc {nproc}: must be at least 1")
    if nnodes < 1:
        raise UserError(f"--nnodes {nnodes}: must be at least 1")
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 or "TORCHELASTIC_RUN_ID" in os.environ:
        raise UserError("--nproc inside a torchrun worker: give either torchrun or --nproc")
    argv = ["--nproc-per-node", str(nproc), "--nnodes", str(nnodes)]
    if rdzv_endpoint:
        argv += ["--rdzv-backend", "c10d", "--rdzv-endpoint", rdzv_endpoint,
                 "--rdzv-id", rdzv_id or os.environ.get("SLURM_JOB_ID", "bloomline")]
    elif nnodes > 1:
        raise UserError(f"--nnodes {nnodes} needs --rdzv-endpoint HOST:PORT (HOST: the first "
                        "node, reachable from all)")
    else:
        argv.append("--standalone")  # a local rendezvous on a free port
    argv += ["--module", module, command, *args]
    parsed = get_args_parser().parse_args(argv)
    os.environ[_LAUNCHED] = "1"  # inherited by the workers
    _quiet_agent()
    try:
        run(parsed)
    except ChildFailedError as err:
        raise LaunchError(*_first_failure(err)) from None
    except SignalException as err:  # Ctrl-C, or SLURM's SIGTERM at the time limit
        raise LaunchError(f"stopped by {err.sigval.name}; the agent stopped every rank",
                          128 + int(err.sigval)) from None
    finally:
        os.environ.pop(_LAUNCHED, None)


def _quiet_agent() -> None:
    """The agent's log lines (the OMP_NUM_THREADS banner, "failed (exitcode: 1) local_rank: 0",
    "sending SIGTERM to ...") say less than the one failure line ``launch`` prints;
    ``LOGLEVEL=INFO`` (torchrun's variable) shows them."""
    if "LOGLEVEL" in os.environ:
        return
    for name in list(logging.Logger.manager.loggerDict):
        if name.startswith(("torch.distributed.elastic", "torch.distributed.run",
                            "torch.distributed.launcher")):
            logging.getLogger(name).setLevel(logging.CRITICAL)


def _first_failure(err) -> tuple[str, int]:
    """The earliest UserError of any rank, else the first rank's exit code or signal."""
    failures = sorted(err.failures.items(), key=lambda item: (item[1].timestamp, item[0]))
    for _rank, failure in failures:
        if isinstance(failure.error_file_data, dict) and failure.error_file_data.get(_MARK):
            return failure.message, max(failure.exitcode, 1)
    rank, failure = failures[0]
    how = (f"signal {failure.signal_name()}" if failure.exitcode < 0
           else f"exit code {failure.exitcode}")
    return (f"rank {rank} failed ({how}); its output above says why",
            failure.exitcode if failure.exitcode > 0 else 1)
