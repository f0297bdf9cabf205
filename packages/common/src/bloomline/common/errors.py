"""User-facing errors: one line that names the file, line or field, and a non-zero exit.

Library code raises :class:`UserError` (or a subclass) for anything the user can fix; the CLIs
catch it at the top and print ``error: <message>`` without a traceback. Anything else is a
bug in bloomline and keeps its traceback.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import TypeVar

__all__ = ["UserError", "exit_on_user_error"]

T = TypeVar("T")


class UserError(Exception):
    """An error caused by input the user controls (a file, a flag, a config field).

    The message must be one line that says where (file:line, field name) and what to do.
    """

    exit_code = 1


def exit_on_user_error(fn: Callable[[], T]) -> T:
    """Run ``fn``; on :class:`UserError` print ``error: ...`` to stderr and exit non-zero.

    Ctrl-C exits with 130 (the shell convention) and a short message instead of a traceback.
    An operating-system error on a named file (permission denied, disk full) is the user's
    environment, not a bug: it gets the same one-line treatment.
    """
    try:
        return fn()
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(err.exit_code) from None
    except OSError as err:
        if err.filename is None:
            raise
        print(f"error: {err.filename}: {err.strerror}", file=sys.stderr)
        raise SystemExit(1) from None
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        raise SystemExit(130) from None
