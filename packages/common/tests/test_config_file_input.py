"""A config file that is not UTF-8 text, or not a file at all, is refused in one line."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import pytest

from bloomline.common.config_loader import load_config
from bloomline.common.errors import UserError


@dataclass
class _Train:
    steps: int = 1


@dataclass
class _Config:
    train: _Train = field(default_factory=_Train)


def test_a_config_that_is_not_utf8_names_its_line(tmp_path):
    """Bug: a recipe saved in Latin-1 (or a binary file given as --config) died with a
    UnicodeDecodeError traceback: it must be one line naming the file, the line and the
    byte."""
    path = tmp_path / "recipe.toml"
    path.write_bytes(b"[train]\nsteps = 2\n# caf\xe9\n")
    with pytest.raises(UserError, match=r"recipe\.toml:3: not UTF-8 text \(byte 0xe9\)"):
        load_config(_Config, path)
    path.write_bytes(b"[train]\nsteps = 2\n")
    assert load_config(_Config, path).train.steps == 2


def test_a_fifo_as_config_is_refused_without_blocking(tmp_path):
    """Bug: --config naming a FIFO blocked in open() forever (Ctrl-C could not end it): it
    must be refused at once."""
    fifo = tmp_path / "recipe.toml"
    os.mkfifo(fifo)
    with pytest.raises(UserError, match="the config file is a FIFO"):
        load_config(_Config, fifo)
