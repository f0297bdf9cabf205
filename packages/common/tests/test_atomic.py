"""Atomic outputs: nothing half-written under a final name, no clobbering by default."""

from __future__ import annotations

import os

import pytest

from bloomline.common import UserError, atomic_output_dir, atomic_write_bytes, check_can_write


def test_atomic_write_bytes_replaces_whole_file_with_default_permissions(tmp_path):
    """Catches: outputs left 0600 by mkstemp, or a temporary file left beside the output."""
    target = tmp_path / "sub" / "out.bin"
    atomic_write_bytes(target, b"abc")
    atomic_write_bytes(target, b"defg")
    assert target.read_bytes() == b"defg"
    assert sorted(p.name for p in target.parent.iterdir()) == ["out.bin"]
    umask = os.umask(0)
    os.umask(umask)
    assert target.stat().st_mode & 0o777 == 0o666 & ~umask


def test_scratch_dir_is_removed_even_on_error(tmp_path):
    """Catches: a crash leaving a scratch folder that is not hidden or not cleaned up."""
    with pytest.raises(RuntimeError), atomic_output_dir(tmp_path, "name") as scratch:
        assert scratch.name.startswith(".name.") and scratch.name.endswith(".partial")
        (scratch / "shard").write_bytes(b"x")
        raise RuntimeError("boom")
    assert list(tmp_path.iterdir()) == []


def test_check_can_write_refuses_existing_output_naming_it(tmp_path):
    """Catches: silently overwriting a user's token files without --overwrite."""
    existing = tmp_path / "a.idx"
    existing.write_bytes(b"")
    with pytest.raises(UserError, match=r"a\.idx: output exists; pass --overwrite"):
        check_can_write([tmp_path / "b.bin", existing], overwrite=False)
    check_can_write([existing], overwrite=True)
