"""Starting the processes of a run: ``trainer pretrain --nproc N`` hands the command to torch's
own launcher (torchrun's ``torch.distributed.run``), and every rank reports a ``UserError``
back to it so that the run ends with that one line.

- One node: ``trainer pretrain --nproc 4 --config ...`` is ``torchrun --standalone
  --nproc-per-node 4 -m bloomline.trainer pretrain --config ...``.
- Several nodes: the same command on every node with ``--nnodes 2 --rdzv-endpoint
  HOST:PORT`` (HOST: the first node; c10d rendezvous, as torchrun's ``--rdzv-backend c10d``;
  the rendezvous id is ``$SLURM_JOB_ID`` under SLURM). ``configs/slurm/pretrain.sbatch`` does
  it under SLURM.

A rank that fails stops the others: torchrun's agent watches its workers and terminates all of
them when one exits non-zero, so a rank left waiting in a collective for a dead peer is killed
rather than left to hang. A ``UserError`` on a rank is written into the error file torchrun
gives each worker (``TORCHELASTIC_ERROR_FILE``), and the launcher prints the first one as
``error: ...`` (once, instead of once per rank) and exits non-zero.

Surviving a dead rank: ``--max-restarts N`` is torchrun's own: after a failure the agent stops
every rank (SIGTERM, then SIGKILL after 30 s), meets the other nodes again and starts them all
anew, up to N times; the new ranks resume from the run's newest complete checkpoint
(``checkpoint.resume=auto``). Only when the restarts are spent does the run fail.

Restarts are for failures that a new start can get past (a killed rank, a lost GPU, a flaky
node), not for ones it would meet again at once, N times over (each with a rendezvous and a
checkpoint load) before failing with the same line. The agent cannot tell them apart; our
workers say which is which in the error file, and ``_RestartPolicy`` (wrapping the agent's
monitor, as torch's own D-state check does) ends the restarts when a rank failed with:

- a ``UserError`` (or an OS error on a named file, which is reported alike): a problem in the
  input or the machine's state the user controls (a config, a corpus, a full disk, a run
  folder in use), which the same command meets again; the run ends with its line;
- any other exception that the previous attempt raised too (same type, message and place):
  it will recur. A first one is restarted (torch cannot tell a bug from a device error that
  surfaces as a RuntimeError); a death by signal (SIGKILL, the OOM killer) always is;
- anything, once the launcher has forwarded a stop (SIGUSR1, Ctrl-C): the run was asked to
  stop, and a rank that had not yet installed its handlers died of the signal.

Preemption (exit codes: 0 done, 75 saved and stopped, to be requeued, anything else failed):

- ``BLOOMLINE_PREEMPT_FILE``: a worker that stopped to be continued (a signal, or
  ``train.max_wallclock``) exits 0 after touching this file (``preemption.exit_preempted``);
  a non-zero exit would make the agent restart it. Seeing the file, the launcher exits 75.
- SIGUSR1 (SLURM's ``--signal=USR1@120``) to the launcher is forwarded to every worker, which
  finishes its step, saves with the others and exits; the agent keeps watching meanwhile, with
  no time limit. Needed because torchrun starts each worker in a session of its own (so a
  signal to the launcher's process group misses them) and does not handle SIGUSR1 itself.
- SIGINT (Ctrl-C) to the launcher: forwarded like SIGUSR1 (every worker saves after its step
  and stops; no time limit); a second SIGINT ends the run at once: the agent sends the
  workers SIGINT again (theirs: stop now, without saving) and SIGKILLs what is left 30 s
  later.
- SIGTERM to the launcher: torchrun's agent sends the same signal to every worker and SIGKILLs
  those still running 30 s later (``TORCH_ELASTIC_SHUTDOWN_TIMEOUT``): a worker saves within
  that time or not at all. For big models ask the scheduler for SIGUSR1 early instead.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

from bloomline.common.errors import UserError

__all__ = ["LaunchError", "launch", "report_user_errors"]

T = TypeVar("T")

# set by ``launch`` for its workers: the launcher prints their UserErrors, so they stay quiet
_LAUNCHED = "BLOOMLINE_LAUNCHED"
_MARK = "bloomline_user_error"
# in the error file of a rank that failed with another exception: what identifies it
_SIGNATURE = "bloomline_exception"
# the stop signals the launcher has forwarded to its workers (SIGUSR1, SIGINT)
_STOP_FORWARDED: list[int] = []
_SHARE_STORE_OFF = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"


class LaunchError(UserError):
    """A worker of ``launch`` failed (exits with that worker's exit code), or the run was
    preempted (exits ``PREEMPTED_EXIT_CODE``)."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def report_user_errors(fn: Callable[[], T]) -> T:
    """Run ``fn`` (a rank's main); a ``UserError`` (or an OS error on a named file, which
    ``exit_on_user_error`` treats alike) is also written into torchrun's error file for this
    worker, where the launcher finds it. Re-raised for ``exit_on_user_error`` to print, except
    under ``launch``, which prints it once for all ranks. Any other exception keeps its
    traceback; the error file gets its signature (type, message, place), by which the
    launcher tells an error that recurs at every restart (module docstring)."""
    try:
        return fn()
    except Exception as err:
        if isinstance(err, UserError):
            message, code = str(err), err.exit_code
        elif isinstance(err, OSError) and err.filename is not None:
            message, code = f"{err.filename}: {err.strerror}", 1
        else:
            _write_error_file({"message": _signature(err), _SIGNATURE: _signature(err)})
            raise
        _write_error_file({"message": message, _MARK: True})
        if os.environ.get(_LAUNCHED) == "1":
            raise SystemExit(code) from None
        raise


def _signature(err: BaseException) -> str:
    """``Type: first line of the message (file:line)``, the place being where it was raised."""
    frames = traceback.extract_tb(err.__traceback__)
    where = f" ({Path(frames[-1].filename).name}:{frames[-1].lineno})" if frames else ""
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0] if text else ''}{where}"


def _write_error_file(record: dict) -> None:
    error_file = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if error_file:
        # torchrun's ProcessFailure reads {"message": str, "timestamp": int}
        with open(error_file, "w") as out:
            json.dump({**record, "timestamp": int(time.time())}, out)


def launch(nproc: int, args: Sequence[str], nnodes: int = 1, rdzv_endpoint: str = "",
           rdzv_id: str = "", module: str = "bloomline.trainer",
           command: str = "pretrain", max_restarts: int = 0) -> None:
    """Run ``python -m MODULE COMMAND ARGS`` in ``nproc`` processes on this node through
    torchrun; with ``nnodes`` > 1 every node runs this and they meet at ``rdzv_endpoint``.
    After a failure all of them are restarted, up to ``max_restarts`` times.

    Returns when all finished; raises ``LaunchError`` (one line) when one failed, or with
    ``PREEMPTED_EXIT_CODE`` when the workers stopped to be continued (see the module
    docstring). Call it last in a process: it leaves SIGTERM, SIGINT, SIGHUP and SIGUSR1
    ignored, so that a late signal cannot replace the exit code it decided."""
    # torch's elastic agent and the preemption module (which imports torch) load here: the
    # launcher's module is imported by the CLI before it knows that it will launch
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import get_args_parser, run

    from bloomline.trainer.survival.preemption import PREEMPT_FILE_VARIABLE, PREEMPTED_EXIT_CODE

    if nproc < 1:
        raise UserError(f"--nproc {nproc}: must be at least 1")
    if nnodes < 1:
        raise UserError(f"--nnodes {nnodes}: must be at least 1")
    if max_restarts < 0:
        raise UserError(f"--max-restarts {max_restarts}: must be 0 or more")
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 or "TORCHELASTIC_RUN_ID" in os.environ:
        raise UserError("--nproc inside a torchrun worker: give either torchrun or --nproc")
    # torchrun's --monitor-interval (how often the agent polls its workers) is 0.1 s by default
    # in torch 2.13 (run.py), nothing next to the seconds a restart takes (new processes, a
    # rendezvous, a checkpoint load): the default stays. The signals that end the run are
    # torchrun's defaults but SIGINT (the launcher forwards a first one: _Interrupt), named so
    # that a PET_SIGNALS_TO_HANDLE with SIGUSR1 in it cannot turn the forwarding below into a
    # shutdown that SIGKILLs the savers after 30 s.
    argv = ["--nproc-per-node", str(nproc), "--nnodes", str(nnodes),
            "--max-restarts", str(max_restarts),
            "--signals-to-handle", "SIGTERM,SIGHUP,SIGQUIT"]
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
    # node-local, fresh for this launch: a file left by an earlier run must not read as "saved"
    marker_dir = Path(tempfile.mkdtemp(prefix="bloomline-launch-"))
    marker = marker_dir / "preempted"
    saved_env = {name: os.environ.get(name)
                 for name in (_LAUNCHED, PREEMPT_FILE_VARIABLE, _SHARE_STORE_OFF)}
    os.environ[_LAUNCHED] = "1"  # inherited by the workers, as is the next one
    os.environ[PREEMPT_FILE_VARIABLE] = str(marker)
    if max_restarts:
        # torch 2.13's c10d rendezvous lends its TCPStore to the workers and keeps the same
        # one across restarts (dynamic_rendezvous.py creates it on the first round only),
        # while init_process_group adds no per-attempt prefix ("a new TCPStore for every
        # retry", rendezvous.py): restarted ranks read the dead ranks' addresses and gloo
        # times out connecting to them (pytorch#135712). Unshared, rank 0 hosts a fresh store
        # on a fresh port at every restart. Read by the agent in this process.
        os.environ.setdefault(_SHARE_STORE_OFF, "1")
    _quiet_agent()
    _STOP_FORWARDED.clear()
    _set_handler(signal.SIGUSR1, _forward_to_workers)
    _set_handler(signal.SIGINT, _Interrupt())
    policy = _RestartPolicy()
    failure: tuple[str, int] | None = None
    try:
        try:
            with policy.installed():
                run(parsed)
        except ChildFailedError as err:
            _ignore_late_signals()
            failure = _first_failure(err, policy.restarts if policy.attempts else max_restarts,
                                     policy.reason)
        except SignalException as err:  # a second Ctrl-C, or SLURM's SIGTERM at the limit
            _ignore_late_signals()
            failure = (f"stopped by {err.sigval.name}; the agent stopped every rank",
                       128 + int(err.sigval))
        else:
            _ignore_late_signals()
        # touched only after the checkpoint is complete (preemption.exit_preempted), so a
        # rank failing after it (or the agent's SIGTERM) does not undo it
        preempted = marker.exists()
    finally:
        for name, value in saved_env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        shutil.rmtree(marker_dir, ignore_errors=True)
    if preempted:
        raise LaunchError(f"preempted: the run saved a checkpoint and stopped; exit code "
                          f"{PREEMPTED_EXIT_CODE} asks the scheduler to requeue it (it resumes "
                          "from that checkpoint with --resume auto)", PREEMPTED_EXIT_CODE)
    if failure is not None:
        raise LaunchError(*failure)


def _set_handler(signum: int, handler) -> None:
    """``signal.signal``, which Python allows only in the main thread (elsewhere torchrun warns
    that it cannot stop its workers on a signal either)."""
    import threading

    if threading.current_thread() is threading.main_thread():
        signal.signal(signum, handler)


def _ignore_late_signals() -> None:
    """Once the workers are gone, the outcome is decided: a SIGTERM now (SLURM's
    ``--kill-on-bad-exit`` when another node's launcher exited 75 a moment earlier, which srun
    would report over that 75) must neither kill the launcher nor raise torchrun's
    ``SignalException`` out of the code choosing the exit code."""
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1):
        _set_handler(signum, signal.SIG_IGN)


def _forward_to_workers(signum: int, frame) -> None:  # noqa: ARG001 - signal handler signature
    """SIGUSR1 to the launcher goes to each worker process: torchrun starts every worker with
    ``start_new_session=True``, so signals to the launcher's process group never reach them,
    and its agent handles only the signals that end the run. To the worker alone (``os.kill``),
    not its process group as torchrun's SIGTERM goes: data-loader worker processes there would
    die of an unhandled SIGUSR1. Receiving it twice (SLURM also signals every process of the
    step directly) is harmless: the workers' handler only sets a flag."""
    _STOP_FORWARDED.append(signum)  # a rank that fails from now on is not restarted
    pids = _worker_pids()
    for pid in pids:
        try:
            os.kill(pid, signum)
        except ProcessLookupError:  # exited meanwhile
            pass
    # one write(2), not print(): a handler may run in the middle of another print
    os.write(2, f"launcher: {signal.Signals(signum).name} forwarded to {len(pids)} worker "
                f"process(es); they save after this step and stop\n".encode())


class _Interrupt:
    """The launcher's SIGINT (Ctrl-C) handler: the first is forwarded to the workers like
    SIGUSR1 (they save and stop); the second ends the run through torchrun's own shutdown
    (``SignalException``), which sends the workers SIGINT again: their second, on which they
    stop at once."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self, signum: int, frame) -> None:
        from torch.distributed.elastic.multiprocessing.api import SignalException

        self.count += 1
        if self.count > 1:
            raise SignalException(f"Process {os.getpid()} got signal: SIGINT (second)",
                                  sigval=signal.SIGINT)
        _forward_to_workers(signum, frame)
        os.write(2, b"launcher: Ctrl-C again to stop every rank at once, without saving\n")


class _RestartPolicy:
    """No restart after a failure that a restart would meet again (module docstring): wraps
    torchrun's ``LocalElasticAgent._monitor_workers`` while installed, and on a failed
    attempt whose error files say so sets the agent's remaining restarts to 0, as torch's own
    check for workers stuck in D-state does. ``restarts`` counts the restarts made, ``reason``
    says why they ended early ('' if they did not)."""

    def __init__(self) -> None:
        self.restarts = 0
        self.reason = ""
        self.attempts = 0
        self._previous: set[str] = set()

    @contextlib.contextmanager
    def installed(self):
        try:
            from torch.distributed.elastic.agent.server.api import WorkerState
            from torch.distributed.elastic.agent.server.local_elastic_agent import (
                LocalElasticAgent,
            )
        except ImportError:  # another torch: its restarts as they are
            yield
            return
        original = LocalElasticAgent._monitor_workers
        policy = self

        def monitor(agent, worker_group):
            result = original(agent, worker_group)
            if result.state == WorkerState.FAILED:
                policy.attempts += 1
                policy.restarts = policy.attempts - 1
                reason = policy._judge(result.failures)
                if reason and getattr(agent, "_remaining_restarts", 0) > 0:
                    agent._remaining_restarts = 0
                    policy.reason = reason
            return result

        LocalElasticAgent._monitor_workers = monitor
        try:
            yield
        finally:
            LocalElasticAgent._monitor_workers = original

    def _judge(self, failures: dict) -> str:
        """Why the attempt that failed with ``failures`` must not be restarted ('' if it may
        be); remembers its exceptions for the next attempt's judgement."""
        data = [f.error_file_data for f in failures.values()
                if isinstance(getattr(f, "error_file_data", None), dict)]
        signatures = {d[_SIGNATURE] for d in data if isinstance(d.get(_SIGNATURE), str)}
        recurring = sorted(signatures & self._previous)
        self._previous = signatures
        if _STOP_FORWARDED:  # a rank that had not installed its handlers yet died of it
            return (f"the run was asked to stop ({signal.Signals(_STOP_FORWARDED[0]).name} "
                    "forwarded to the ranks)")
        if any(d.get(_MARK) for d in data):
            return "an error in what the run was given, which a restart meets again"
        if recurring:
            return f"the previous attempt failed the same way ({recurring[0]})"
        return ""


def _worker_pids() -> list[int]:
    """The launcher's worker processes: its children that lead a process group of their own
    (torchrun's ``start_new_session``), found in /proc (Linux; elsewhere none)."""
    me, pids = os.getpid(), []
    try:
        entries = [entry.name for entry in os.scandir("/proc") if entry.name.isdigit()]
    except OSError:
        return []
    for name in entries:
        try:
            with open(f"/proc/{name}/stat") as stat:
                # "pid (comm) state ppid pgrp ...": comm may hold spaces and parentheses
                fields = stat.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == me and int(fields[2]) == int(name):
            pids.append(int(name))
    return pids


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


def _first_failure(err, max_restarts: int = 0, stopped_early: str = "") -> tuple[str, int]:
    """The earliest UserError of any rank, else the first rank's exit code or signal. The
    agent records the ranks it SIGTERMed after the first failure as failed too, with times in
    whole seconds: within a second, a rank ended by the agent's SIGTERM comes last.
    ``max_restarts``: the restarts made; ``stopped_early``: why no more were made, when the
    restart policy ended them."""
    failures = sorted(err.failures.items(), key=lambda item: (
        item[1].timestamp, item[1].exitcode == -signal.SIGTERM, item[0]))
    for _rank, failure in failures:
        if isinstance(failure.error_file_data, dict) and failure.error_file_data.get(_MARK):
            return failure.message, max(failure.exitcode, 1)
    rank, failure = failures[0]
    how = (f"signal {failure.signal_name()}" if failure.exitcode < 0
           else f"exit code {failure.exitcode}")
    spent = (f" after {max_restarts} restart{'s' if max_restarts > 1 else ''}"
             if max_restarts else "")
    if stopped_early:
        spent += f", not restarted again: {stopped_early}"
    return (f"rank {rank} failed ({how}){spent}; its output above says why",
            failure.exitcode if failure.exitcode > 0 else 1)
