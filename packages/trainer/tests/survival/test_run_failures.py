"""A failing run ends and says why; nothing is lost, nothing is left behind.

Real ``trainer`` processes (with loader worker processes), faults injected with
``BLOOMLINE_FAULTS``. Each process started here carries a tag in its environment, inherited by
every process it starts (loader workers, torchrun's ranks), so that "nothing left behind"
means: no process with the tag is alive once the command has exited.

The full-disk test writes its run folder to a real small file system (a tmpfs mounted in
user + mount namespaces of its own with ``unshare``, which vanish with the process) where the
machine allows it, and else injects ENOSPC at the save (``enospc@save``); the test's id
says which (``tmpfs`` or ``injected``).
"""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
from trainer_fixtures import tiny_config, write_corpus

from bloomline.common.config_loader import to_toml
from bloomline.common.errors import UserError
from bloomline.trainer.checkpoint.manifest import verify_checkpoint
from bloomline.trainer.survival.preemption import PREEMPTED_EXIT_CODE
from bloomline.trainer.survival.run_folder import RunLock

TESTS = Path(__file__).parents[1]  # the tests root: the helper modules
STEPS = 12
TAG = "BLOOMLINE_TEST_TAG"


def _recipe(corpus: str, run_dir: Path, path: Path, **sections) -> Path:
    """12 steps, a checkpoint every 5 (the last 2 kept), 2 loader workers, no peak timing."""
    settings = {"train": {"train_samples": 4 * STEPS, "log_interval": 1},
                "checkpoint": {"interval": 5, "keep_last": 2},
                "data": {"num_workers": 2}, "monitor": {"peak_flops": 1e12}}
    for section, values in sections.items():
        settings.setdefault(section, {}).update(values)
    path.write_text(to_toml(tiny_config(corpus, run_dir, **settings)))
    return path


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> str:
    return write_corpus(tmp_path_factory.mktemp("failures") / "corpus")


def _default_sigint() -> None:
    # a test runner started in the background of a shell ignores SIGINT, and an ignored
    # signal stays ignored across exec: give the trainer a terminal's SIGINT
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class _Command:
    """A command in a session of its own (the process group a terminal would signal), its
    output lines collected as they come, its descendants tagged."""

    def __init__(self, args: list[str], faults: str = "") -> None:
        self.tag = uuid.uuid4().hex
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            [str(TESTS), *filter(None, [os.environ.get("PYTHONPATH")])]), **{TAG: self.tag})
        env.pop("BLOOMLINE_FAULTS", None)
        env.pop("LOGLEVEL", None)
        if faults:
            env["BLOOMLINE_FAULTS"] = faults
        self.proc = subprocess.Popen(args, env=env, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, start_new_session=True,
                                     preexec_fn=_default_sigint)
        self.lines: dict[str, list[tuple[float, str]]] = {"out": [], "err": []}
        self._arrived = threading.Condition()
        self._readers = [threading.Thread(target=self._read, args=(stream, name), daemon=True)
                         for stream, name in ((self.proc.stdout, "out"),
                                              (self.proc.stderr, "err"))]
        for reader in self._readers:
            reader.start()

    def _read(self, stream, name: str) -> None:
        for line in stream:
            with self._arrived:
                self.lines[name].append((time.monotonic(), line.rstrip("\n")))
                self._arrived.notify_all()
        with self._arrived:
            self._arrived.notify_all()

    def wait_for(self, text: str, timeout: float = 120) -> float:
        """When a line holding ``text`` came (either stream); fails if the command ends or
        the timeout passes first."""
        deadline = time.monotonic() + timeout
        with self._arrived:
            while True:
                for when, line in self.lines["out"] + self.lines["err"]:
                    if text in line:
                        return when
                left = deadline - time.monotonic()
                if left <= 0 or not any(reader.is_alive() for reader in self._readers):
                    self.kill()
                    raise AssertionError(f"no line with {text!r}:\n{self.stdout}\n{self.stderr}")
                self._arrived.wait(left)

    def finish(self, timeout: float = 120) -> int:
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"still running after {timeout} s (a hang):\n{self.stdout}\n"
                                 f"{self.stderr}") from None
        for reader in self._readers:
            reader.join(timeout=30)
        return code

    def kill(self) -> None:
        for pid in _tagged(self.tag):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    @property
    def stdout(self) -> str:
        return "\n".join(line for _, line in self.lines["out"])

    @property
    def stderr(self) -> str:
        return "\n".join(line for _, line in self.lines["err"])

    def left_behind(self) -> list[int]:
        """Processes of this command still alive (the command itself has exited)."""
        return _tagged(self.tag)


def _tagged(tag: str) -> list[int]:
    needle = f"{TAG}={tag}".encode()
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/environ", "rb") as fh:
                if needle in fh.read().split(b"\0"):
                    found.append(int(entry.name))
        except OSError:  # gone meanwhile, or not ours
            continue
    return found


def _trainer(*args: str, faults: str = "") -> _Command:
    return _Command([sys.executable, "-m", "bloomline.trainer", *args], faults)


def _error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("error:")]


# -- an exception ends every process ----------------------------------------------------------
@pytest.mark.slow
def test_an_exception_in_a_step_ends_the_run_and_its_loader_workers_promptly(corpus, tmp_path):
    """Bug: an exception inside a run (here injected at step 3) prints its traceback and then
    hangs until killed: the loader workers ignore SIGTERM (for SLURM), and at exit
    multiprocessing SIGTERMs them and joins them without a timeout while the iterator,
    held by the exception's traceback, was never shut down. The process must exit non-zero
    within seconds of the failure, keep the traceback (a bug's), not need the exit deadline's
    stack dump, and leave no worker process behind."""
    recipe = _recipe(corpus, tmp_path / "run", tmp_path / "recipe.toml")
    run = _trainer("pretrain", "--config", str(recipe), faults="error@step:step=3")
    failed_at = run.wait_for("fault: error@step")
    assert run.finish() == 1, run.stderr
    assert time.monotonic() - failed_at < 20, "the process took long to exit after the error"
    assert "RuntimeError: injected fault: error@step" in run.stderr
    assert "Timeout (" not in run.stderr  # ended by itself, not by the exit deadline
    assert run.left_behind() == []


# -- Ctrl-C -----------------------------------------------------------------------------------
@pytest.mark.slow
def test_ctrl_c_saves_a_checkpoint_and_exits_75_like_sigterm(corpus, tmp_path):
    """Bug: Ctrl-C (SIGINT to the whole foreground process group, loader workers included)
    exits 130 without the checkpoint the README promises, and silently (Typer turns the
    KeyboardInterrupt into a bare exit 130), or a loader worker dies of it and the trainer
    fails fetching the step's batch: the run must say what it does, finish the step, save a
    checkpoint that verifies, exit 75 and leave no process behind."""
    run_dir = tmp_path / "run"
    recipe = _recipe(corpus, run_dir, tmp_path / "recipe.toml")
    run = _trainer("pretrain", "--config", str(recipe))
    run.wait_for("step 2/")
    os.killpg(run.proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does
    assert run.finish() == PREEMPTED_EXIT_CODE, run.stderr
    assert "SIGINT: finishing this step, then saving a checkpoint and stopping" in run.stderr
    stop = [line for line in run.stdout.splitlines() if line.startswith("stopping after step")]
    assert len(stop) == 1 and "received SIGINT; checkpoint saved, exit code 75" in stop[0], \
        run.stdout
    step = int(stop[0].split()[3].rstrip(":"))
    assert verify_checkpoint(run_dir / "checkpoints" / f"step_{step:08d}") == []
    assert "Traceback" not in run.stderr
    assert run.left_behind() == []


@pytest.mark.slow
def test_a_second_ctrl_c_aborts_at_once_and_leaves_no_partial_checkpoint(corpus, tmp_path):
    """Bug: a second Ctrl-C is swallowed by the handler of the first (the user cannot stop a
    long save), or the save it interrupts leaves its partial folder behind, or the abort is
    silent: SIGINT at step 7 asks for a checkpoint, a second SIGINT lands inside that save
    (after its tensors are written); the run must exit 130 with one line saying that it
    stopped without a checkpoint, remove the partial folder and keep step 5's checkpoint."""
    run_dir = tmp_path / "run"
    recipe = _recipe(corpus, run_dir, tmp_path / "recipe.toml", data={"num_workers": 0})
    run = _trainer("pretrain", "--config", str(recipe),
                   faults="int@step:step=7;int@save:step=7")
    assert run.finish() == 130, run.stderr
    assert run.stderr.splitlines()[-1] == (
        "interrupted: a second SIGINT stopped the run at once, without a checkpoint; the "
        "newest complete one stays (resume with --resume auto)"), run.stderr
    checkpoints = run_dir / "checkpoints"
    assert sorted(p.name for p in checkpoints.iterdir()) == ["step_00000005"]
    assert verify_checkpoint(checkpoints / "step_00000005") == []
    assert run.left_behind() == []


@pytest.mark.slow
def test_ctrl_c_to_the_launcher_reaches_every_rank_which_saves_and_exits_75():
    """Bug: Ctrl-C to `trainer pretrain --nproc` is torchrun's shutdown (SIGINT to the ranks,
    SIGKILL 30 s later, exit 130 although they could have saved), or never reaches the ranks
    (torchrun starts each in a session of its own, which a terminal's SIGINT misses): the
    launcher must forward it to both ranks, which stop as preempted runs do, and exit 75."""
    from test_run_restarts import _assert_gone, _start_probe

    launcher, pids = _start_probe("launch-preempt")
    try:
        launcher.send_signal(signal.SIGINT)
        _, stderr = launcher.communicate(timeout=90)
    finally:
        launcher.kill()
    assert launcher.returncode == PREEMPTED_EXIT_CODE, stderr
    assert "launcher: SIGINT forwarded to 2 worker process(es)" in stderr, stderr
    assert stderr.strip().splitlines()[-1].startswith(
        "error: preempted: the run saved a checkpoint and stopped; exit code 75"), stderr
    _assert_gone(pids)


# -- one trainer per run folder ---------------------------------------------------------------
@pytest.mark.slow
def test_a_second_trainer_on_a_run_folder_in_use_is_refused_on_every_rank(corpus, tmp_path):
    """Bug: two trainers on one run folder (a job resubmitted while the first still runs)
    overwrite each other's checkpoints and interleave their metrics, or the refusal hangs the
    other ranks of the second: with the first running, a second one of 2 ranks must end,
    all of its processes, with one line naming the holder, and write nothing; and once the
    first is killed with SIGKILL (its loader workers with it, at once, although they ignore
    SIGTERM), the folder must not stay locked for the trainer that comes next."""
    run_dir = tmp_path / "run"
    recipe = _recipe(corpus, run_dir, tmp_path / "recipe.toml",
                     train={"train_samples": 4000}, checkpoint={"interval": 0})
    first = _trainer("pretrain", "--config", str(recipe))
    try:
        first.wait_for("step 1/")
        second = _trainer("pretrain", "--nproc", "2", "--config", str(recipe),
                          "parallel.data_parallel=2")
        assert second.finish() == 1, second.stderr
        assert second.stderr.splitlines() == [
            f"error: train.run_dir {run_dir}: in use by another trainer (pid "
            f"{first.proc.pid} on {os.uname().nodename} since "
            + second.stderr.split(" since ", 1)[1]], second.stderr
        assert "two trainers in one run folder overwrite" in second.stderr
        # the model is built before the folder's lock is taken: only that line came first
        assert [line.split(" | ")[1].split(":")[0] for line in second.stdout.splitlines()
                if line.startswith("start ")] == ["building the model"], second.stdout
        assert len(second.stdout.splitlines()) == 1, second.stdout
        assert second.left_behind() == []
        assert first.proc.poll() is None  # the first goes on
    finally:
        os.kill(first.proc.pid, signal.SIGKILL)  # the trainer alone, not its workers
        first.finish()
    deadline = time.monotonic() + 3  # torch's own check would take up to 5 s
    while first.left_behind() and time.monotonic() < deadline:
        os.sched_yield()
    assert first.left_behind() == [], "loader workers outlived their killed trainer"
    with RunLock(run_dir, is_holder=True):  # what the next trainer takes first
        pass


# -- a full disk ------------------------------------------------------------------------------
@functools.cache
def _small_disk_prefix() -> tuple[str, ...] | None:
    """The command prefix that runs a command in mount namespaces where it may mount a
    tmpfs (user namespaces for anyone where the kernel allows them, plain mount namespaces
    for root), or None where neither works."""
    if not shutil.which("unshare") or not Path("/proc/self/ns/mnt").exists():
        return None
    probe = tmp = None
    try:
        import tempfile

        tmp = tempfile.mkdtemp()
        for prefix in (("unshare", "--user", "--map-root-user", "--mount"),
                       ("unshare", "--mount")):
            probe = subprocess.run([*prefix, "sh", "-c", f"mount -t tmpfs -o size=64k tmpfs "
                                    f"{tmp} && touch {tmp}/x"], capture_output=True, timeout=30)
            if probe.returncode == 0:
                return prefix
        return None
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)


def _disk_methods() -> list:
    real = _small_disk_prefix() is not None
    return [pytest.param("tmpfs" if real else "injected", id="tmpfs" if real else "injected")]


@pytest.mark.slow
@pytest.mark.parametrize("method", _disk_methods())
@pytest.mark.parametrize("async_save", [False, True], ids=["sync", "async"])
def test_a_full_disk_during_a_save_ends_the_run_with_one_line_and_loses_nothing(
        corpus, tmp_path, method, async_save):
    """Bug: a checkpoint save that meets a full disk dies with DCP's CheckpointException
    traceback and hangs (loader workers), leaves its partial folder, or touches the previous
    checkpoint; an async save's failure stays in its background thread while the run trains
    on without checkpoints. On a file system that holds one checkpoint but not two, the save
    of step 10 must fail with one line naming the error and the intact checkpoint, remove
    its partial folder, keep step 5's (which verifies), and end every process."""
    run_dir = tmp_path / "disk" / "run"
    run_dir.parent.mkdir()
    recipe = _recipe(corpus, run_dir, tmp_path / "recipe.toml",
                     checkpoint={"async_": async_save})
    command = [sys.executable, "-m", "bloomline.trainer", "pretrain", "--config", str(recipe)]
    if method == "tmpfs":  # the run folder on 1.6 MB (a checkpoint is ~1.1 MB), copied out
        script = ('mount -t tmpfs -o size=1600k tmpfs "$1" || exit 90; shift; "$@"; code=$?; '
                  f'cp -a "{run_dir}" "{tmp_path / "after"}"; exit $code')
        run = _Command([*_small_disk_prefix(), "sh", "-c", script, "sh", str(run_dir.parent),
                        *command])
        after = tmp_path / "after"
    else:
        run = _Command(command, faults="enospc@save:step=10")
        after = run_dir
    assert run.finish() == 1, run.stderr
    errors = _error_lines(run.stderr)
    assert len(errors) == 1 and run.stderr.splitlines()[-1] == errors[0], run.stderr
    assert errors[0].startswith("error: checkpoint of step 10: cannot write "), errors
    assert "No space left on device" in errors[0]
    assert "the newest complete checkpoint, step_00000005, is intact" in errors[0]
    assert "Traceback" not in run.stderr
    checkpoints = after / "checkpoints"
    assert sorted(p.name for p in checkpoints.iterdir()) == ["step_00000005"], method
    assert verify_checkpoint(checkpoints / "step_00000005") == []
    assert run.left_behind() == []


@pytest.mark.slow
def test_a_full_disk_under_one_rank_prints_one_line_per_rank(corpus, tmp_path):
    """Bug: under --nproc 2 a save that fails on one rank alone (its shard on a full disk)
    ended that rank with its one line, but the other, waiting in the save's collective, died
    with gloo's "Connection closed by peer" traceback (170-230 lines): each rank must print
    one line, the failing one its error, the other that another process ended."""
    recipe = _recipe(corpus, tmp_path / "run", tmp_path / "recipe.toml",
                     checkpoint={"interval": 2}, data={"num_workers": 0},
                     parallel={"data_parallel": 2, "world_size": 2})
    run = _trainer("pretrain", "--nproc", "2", "--config", str(recipe),
                   faults="enospc@save:step=2:rank=1")
    assert run.finish(timeout=240) == 1, run.stderr
    assert "Traceback" not in run.stderr and "[rank0]" not in run.stderr, run.stderr
    lines = [line for line in run.stderr.splitlines() if not line.startswith("fault: ")]
    assert any(line.startswith("rank 0: stopped: another process of the run ended during a "
                               "collective (") for line in lines), run.stderr
    errors = _error_lines(run.stderr)
    assert len(errors) == 1 and errors[0].startswith("error: checkpoint of step 2: cannot "
                                                     "write "), run.stderr
    assert len(lines) <= 3, run.stderr  # the two ranks' lines and the launcher's at most
    assert run.left_behind() == []


# -- restarts ---------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize(("fault", "starts", "last_line"), [
    ("error@step:step=2", 2, "error: rank 0 failed (exit code 1) after 1 restart, not restarted "
     "again: the previous attempt failed the same way (RuntimeError: injected fault: "
     "error@step {'step': 2} (faults.py:"),
    ("enospc@save:step=2", 1, "error: checkpoint of step 2: cannot write "),
], ids=["recurring-exception", "user-error"])
def test_max_restarts_does_not_restart_a_failure_that_a_restart_meets_again(
        corpus, tmp_path, fault, starts, last_line):
    """Bug: under --max-restarts a deterministic failure is restarted N times (or forever,
    while a rank hangs at exit) before the run fails: a UserError (here a full disk at a
    save) must end the run after its first start, with its own line; an exception that
    recurs identically after a restart (injected at step 2 on every start) must end it
    after the first restart with one line saying so; neither may leave a process behind."""
    recipe = _recipe(corpus, tmp_path / "run", tmp_path / "recipe.toml",
                     checkpoint={"interval": 2}, data={"num_workers": 1})
    run = _trainer("pretrain", "--max-restarts", "3", "--config", str(recipe), faults=fault)
    assert run.finish(timeout=240) == 1, run.stderr
    fired = [line for line in run.stderr.splitlines()
             if line.startswith(f"fault: {fault.split(':')[0]} ")]
    assert len(fired) == starts, run.stderr
    assert run.stderr.splitlines()[-1].startswith(last_line), run.stderr
    assert len(_error_lines(run.stderr)) == 1, run.stderr
    assert run.left_behind() == []


# -- nothing lost -----------------------------------------------------------------------------
def _snapshot(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file() and p.name != ".lock"}


def _flip_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


@pytest.mark.slow
def test_a_run_never_starts_over_its_checkpoints(tmp_path):
    """Bug: --resume auto with every checkpoint damaged starts again at step 0 in silence and
    its saves and retention then delete the damaged ones (which might have been repaired),
    or --resume none / --resume of an older checkpoint in a folder with newer ones trains a
    new run over them: each must stop with one line naming the checkpoints and the way to
    start over, before anything in the run folder changes."""
    from bloomline.trainer.loop import Trainer

    corpus = write_corpus(tmp_path / "corpus")
    run_dir = tmp_path / "run"
    settings = {"train": {"train_samples": 40}, "checkpoint": {"interval": 5},
                "monitor": {"peak_flops": 1e12}}
    Trainer(tiny_config(corpus, run_dir, **settings), log=lambda *_: None).run()
    step_5, step_10 = (run_dir / "checkpoints" / f"step_{s:08d}" for s in (5, 10))

    def start(resume: str, lines: list | None = None) -> str:
        cfg = tiny_config(corpus, run_dir, **settings)
        cfg.checkpoint.resume = resume
        with pytest.raises(UserError) as refused:
            Trainer(cfg, log=(lines if lines is not None else []).append).run()
        return str(refused.value)

    before = _snapshot(run_dir)
    message = start(str(step_5))
    assert message.startswith(f"checkpoint.resume {step_5}: {run_dir} holds checkpoints after "
                              "its step 5 (step_00000010), which this run would replace"), message
    message = start("none")
    assert message.startswith(f"checkpoint.resume none: {run_dir} holds checkpoints "
                              "(step_00000005, step_00000010)"), message
    assert "fresh train.run_dir" in message
    assert _snapshot(run_dir) == before
    _flip_byte(step_5 / "__0_0.distcp")
    _flip_byte(step_10 / "__0_0.distcp")
    before = _snapshot(run_dir)
    lines: list[str] = []
    message = start("auto", lines)
    assert message.startswith(f"checkpoint.resume auto: none of the 2 checkpoints of {run_dir} "
                              "verifies (step_00000005, step_00000010; the lines above say "
                              "why)"), message
    assert "nothing was deleted" in message and "fresh train.run_dir" in message
    assert [line.split(": damaged")[0] for line in lines if "damaged" in line] == [
        f"checkpoint {step_10}", f"checkpoint {step_5}"], lines
    assert lines[-1].endswith("; no older checkpoint"), lines
    assert _snapshot(run_dir) == before  # no save, no pruning, no metrics


def test_export_overwrite_replaces_only_an_earlier_export(tmp_path):
    """Bug: `trainer export-hf CKPT OUT --overwrite` with OUT a run folder (or a checkpoint, or
    a folder with files of its own) deletes it and puts the export in its place: --overwrite
    must replace only an earlier export (config.json + model.safetensors + tokenizer files)
    and refuse anything else with one line naming what does not belong (without suggesting
    --overwrite when it is not given), touching nothing."""
    from bloomline.trainer.hf import export_hf
    from bloomline.trainer.model import build_model

    cfg = tiny_config("", tmp_path / "run").model
    state = build_model(cfg).state_dict()
    run_dir = tmp_path / "run"
    (run_dir / "checkpoints" / "step_00000005").mkdir(parents=True)
    (run_dir / "checkpoints" / "step_00000005" / "manifest.json").write_text("{}")
    (run_dir / "config.toml").write_text("")
    (run_dir / "metrics.jsonl").write_text("{}\n")
    export = export_hf(state, cfg, tmp_path / "hf")
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "todo.txt").write_text("mine")
    (tmp_path / "file").write_text("mine")
    shutil.copytree(export, tmp_path / "hf_plus")
    (tmp_path / "hf_plus" / "README.md").write_text("mine")
    before = _snapshot(tmp_path)
    for out, why in ((run_dir, "it lacks config.json, model.safetensors; it also holds "
                               "checkpoints, config.toml, metrics.jsonl"),
                     (run_dir / "checkpoints" / "step_00000005", "it lacks config.json"),
                     (tmp_path / "notes", "it lacks config.json"),
                     (tmp_path / "hf_plus", "it also holds README.md"),
                     (tmp_path / "file", "this is a file")):
        for overwrite in (True, False):  # not "pass --overwrite" either
            with pytest.raises(UserError) as refused:
                export_hf(state, cfg, out, overwrite=overwrite)
            assert str(refused.value).startswith(f"{out}: not replaced: --overwrite replaces "),\
                refused.value
            assert why in str(refused.value), refused.value
    assert _snapshot(tmp_path) == before
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".partial")]
    export_hf(state, cfg, export, overwrite=True)  # an earlier export is replaced
    assert sorted(p.name for p in export.iterdir()) == ["config.json", "model.safetensors"]


@pytest.mark.slow
def test_sigterm_during_an_export_leaves_no_partial_folder_and_the_old_export(corpus, tmp_path):
    """Bug: SIGTERM (scancel, a time limit) to `trainer export-hf` killed it without cleanup:
    its hidden scratch folder with the half-written weights stayed next to the output. It must
    exit 143 with one line, remove the scratch folder and leave the earlier export as it was."""
    from bloomline.trainer.hf import export_hf
    from bloomline.trainer.loop import Trainer

    cfg = tiny_config(corpus, tmp_path / "run", monitor={"peak_flops": 1e12})
    checkpoint = Trainer(cfg, log=lambda line: None).save()
    earlier = export_hf(Trainer(cfg, log=lambda line: None).model.state_dict(), cfg.model,
                        tmp_path / "hf")
    before = _snapshot(earlier)
    done = subprocess.run([sys.executable, "-m", "bloomline.trainer", "export-hf",
                           str(checkpoint), str(earlier), "--overwrite"],
                          env=dict(os.environ, BLOOMLINE_FAULTS="term@export"),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 128 + signal.SIGTERM, done.stderr
    assert [line for line in done.stderr.splitlines() if not line.startswith("fault:")] == [
        f"error: export-hf: stopped by SIGTERM; removed the partial export of {earlier} "
        "(nothing was written)"]
    assert _snapshot(earlier) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf", "run"]
