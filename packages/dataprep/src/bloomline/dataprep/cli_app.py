"""The Typer app each bloomline command line (``dataprep``, ``trainer``, ``inspect-data``)
starts from, so that the three behave alike:

- help printed as written: typer renders help with rich, which reads ``[plot]`` in
  ``pip install 'bloomline-tools[plot]'`` as a markup tag and drops it. Every help text of
  every command and parameter is escaped for rich once, where the command is built
  (``_HelpAsWritten``), instead of string by string in the sources; rich's layout stays
  (full command descriptions, wrapping at spaces only: click's plain help would cut
  ``bloomline-trainer[plot]`` after its hyphen);
- ``--version``: ``dataprep (bloomline-dataprep) 0.1.0``, from the installed distribution;
- shell completion, typer's ``--install-completion`` and ``--show-completion``.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

import typer
from rich.markup import escape  # typer's help renderer; typer depends on rich
from typer.core import HAS_RICH, TyperCommand, TyperGroup

__all__ = ["command_line_app", "version_line"]


def version_line(program: str, distribution: str) -> str:
    """``PROGRAM (DISTRIBUTION) VERSION``; a checkout run without installing says so."""
    try:
        found = version(distribution)
    except PackageNotFoundError:
        found = "unknown (not installed: pip install -e packages/...)"
    return f"{program} ({distribution}) {found}"


class _HelpAsWritten:
    """Mixed into typer's command classes: the help texts escaped for rich's markup, once per
    built command (typer builds the click commands afresh each run, from the sources)."""

    def _escape_help(self) -> None:
        if not HAS_RICH:  # TYPER_USE_RICH=0: click's plain help prints text as it is
            return
        owners = [(self, "help"), (self, "short_help"), (self, "epilog")]
        owners += [(param, "help") for param in self.params]
        for owner, attribute in owners:
            text = getattr(owner, attribute, None)
            if text:
                setattr(owner, attribute, escape(text))


class _Command(_HelpAsWritten, TyperCommand):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._escape_help()


class _Group(_HelpAsWritten, TyperGroup):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._escape_help()


class _App(typer.Typer):
    """A Typer whose commands print their help as written (``_Command``)."""

    def command(self, *args, cls=None, **kwargs):
        return super().command(*args, cls=cls or _Command, **kwargs)


def command_line_app(program: str, distribution: str, help: str, **settings) -> typer.Typer:
    """A Typer app with help as written, completion and a root ``--version`` option;
    ``settings`` go to ``typer.Typer`` as they are."""
    app = _App(help=help, cls=_Group, add_completion=True, no_args_is_help=True, **settings)

    def _print_version(value: bool) -> None:
        if value:
            typer.echo(version_line(program, distribution))
            raise typer.Exit()

    @app.callback()
    def _root(
        show_version: bool = typer.Option(
            False, "--version", callback=_print_version, is_eager=True,
            help="Print the program's version and exit."),
    ) -> None:
        pass  # the subcommands do the work; this only carries the root options

    return app
