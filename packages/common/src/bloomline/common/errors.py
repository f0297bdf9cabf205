"""User-facing errors: one line that names the file, line or field, and a non-zero exit.

Library code raises :class:`UserError` (or a subclass) for anything the user can fix; the CLIs
catch it at the top and print ``error: <message>`` without a traceback. Anything else is a
bug in bloomline and keeps its traceback.

A setting has a name per front end (``--split`` on dataprep's command line, ``data.split`` in
the trainer's config): library code raises :class:`SettingError` with the neutral name, and
each front end words it with its own names (a small dict, :meth:`SettingError.named`), never by
rewriting the text.
"""

from __future__ import annotations

import errno
import sys
from collections.abc import Callable, Mapping
from typing import TypeVar

__all__ = ["SettingError", "UserError", "exit_on_user_error"]

# errors of the machine's state, not of bloomline, even where no file is named (a write that
# fills the disk reports ENOSPC without the file's name)
_ENVIRONMENT_ERRNOS = (errno.ENOSPC, errno.EDQUOT)

T = TypeVar("T")


class UserError(Exception):
    """An error caused by input the user controls (a file, a flag, a config field).

    The message must be one line that says where (file:line, field name) and what to do.
    """

    exit_code = 1


class SettingError(UserError):
    """A :class:`UserError` about a setting, worded in the names of the front end that took it.

    Library code names its settings neutrally (``split``, ``seq_length``; ``weights`` with the
    entry ``wiki`` for one entry of a mapping) and writes the message as a template: the field
    ``{setting}`` names the setting at fault (its entry included), a field named after another
    setting (``{seq_length}``) names that one, and every other field is a value given by
    keyword, inserted as it is (a value holding braces stays text). ``names`` maps each neutral
    name to a front end's (``{"split": "--split"}``); the name of a mapping's entry is the
    ``"SETTING.ENTRY"`` key, a format of ``{entry}``
    (``{"weights.ENTRY": "data.weights.{entry}"}``).

    ``str(err)`` is worded in the names it was raised with (the raising library's own front
    end); another front end rewords it with :meth:`named`. ``where`` prefixes the message
    (``FILE: ...``), as :meth:`within` adds one.

    Raises:
        KeyError: a template field that is neither a value nor a named setting (a bug).
    """

    def __init__(self, setting: str, template: str, /, *, entry: str | None = None,
                 names: Mapping[str, str] | None = None, where: tuple[str, ...] = (),
                 **values: object) -> None:
        self.setting, self.template, self.entry = setting, template, entry
        self.names = dict(names or {})
        self.where = tuple(where)
        self.values = values
        super().__init__(self._worded())

    def named(self, names: Mapping[str, str]) -> SettingError:
        """The same error in the names of another front end; a setting ``names`` lacks keeps
        the name it has."""
        return SettingError(self.setting, self.template, entry=self.entry,
                            names={**self.names, **names}, where=self.where, **self.values)

    def within(self, where: str) -> SettingError:
        """The same error prefixed with ``where: `` (the file or index it arose in)."""
        return SettingError(self.setting, self.template, entry=self.entry, names=self.names,
                            where=(where, *self.where), **self.values)

    def __reduce__(self):
        # an exception pickles as its class called with its args; this one needs its fields
        return (_setting_error, (self.setting, self.template, self.entry, self.names,
                                 self.where, self.values))

    def _name(self, setting: str) -> str:
        if setting == "setting":
            setting = self.setting
            if self.entry is not None:
                return self.names[f"{setting}.ENTRY"].format(entry=self.entry)
        return self.names[setting]

    def _worded(self) -> str:
        clash = set(self.values) & ({"setting"} | set(self.names))
        if clash:
            raise TypeError(f"SettingError values named like settings: {sorted(clash)}")
        message = self.template.format_map(_Fields(self))
        return ": ".join((*self.where, message))


class _Fields(dict):
    """A template's fields: the values given, else settings' names."""

    def __init__(self, error: SettingError) -> None:
        super().__init__(error.values)
        self._error = error

    def __missing__(self, key: str) -> str:
        return self._error._name(key)


def _setting_error(setting, template, entry, names, where, values) -> SettingError:
    return SettingError(setting, template, entry=entry, names=names, where=where, **values)


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
