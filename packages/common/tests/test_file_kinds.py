"""Readers refuse what would block them: a FIFO or a device in place of a file."""

from __future__ import annotations

import os

import pytest

from bloomline.common.errors import UserError
from bloomline.common.file_kinds import open_regular, require_directory, require_regular_file


def test_a_fifo_is_refused_without_blocking(tmp_path):
    """Bug: opening a FIFO in place of a file waits for a writer forever (and ignores
    SIGINT): both checks must refuse it at once, naming the path and what it is."""
    fifo = tmp_path / "shuffle_index.npy"
    os.mkfifo(fifo)
    with pytest.raises(UserError, match=r"shuffle_index\.npy: the index array is a FIFO"):
        require_regular_file(fifo, "index array")
    with pytest.raises(UserError, match="FIFO"):
        open_regular(fifo, "index array")


def test_regular_files_and_folders_pass_and_other_kinds_are_named(tmp_path):
    """Bug: a check that refuses good files, or words a missing file or a device as
    something else: a regular file reads back, a folder is a folder, /dev/null is named."""
    good = tmp_path / "a.txt"
    good.write_text("x")
    with open_regular(good) as fh:
        assert fh.read() == b"x"
    assert require_directory(tmp_path) == tmp_path
    with pytest.raises(UserError, match="character device"):
        require_regular_file("/dev/null")
    with pytest.raises(UserError, match="not found"):
        require_regular_file(tmp_path / "missing")
    with pytest.raises(UserError, match="a folder, not a regular file"):
        require_regular_file(tmp_path)
    with pytest.raises(UserError, match="a regular file, not a folder"):
        require_directory(good)
