"""One writer per output: the advisory lock beside an output (``output_lock``)."""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import threading

import pytest

from bloomline.common.errors import UserError
from bloomline.common.output_lock import lock_path, output_lock, output_locks
from conftest import held_elsewhere


def test_second_writer_of_an_output_is_refused_naming_the_holder(tmp_path):
    """Bug: two writers of one output both pass the exists-check made at their start and
    the later to finish replaces the other's files, both exiting 0; nothing locked it."""
    prefix = tmp_path / "corpus" / "web"
    assert lock_path(prefix) == tmp_path / "corpus" / ".web.lock"
    with held_elsewhere(prefix):
        with pytest.raises(UserError) as refused:
            with output_lock(prefix):
                pass
        message = str(refused.value)
        assert message.startswith(f"another process (pid 4242) is writing {prefix}")
        assert "\n" not in message
        with output_lock(tmp_path / "corpus" / "books"):  # another output: not blocked
            pass
    with output_lock(prefix):  # released: the next writer gets it
        with output_lock(prefix):  # nested in one process: one hold (command, then writer)
            pass
        assert lock_path(prefix).exists()  # the outer hold still holds it
        with pytest.raises(BlockingIOError):  # and it is a real flock
            fd = os.open(lock_path(prefix), os.O_RDWR)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            finally:
                os.close(fd)
    assert not lock_path(prefix).exists()  # a clean exit leaves no sidecar


def test_several_outputs_lock_all_or_none(tmp_path):
    """Bug: a multi-key tokenize locking only its first output, so that a run writing one of
    the others is not refused."""
    a, b = tmp_path / "web_text", tmp_path / "web_title"
    with held_elsewhere(b), pytest.raises(UserError, match="is writing .*web_title"):
        with output_locks([a, b]):
            pass
    assert not lock_path(a).exists()  # the lock it got first was given back
    with output_locks([a, b]):
        assert lock_path(a).exists() and lock_path(b).exists()
    assert list(tmp_path.iterdir()) == []  # the stale sidecar taken over and removed


def test_lock_of_a_killed_writer_is_released(tmp_path):
    """Bug: a writer killed with -9 leaving a lock that blocks every later run of the same
    output (the kernel must drop an flock with its process)."""
    prefix = tmp_path / "web"
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import sys\nfrom bloomline.common.output_lock import output_lock\n"
         f"with output_lock({str(prefix)!r}):\n"
         "    print('held', flush=True)\n    sys.stdin.read()\n"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(UserError, match=rf"another process \(pid {holder.pid}\) is writing"):
            with output_lock(prefix):
                pass
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
        holder.stdin.close()
        holder.stdout.close()
    assert lock_path(prefix).exists()  # kill -9 leaves the sidecar, but not the lock
    with output_lock(prefix):
        pass
    assert not lock_path(prefix).exists()


def test_waiting_lock_serialises_threads_of_one_process(tmp_path):
    """Bug: the index cache's build lock not excluding a second builder in the same process
    (another thread), or a waiting builder taking a sidecar its holder had just removed
    (both would then build and publish the same entry)."""
    entry, order = tmp_path / "cache" / "gpt-train-abc", []
    sidecar = tmp_path / "cache" / ".locks" / "gpt-train-abc.lock"
    first_in = threading.Event()

    def second():
        first_in.wait()
        with output_lock(entry, wait=True, sidecar=sidecar):
            order.append("second")

    thread = threading.Thread(target=second)
    thread.start()
    with output_lock(entry, wait=True, sidecar=sidecar):
        first_in.set()
        # the second thread is blocked on the lock now or will be: it cannot get in before
        # this block ends, whatever the scheduling
        with pytest.raises(BlockingIOError):
            fd = os.open(sidecar, os.O_RDWR)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            finally:
                os.close(fd)
        order.append("first")
    thread.join(timeout=30)
    assert order == ["first", "second"] and sidecar.exists()  # a named sidecar stays


def test_a_fifo_in_place_of_the_sidecar_is_refused_without_blocking(tmp_path):
    """Bug: a FIFO put where the lock file goes making every writer of the output hang in
    open() forever."""
    prefix = tmp_path / "web"
    os.mkfifo(lock_path(prefix))
    with pytest.raises(UserError, match=r"\.web\.lock: the lock of .* is a FIFO"):
        with output_lock(prefix):
            pass
