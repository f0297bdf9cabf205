"""User-facing errors: one line that names the file, line or field, and a non-zero exit.

Library code raises :class:`UserError` (or a subclass) for anything the user can fix; the CLIs
catch it at the top and print ``error: <message>`` without a traceback. Anything else is a
bug in bloomline and keeps its traceback.
"""

from __future__ import annotations

import errno
import sys
from collections.abc import Callable
from typing import TypeVar

__all__ = ["UserError", "exit_on_user_error"]

# errors of the machine's state, not of bloomline, even where no file is named (a write that
# fills the disk reports ENOSPC without the file's name)
_ENVIRONMENT_ERRNOS = (errno.ENOSPC, errno.EDQUOT)

T = TypeVar("T")


class UserError(Exception):
    """An error caused by input the user controls (a file, a flag, a config field).

    The message must be one line that says where (file:line, field name) and what to do.
    """

    exit_code = 1


def exit_on_user_error(fn: Callable[[], T]) -> T:
    """Run ``fn``; on :class:`UserError` print ``error: ...`` to stderr and exit non-zero.

    Ctrl-C exits with 130 (the shell convention) and a short message instead of a traceback
    (``interrupted``, or ``interrupted: WHY`` when the interrupt says what it left; Typer
    turns a KeyboardInterrupt into a silent exit 130, whose cause is looked up here). An
    operating-system error on a named file (permission denied, disk full) is the user's
    environment, not a bug: it gets the same one-line treatment, and so does a full disk or
    quota that names no file.
    """
    try:
        return fn()
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(err.exit_code) from None
    except OSError as err:
        if err.filename is not None:
            print(f"error: {err.filename}: {err.strerror}", file=sys.stderr)
        elif err.errno in _ENVIRONMENT_ERRNOS:
            print(f"error: {err.strerror or err}", file=sys.stderr)
        else:
            raise
        raise SystemExit(1) from None
    except KeyboardInterrupt as err:
        _print_interrupted(err)
        raise SystemExit(130) from None
    except SystemExit as exit_:
        interrupt = _interrupt_behind(exit_)
        if exit_.code == 130 and interrupt is not None:
            _print_interrupted(interrupt)
            raise SystemExit(130) from None
        raise


def _interrupt_behind(exc: BaseException) -> KeyboardInterrupt | None:
    """The KeyboardInterrupt an exception was raised from or while handling, if any."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, KeyboardInterrupt):
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None


def _print_interrupted(interrupt: KeyboardInterrupt) -> None:
    why = str(interrupt)
    print(f"interrupted: {why}" if why else "interrupted", file=sys.stderr)
