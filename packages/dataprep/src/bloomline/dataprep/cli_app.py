"""The Typer app each bloomline command line (``dataprep``, ``trainer``, ``inspect-data``)
starts from, so that the three behave alike:

- help printed as written: typer's rich renderer reads ``[plot]`` in
  ``pip install 'bloomline-tools[plot]'`` as a markup tag and drops it, so markup is off
  (``rich_markup_mode=None``: click's plain help) rather than escaped string by string;
- ``--version``: ``dataprep (bloomline-dataprep) 0.1.0``, from the installed distribution;
- shell completion, typer's ``--install-completion`` and ``--show-completion``.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

import typer


def version_line(program: str, distribution: str) -> str:
    """``PROGRAM (DISTRIBUTION) VERSION``; a checkout run without installing says so."""
    try:
        found = version(distribution)
    except PackageNotFoundError:
        found = "unknown (not installed: pip install -e packages/...)"
    return f"{program} ({distribution}) {found}"


def command_line_app(program: str, distribution: str, help: str, **settings) -> typer.Typer:
    """A Typer app with plain help, completion and a root ``--version`` option; ``settings``
    go to ``typer.Typer`` as they are."""
    app = typer.Typer(help=help, rich_markup_mode=None, add_completion=True,
                      no_args_is_help=True, **settings)

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
