"""Save on preemption: SIGTERM or SIGUSR1 (SLURM's ``--signal=USR1@120``) to any rank asks the
run to finish its current step, write a checkpoint and exit with ``PREEMPTED_EXIT_CODE``, the
code the SLURM example requeues on. ``train.max_wallclock`` asks the same before a time limit.

SIGINT (Ctrl-C) too: a run of days stopped by hand keeps its last steps, and a terminal's
Ctrl-C and ``kill -INT`` then mean what ``scancel`` means. A second SIGINT aborts at once
(``KeyboardInterrupt``: no checkpoint, the newest complete one stays), with a line saying so;
the first one prints what will happen, since a step and a save may take minutes.

Before the first step (reading the data index, loading a checkpoint) there is nothing to save
and no step to wait for: a signal then stops the run at once (``StoppedBeforeTrainingError``, which
also interrupts a read that blocks), releasing the run folder's lock, with the same exit
protocol as a preempted run (nothing was lost: a requeue starts it again).

During training a signal reaches one process (or some): the handler only sets a flag, and the
ranks agree once per step (one small all-reduce, ``StopRequests.agree``) so that all of them
stop after the same step and write the same checkpoint.

Exit protocol with the launcher (``trainer pretrain --nproc``): torchrun's agent restarts
workers that exit non-zero (``--max-restarts``), which a preempted run must not do. So a worker
started by our launcher exits 0 after touching the file named by ``BLOOMLINE_PREEMPT_FILE``,
and the launcher, seeing the file, exits ``PREEMPTED_EXIT_CODE`` itself. A process started any
other way (alone, or by a bare torchrun) exits ``PREEMPTED_EXIT_CODE`` directly.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

import torch

from bloomline.common.errors import UserError

__all__ = ["PREEMPTED_EXIT_CODE", "PREEMPT_FILE_VARIABLE", "StopRequests",
           "StoppedBeforeTrainingError", "exit_preempted"]

# EX_TEMPFAIL (sysexits.h): "a temporary failure; the user is invited to retry"
PREEMPTED_EXIT_CODE = 75
PREEMPT_FILE_VARIABLE = "BLOOMLINE_PREEMPT_FILE"
_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)


class StoppedBeforeTrainingError(UserError):
    """A stop signal before the run's first step: nothing to save, the run ends at once."""

    exit_code = PREEMPTED_EXIT_CODE


class StopRequests:
    """Why the run should stop after this step: a signal, or the wall-clock budget."""

    def __init__(self, max_wallclock: float = 0.0) -> None:
        self.max_wallclock = max_wallclock
        self.started = time.monotonic()
        self.signal: int | None = None
        # a run's setup (``begin_setup`` .. ``begin_training``): a signal stops it at once
        self.in_setup = False
        self._previous: dict[int, object] = {}

    def install(self) -> None:
        """Catch SIGTERM, SIGUSR1 and SIGINT. Python lets only the main thread set handlers: a
        trainer run from another thread (a notebook's worker, a test harness) keeps the
        process's handlers and is stopped by its launcher instead. A SIGINT that was ignored
        when the process started (a background job of a non-interactive shell) stays
        ignored, as Python itself leaves it."""
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in _SIGNALS:
            if sig == signal.SIGINT and signal.getsignal(sig) is signal.SIG_IGN:
                continue
            self._previous[sig] = signal.signal(sig, self._on_signal)

    def uninstall(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def begin_setup(self) -> None:
        """Until ``begin_training``, a signal stops the run at once (there is no step to
        finish and nothing to save)."""
        self.in_setup = True

    def begin_training(self) -> None:
        """From the first step on, a signal asks for a checkpoint after the current step."""
        self.in_setup = False

    def _on_signal(self, signum, frame) -> None:  # noqa: ARG002 - signal handler signature
        if self.in_setup:
            # raised in the main thread wherever it is, a blocking open() or read included
            # (Python retries those after running the handler, unless it raises)
            raise StoppedBeforeTrainingError(
                f"received {signal.Signals(signum).name} before the first step: stopped "
                "without a checkpoint (nothing was trained in this process yet)")
        # only a flag: the step in progress finishes, then every rank saves together
        if signum == signal.SIGINT:
            if self.signal == signal.SIGINT:  # the second Ctrl-C: abort now
                raise KeyboardInterrupt("a second SIGINT stopped the run at once, without a "
                                        "checkpoint; the newest complete one stays (resume "
                                        "with --resume auto)")
            if os.environ.get("RANK", "0") == "0":  # once per run, not once per rank
                # one write(2), not print(): the handler may run in the middle of a print
                os.write(2, b"SIGINT: finishing this step, then saving a checkpoint and "
                            b"stopping (exit code 75); Ctrl-C again to stop at once without "
                            b"saving\n")
        if self.signal is None or signum == signal.SIGINT:
            self.signal = signum

    def local_reason(self, reserve_seconds: float) -> str:
        """This process's reason to stop now ('' for none). ``reserve_seconds``: what the next
        step and the checkpoint after it are expected to take."""
        if self.signal is not None:
            return f"received {signal.Signals(self.signal).name}"
        if self.max_wallclock > 0:
            elapsed = time.monotonic() - self.started
            if elapsed + reserve_seconds >= self.max_wallclock:
                return (f"train.max_wallclock {self.max_wallclock:g} s: {elapsed:.0f} s elapsed, "
                        f"the next step and a checkpoint need ~{reserve_seconds:.0f} s")
        return ""

    def agree(self, flags: list[float], group=None) -> list[float]:
        """The element-wise max of ``flags`` over all ranks (one all-reduce): any rank's stop
        request (or spike finding) becomes everyone's."""
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
            return flags
        backend = dist.get_backend(group)
        device = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" \
            else torch.device("cpu")
        values = torch.tensor(flags, dtype=torch.float64, device=device)
        dist.all_reduce(values, op=dist.ReduceOp.MAX, group=group)
        return values.tolist()


def exit_preempted() -> None:
    """End the process after the preemption checkpoint (see the module docstring)."""
    marker = os.environ.get(PREEMPT_FILE_VARIABLE)
    sys.stdout.flush()
    if marker:
        with open(marker, "a"):
            pass
        raise SystemExit(0)
    raise SystemExit(PREEMPTED_EXIT_CODE)
