"""``dataprep tokenize`` stopped from outside: SIGTERM, SIGINT, ``kill -9``, a full disk.

Each run is a real process tree (main process + spawned workers). Faults are injected at
named points (``BLOOMLINE_FAULTS``, :mod:`bloomline.common.faults`): a worker that hangs on
chunk 3 holds the run in the middle of its work (shards written, some spliced into the
output, workers alive) for as long as the test needs, and the test waits on files that say
so, with a deadline, instead of sleeping a guessed time.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

DEADLINE = 60.0  # seconds any awaited condition may take on a loaded 2-core machine


def _corpus(folder: Path, documents: int = 1000) -> Path:
    path = folder / "in.jsonl"
    path.write_text("".join(json.dumps({"text": f"word {i} " * 50}) + "\n"
                            for i in range(documents)))
    return path  # ~0.4 MB of text, ~0.9 MB of uint16 tokens: 20 chunks of 20 KiB


def _tokenize(corpus: Path, tokenizer: Path, output: Path, faults: str | None = None,
              wrapper: tuple[str, ...] = ()) -> subprocess.Popen:
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    env.pop("BLOOMLINE_FAULTS", None)
    if faults:
        env["BLOOMLINE_FAULTS"] = faults
    command = [*wrapper, sys.executable, "-m", "bloomline.dataprep.cli", "tokenize",
               str(corpus), "--tokenizer", str(tokenizer), "--output", str(output),
               "--workers", "2", "--chunk-mb", "0.02", "--quiet"]
    # SIGINT at its default even where the test runner was started with it ignored
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                            text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def _await(condition, what: str, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + DEADLINE
    while not condition():
        if proc is not None and proc.poll() is not None:
            pytest.fail(f"the run ended before {what}: {proc.communicate()}")
        if time.monotonic() > deadline:
            pytest.fail(f"no {what} after {DEADLINE} s")
        time.sleep(0.02)  # polling a condition, not waiting a guessed time


def _hung_mid_run(tmp_path: Path, tokenizer: Path
                  ) -> tuple[subprocess.Popen, Path, dict[int, bytes]]:
    """A run whose worker hangs on chunk 3 after chunks 0-2 were spliced into the output's
    temporary file: (process, output folder, its child processes and their command lines)."""
    out = tmp_path / "out"
    fired = tmp_path / "fired"
    proc = _tokenize(_corpus(tmp_path), tokenizer, out / "c",
                     faults=f"hang@chunk:chunk=3:once={fired}")

    def spliced() -> bool:
        return fired.exists() and any(path.stat().st_size > 0
                                      for path in out.rglob(".c.bin.*.partial"))

    _await(spliced, "hung worker with chunks spliced into the output", proc)
    children = {int(pid): Path(f"/proc/{pid}/cmdline").read_bytes() for pid in
                Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()}
    assert len(children) >= 2, children  # the workers (and multiprocessing's tracker)
    return proc, out, children


def _gone(pid: int) -> bool:
    """Not running any more: no such process, or a zombie its new parent has not reaped."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return True
    return "State:\tZ" in status or "State:\tX" in status


def _error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line and not line.startswith("fault: ")]


pytestmark = [pytest.mark.skipif(not sys.platform.startswith("linux"),
                                 reason="reads /proc; the kernel's parent-death signal"),
              pytest.mark.slow]


@pytest.mark.parametrize(("signum", "code", "message"), [
    (signal.SIGTERM, 143, "error: tokenize: stopped by SIGTERM; removed the partial files of "),
    (signal.SIGINT, 130, "interrupted"),
], ids=["SIGTERM", "SIGINT"])
def test_a_stop_signal_to_the_main_process_stops_the_workers_and_removes_partials(
        tmp_path, tiny_tokenizer, signum, code, message):
    """Bug: SIGTERM (what SLURM and `kill` send) killed the main process at once: its
    workers went on as orphans and the ~60 MB of hidden .partial files stayed; SIGINT to the
    main process alone waited forever for a hung worker. Sent to the main process only (not
    the group), either must kill every worker, remove every partial file and exit non-zero
    with one line."""
    proc, out, children = _hung_mid_run(tmp_path, tiny_tokenizer)
    proc.send_signal(signum)
    _, stderr = proc.communicate(timeout=DEADLINE)
    assert proc.returncode == code, stderr
    lines = _error_lines(stderr)
    assert len(lines) == 1 and lines[0].startswith(message), stderr
    assert "Traceback" not in stderr
    workers = [pid for pid, command in children.items() if b"spawn_main" in command]
    assert len(workers) == 2 and all(_gone(pid) for pid in workers), children  # reaped
    # multiprocessing's resource tracker ends by itself once the last worker is gone
    _await(lambda: all(_gone(pid) for pid in children), "end of every child process")
    assert list(out.iterdir()) == []


def test_kill_9_leaves_no_orphan_and_the_next_run_removes_only_its_stale_partials(
        tmp_path, tiny_tokenizer):
    """Bug: `kill -9` of the main process left its workers running (orphans that go on
    writing shards), and a rerun left the killed run's hidden .partial files for ever. The
    workers must die with the main process, and the next run of the same output must remove
    the killed run's scratch folder, and nothing else: not other outputs' (`.c.more.*`,
    `.cc.*`), not another writer's temporary file, not a folder a live run still holds."""
    proc, out, children = _hung_mid_run(tmp_path, tiny_tokenizer)
    proc.kill()
    proc.wait(timeout=DEADLINE)
    _await(lambda: all(_gone(pid) for pid in children), "death of every worker")
    proc.communicate(timeout=DEADLINE)  # (the pipes close once no worker holds them)
    left = sorted(path.name for path in out.iterdir())
    # one scratch folder holds all that the run wrote, beside the output's lock file (its
    # flock died with the process; the next writer takes it over)
    assert len(left) == 2 and ".c.lock" in left, left
    stale = next(name for name in left if name != ".c.lock")

    keep = [".c.more.abcdefgh.partial", ".cc.abcdefgh.partial", ".c.abcdefgh.partial.old",
            ".c_text.abcdefgh.partial"]
    for name in keep:
        (out / name).mkdir()
    (out / ".c.bin.abcdefgh.partial").write_bytes(b"a writer's temporary file")
    (out / ".c.filefile.partial").write_bytes(b"a file, not a scratch folder")
    keep += [".c.bin.abcdefgh.partial", ".c.filefile.partial", ".c.livelive.partial"]
    live = out / ".c.livelive.partial"  # a run still going: its lock is held
    live.mkdir()
    with open(live / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        rerun = _tokenize(_corpus(tmp_path), tiny_tokenizer, out / "c")
        _, stderr = rerun.communicate(timeout=DEADLINE)
    assert rerun.returncode == 0, stderr
    assert f"removed 1 partial folder(s) of an earlier c run that was killed: {stale}" in stderr
    assert sorted(path.name for path in out.iterdir()) == sorted(
        [*keep, "c.bin", "c.idx", "c.fingerprint.json"])


def _mount_wrapper(mount_point: Path) -> tuple[str, ...] | None:
    """A command prefix that runs the rest with a 256 KiB tmpfs on ``mount_point``, in a
    private mount namespace (gone with the process: nothing to unmount), then lists what was
    left on it; None where no namespace can be made (no root, user namespaces disabled)."""
    if shutil.which("unshare") is None:
        return None
    script = ('mount -t tmpfs -o size=256k bloomline-test "$0" || exit 200; "$@"; rc=$?; '
              'echo "left: $(ls -A "$0" | tr "\\n" " ")"; exit $rc')
    for flags in ("-rm", "-m"):  # a user namespace works unprivileged; -m needs root
        wrapper = ("unshare", flags, "sh", "-c", script, str(mount_point))
        probe = subprocess.run([*wrapper, "true"], capture_output=True, timeout=DEADLINE)
        if probe.returncode == 0:
            return wrapper
    return None


@pytest.mark.parametrize("method", ["tmpfs", "enospc@shard", "enospc@splice"])
def test_a_full_disk_is_one_line_naming_the_output_and_leaves_nothing(tmp_path, tiny_tokenizer,
                                                                     method):
    """Bug: a full disk ended `dataprep tokenize` in a traceback (a write's OSError names no
    file) and left partial files behind. On a real 256 KiB tmpfs (where one can be mounted),
    and with ENOSPC injected where a worker writes its shard and where the main process
    splices one into the output (always), it must be one line naming the output file, exit
    1, and leave nothing on the output's filesystem."""
    out = tmp_path / "out"
    out.mkdir()
    corpus = _corpus(tmp_path)
    if method == "tmpfs":
        wrapper = _mount_wrapper(out)
        if wrapper is None:
            pytest.skip("no tmpfs can be mounted here (needs root or user namespaces); the "
                        "injected ENOSPC cases test the same path")
        proc = _tokenize(corpus, tiny_tokenizer, out / "c", wrapper=wrapper)
    else:
        proc = _tokenize(corpus, tiny_tokenizer, out / "c", faults=f"{method}:chunk=2")
    stdout, stderr = proc.communicate(timeout=DEADLINE)
    assert proc.returncode == 1, stderr
    lines = _error_lines(stderr)
    assert len(lines) == 1 and lines[0].startswith(
        f"error: {out / 'c'}.bin: No space left on device while writing the token files ("
    ), stderr
    assert lines[0].endswith("); removed the partial files, free space and rerun")
    left = ([line for line in stdout.splitlines() if line.startswith("left:")]
            if method == "tmpfs" else [f"left: {' '.join(p.name for p in out.iterdir())}"])
    assert [line.strip() for line in left] == ["left:"], stdout
