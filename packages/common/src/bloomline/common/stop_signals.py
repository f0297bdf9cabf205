"""Ctrl-C and SIGTERM as exceptions, so that a command stopped by either removes what it had
half-written (its ``finally`` blocks run) and exits with one line.

Python raises ``KeyboardInterrupt`` on SIGINT but dies silently on SIGTERM (SLURM's
``scancel``, a time limit, ``kill``), skipping every cleanup. Inside :class:`StopSignals`,
SIGTERM raises :class:`Terminated` instead; the command turns it into :class:`StoppedError`
(exit 143, the shell's code for a process ended by SIGTERM).
"""

from __future__ import annotations

import signal
import threading

from bloomline.common.errors import UserError

__all__ = ["StopSignals", "StoppedError", "Terminated"]


class Terminated(BaseException):
    """SIGTERM, raised in the main thread as Ctrl-C raises KeyboardInterrupt (a BaseException,
    which ``except Exception`` lets pass, as it does KeyboardInterrupt)."""


class StoppedError(UserError):
    """A command stopped by SIGTERM after removing its partial outputs."""

    exit_code = 128 + signal.SIGTERM


class StopSignals:
    """SIGINT -> KeyboardInterrupt and SIGTERM -> :class:`Terminated` in the main thread,
    once: later signals are ignored, so that the cleanup they started (or the finishing of a
    command past its point of no return, :meth:`hold`) is not cut short. Installed only where
    the handlers are Python's defaults (an application's own are left alone) and only in the
    main thread (the only one that can)."""

    def __init__(self) -> None:
        self.received: int | None = None
        self._holding = False
        self._previous: dict[int, object] = {}

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            for signum, default in ((signal.SIGINT, signal.default_int_handler),
                                    (signal.SIGTERM, signal.SIG_DFL)):
                if signal.getsignal(signum) is default:
                    self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def _handle(self, signum: int, frame) -> None:  # noqa: ARG002 - a signal handler's signature
        if self.received is not None or self._holding:
            return  # stopping (or finishing) already
        self.received = signum
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        raise Terminated(signum)

    def hold(self) -> None:
        """From now on a signal no longer stops the command (it is cleaning up or finishing)."""
        self._holding = True

    def __exit__(self, *exc_info) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
