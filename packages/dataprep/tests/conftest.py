"""Fixtures shared by dataprep's tests."""

from __future__ import annotations

import sys

import pytest

from bloomline.dataprep.cli import main


@pytest.fixture
def dataprep(capsys, monkeypatch):
    """Run ``dataprep ARGS`` in-process through the console entry point (user errors become
    ``error: ...`` and exit 1, as for a user): (exit code, stdout, stderr)."""

    def run(*args) -> tuple[int, str, str]:
        monkeypatch.setattr(sys, "argv", ["dataprep", *map(str, args)])
        with pytest.raises(SystemExit) as exit_info:
            main()
            sys.exit(0)
        captured = capsys.readouterr()
        return exit_info.value.code or 0, captured.out, captured.err

    return run
