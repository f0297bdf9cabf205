"""Fault injection for the survival tests: a crash, a signal or a hang at a chosen place of a
real run, in a real process (a training rank, a tokenize worker, a Ray task), without editing
the code under test.

The faults come from the environment, so that a test can put them into processes it starts
through the command line, torchrun, a process pool or a Ray cluster::

    BLOOMLINE_FAULTS="kill@step:step=5:rank=1:attempt=0;kill@chunk:chunk=3:once=/tmp/x/fired"

Each fault is ``ACTION@POINT`` followed by ``:KEY=VALUE`` conditions, all of which must hold:

- points: the trainer's ``step``, ``save``, ``batch``, ``grad`` and ``param`` (see
  ``bloomline.trainer.survival.faults``); dataprep's ``chunk`` (a worker about to tokenize
  chunk ``chunk``), ``shard`` (a worker that has written chunk ``chunk``'s shard, before
  closing it) and ``splice`` (the main process about to append chunk ``chunk`` to the
  outputs);
- actions: ``kill`` (SIGKILL to this process: no handler, no cleanup, like a node failure),
  ``term`` / ``usr1`` / ``int`` (SIGTERM / SIGUSR1 / SIGINT to this process: what SLURM
  sends, what Ctrl-C sends), ``hang`` (sleep forever: a stuck collective or a dead NFS
  mount), ``delay`` (sleep ``seconds``, then go on: a slow rank, a straggler), ``stop``
  (SIGSTOP to this process: frozen, as by a debugger or a paused container, until someone
  sends SIGCONT), ``exit`` (``os._exit(99)``), ``error`` (raises ``RuntimeError``: an unexpected
  exception, a bug), ``enospc`` (raises ``OSError(ENOSPC)``, as a write to a full disk does),
  and the trainer's ``spike``, ``lose`` and ``bitflip`` (carried out by the code at their
  points: see ``bloomline.trainer.survival.faults``);
- conditions: ``rank`` (the global RANK), ``attempt`` (torchrun's restart count, 0 on the first
  start), ``once=PATH`` (fires only in the first process to create PATH: a fault that a retry
  of the same work must survive), and any keyword the point passes (``step``, ``chunk``).
  ``seconds=S`` is not a condition but ``delay``'s length (default 1).

With the variable unset, each call is one dictionary lookup: the points stay in the product
code at no cost.
"""

from __future__ import annotations

import errno
import os
import signal
import time
from functools import cache

__all__ = ["active_faults", "condition_holds", "fire"]

_VARIABLE = "BLOOMLINE_FAULTS"
_ACTIONS = ("kill", "term", "usr1", "int", "hang", "delay", "stop", "exit", "error", "enospc",
            "spike", "lose", "bitflip")
# a fault's settings, which are no condition on where it fires
_SETTINGS = ("once", "seconds")
# actions the code at the point carries out itself (``fire`` leaves them alone)
_HANDLED_AT_POINT = ("spike", "lose", "bitflip")
_SIGNALS = {"term": signal.SIGTERM, "usr1": signal.SIGUSR1, "int": signal.SIGINT}


@cache
def _parse(spec: str) -> tuple[tuple[str, str, dict[str, str]], ...]:
    faults = []
    for item in filter(None, (part.strip() for part in spec.split(";"))):
        head, *conditions = item.split(":")
        action, _, point = head.partition("@")
        if action not in _ACTIONS or not point:
            raise ValueError(f"{_VARIABLE}: {item!r}: expected ACTION@POINT with ACTION one of "
                             f"{', '.join(_ACTIONS)}")
        where = dict(condition.split("=", 1) for condition in conditions)
        faults.append((action, point, where))
    return tuple(faults)


def active_faults() -> tuple[tuple[str, str, dict[str, str]], ...]:
    """(action, point, conditions) of every configured fault."""
    spec = os.environ.get(_VARIABLE)
    return _parse(spec) if spec else ()


def _first_to_claim(path: str) -> bool:
    try:
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True


def condition_holds(where: dict[str, str], context: dict) -> bool:
    """Whether every condition of a fault holds here (``once`` is checked, not claimed)."""
    here = {"rank": os.environ.get("RANK", "0"),
            "attempt": os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"),
            **{key: str(value) for key, value in context.items()}}
    return all(here.get(key) == value for key, value in where.items() if key not in _SETTINGS)


def fire(point: str, **context) -> None:
    """Carry out the faults configured for ``point`` whose conditions hold here."""
    for action, at, where in active_faults():
        if at != point or action in _HANDLED_AT_POINT or not condition_holds(where, context):
            continue
        if "once" in where and not _first_to_claim(where["once"]):
            continue
        # one write(2): processes share the pipe, and the test reads which fault fired
        os.write(2, f"fault: {action}@{point} {context}\n".encode())
        if action == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        elif action in _SIGNALS:
            os.kill(os.getpid(), _SIGNALS[action])
        elif action == "delay":
            time.sleep(float(where.get("seconds", 1.0)))
        elif action == "stop":
            os.kill(os.getpid(), signal.SIGSTOP)
        elif action == "hang":
            while True:
                time.sleep(3600)
        elif action == "exit":
            os._exit(99)
        elif action == "error":
            raise RuntimeError(f"injected fault: error@{point} {context}")
        elif action == "enospc":
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
