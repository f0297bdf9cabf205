"""What the three command lines (``dataprep``, ``trainer``, ``inspect-data``) share: help printed
as written, ``--version`` and shell completion (``bloomline.dataprep.cli_app``). In-process
through click; importing the trainer's CLI loads no torch."""

from __future__ import annotations

import re

import click
import pytest
import typer
from typer.testing import CliRunner

from bloomline.dataprep.cli import app as dataprep_app
from bloomline.tools.cli import app as tools_app
from bloomline.trainer.cli import app as trainer_app

APPS = {"dataprep": (dataprep_app, "bloomline-dataprep"),
        "trainer": (trainer_app, "bloomline-trainer"),
        "inspect-data": (tools_app, "bloomline-tools")}

_BRACKETED = re.compile(r"\[[^\[\]]*\]")


def _commands(group: click.Command, path: tuple[str, ...] = ()):
    """Every (path, command) of a command tree, the root first."""
    yield path, group
    for name, sub in getattr(group, "commands", {}).items():
        yield from _commands(sub, (*path, name))


def _source_helps(command: click.Command) -> list[str]:
    """The help strings as the source wrote them: the command's and each parameter's (the
    built command holds them escaped for rich's markup, ``\\[plot]``: unescaped here)."""
    helps = [command.help or ""]
    helps += [getattr(param, "help", None) or "" for param in command.params]
    return [re.sub(r"\\(\\*\[)", r"\1", text) for text in helps]


def _squeezed(text: str) -> str:
    # the renderer wraps lines (at spaces) inside the panels' borders: compare without them
    return re.sub(r"[\s│]+", "", text)


@pytest.mark.parametrize("program", APPS)
def test_every_help_text_is_printed_as_written(program):
    """Bug: typer's rich help renderer read ``[plot]`` in ``pip install
    'bloomline-trainer[plot]'`` as a markup tag and dropped it, so `trainer --help` and
    `inspect-data plot --help` printed an install command that installs no extra. Walks every
    command and option of the program: each help text of the source is printed whole, every
    ``[...]`` in it included."""
    app, _ = APPS[program]
    brackets = 0
    for path, command in _commands(typer.main.get_command(app)):
        # wide: at 80 columns rich cuts words longer than a column with "…" (a layout matter)
        shown = CliRunner().invoke(app, [*path, "--help"], prog_name=program,
                                   env={"COLUMNS": "250"})
        assert shown.exit_code == 0, (path, shown.output)
        printed = _squeezed(shown.output)
        for help_text in _source_helps(command):
            assert _squeezed(help_text) in printed, (program, path, help_text)
            brackets += len(_BRACKETED.findall(help_text))
    if program != "dataprep":  # the plot extra's install command, the reported case
        assert brackets


@pytest.mark.parametrize("program", APPS)
def test_version_names_the_program_and_its_distribution(program):
    """Bug: `dataprep --version` (and the other two) was "No such option": a user could not
    say which bloomline they run."""
    app, distribution = APPS[program]
    shown = CliRunner().invoke(app, ["--version"], prog_name=program)
    assert shown.exit_code == 0, shown.output
    assert re.fullmatch(rf"{program} \({distribution}\) \d+\.\d+\.\d+\S*\n", shown.output)


@pytest.mark.parametrize("program", APPS)
def test_show_completion_prints_a_bash_script(program, monkeypatch):
    """Bug: the apps were built with ``add_completion=False``: no `--install-completion` or
    `--show-completion`, no completion of commands and options in the shell."""
    # typer's switch that makes the options take the shell's name instead of detecting it
    monkeypatch.setenv("_TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION", "1")
    app, _ = APPS[program]
    shown = CliRunner().invoke(app, ["--show-completion", "bash"], prog_name=program)
    assert shown.exit_code == 0, shown.output
    variable = "_" + program.replace("-", "_").upper() + "_COMPLETE"
    assert f"{variable}=complete_bash" in shown.output
    assert re.search(rf"complete .*-F \S+ {program}$", shown.output, re.M), shown.output


def test_the_completion_script_completes_commands_and_options():
    """Bug: completion enabled but answering nothing (the script's call back into the program
    must list its commands and a command's options)."""
    def complete(words: str) -> list[str]:
        env = {"_DATAPREP_COMPLETE": "complete_bash", "COMP_WORDS": words,
               "COMP_CWORD": str(len(words.split()) - (0 if words.endswith(" ") else 1))}
        shown = CliRunner().invoke(dataprep_app, [], prog_name="dataprep", env=env)
        return shown.output.split()  # typer's bash answer: one candidate a line

    assert complete("dataprep tr") == ["train-tokenizer"]
    assert complete("dataprep train-tokenizer --vo") == ["--vocab-size"]
