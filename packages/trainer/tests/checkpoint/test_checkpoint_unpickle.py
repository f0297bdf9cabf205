"""Nothing executes from a checkpoint: DCP's ``.metadata`` and the non-tensor values it
indexes are pickles, and a crafted one (with a manifest recomputed to match it) must be refused
by every reader of a checkpoint, with one line naming the file and the global, before it runs;
real checkpoints of every layout must still load exactly as before.

The payloads wrap the real content (the real ``Metadata`` with one more attribute; a value of
the optimizer's ``param_groups``), so that an unrestricted load would succeed and create the
marker file: the control test checks that DCP's own loader does.
"""

from __future__ import annotations

import ast
import dataclasses
import io
import os
import pickle
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from trainer_fixtures import tiny_config, write_corpus

from bloomline.common.config_loader import to_toml
from bloomline.common.errors import UserError
from bloomline.trainer import checkpoint as ckpt
from bloomline.trainer.checkpoint.manifest import MANIFEST, verify_checkpoint, write_manifest
from bloomline.trainer.checkpoint.metadata import (
    ALLOWED_GLOBALS,
    CheckpointReader,
    TamperedCheckpointError,
    read_metadata,
    unpickle_metadata,
)
from bloomline.trainer.loop import Trainer
from bloomline.trainer.parallel.local_processes import run_distributed

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")

TESTS = Path(__file__).parents[1]  # the tests root: the helper modules
REPO = TESTS.parents[2]
SETTINGS = {"train": {"train_samples": 8}}  # 2 steps; the run ends with checkpoint step 2
STEP = 2
WHY = {"metadata": "(a checkpoint's metadata names only DCP's classes); the checkpoint may be "
                   "tampered with",
       "value": "a checkpoint's non-tensor values load with torch.load(weights_only=True)); the "
                "checkpoint may be tampered with"}


def _fast_trainers() -> None:
    """Each run times a matmul for 0.5 s to report MFU; these tests do not read it."""
    import bloomline.trainer.reporting.monitor as monitor

    monitor.measure_peak_flops = lambda device, dtype: 1e12


def _step(run_dir) -> Path:
    return Path(run_dir) / "checkpoints" / f"step_{STEP:08d}"


def _full_state(trainer: Trainer) -> dict:
    """Every parameter, optimizer moment and param_groups value by parameter name, as full CPU
    tensors and plain values (the same in any layout)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    model, optim = get_state_dict(trainer.model, trainer.optimizer,
                                  options=StateDictOptions(full_state_dict=True))
    groups = {name: {k: v for k, v in group.items() if k != "params"}
              for group in optim["param_groups"] for name in group["params"]}
    return {"model": {k: v.detach().cpu().clone() for k, v in model.items()},
            "optim": {name: {k: torch.as_tensor(v).detach().cpu().clone()
                             for k, v in state.items()}
                      for name, state in optim["state"].items()},
            "groups": groups}


def _assert_same_state(loaded: dict, saved: dict, what: str) -> None:
    assert loaded["model"].keys() == saved["model"].keys(), what
    for name, value in saved["model"].items():
        assert torch.equal(loaded["model"][name], value), f"{what}: {name}"
    assert loaded["optim"].keys() == saved["optim"].keys(), what
    for name, state in saved["optim"].items():
        assert loaded["optim"][name].keys() == state.keys() >= {"exp_avg", "exp_avg_sq", "step"}
        for key, value in state.items():
            assert torch.equal(loaded["optim"][name][key], value), f"{what}: {key} of {name}"
    assert loaded["groups"] == saved["groups"], what


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """A finished 2-step one-process run (checkpoint step 2), its recipe, and the state it
    saved."""
    _fast_trainers()
    root = tmp_path_factory.mktemp("unpickle")
    corpus = write_corpus(root / "corpus")
    cfg = tiny_config(corpus, root / "run", **SETTINGS)
    trainer = Trainer(cfg, log=lambda *_: None)
    trainer.run()
    recipe = root / "recipe.toml"
    recipe.write_text(to_toml(cfg))
    return {"root": root, "corpus": corpus, "run": root / "run", "recipe": recipe,
            "saved": _full_state(trainer)}


# -- the payloads ---------------------------------------------------------------------------
class _RunsOnLoad:
    """Unpickles as ``os.system(command)``: what a crafted checkpoint would run."""

    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self):
        return os.system, (self.command,)


def _touch(marker: Path) -> _RunsOnLoad:
    return _RunsOnLoad(f"touch {shlex.quote(str(marker))}")


def _rewrite_manifest(checkpoint: Path) -> None:
    (checkpoint / MANIFEST).unlink()
    write_manifest(checkpoint, STEP, is_writer=True)


def _tamper_metadata(checkpoint: Path, marker: Path) -> None:
    """``.metadata``: the real Metadata with one more attribute, whose unpickling runs
    ``touch MARKER`` (pickled as posix.system)."""
    path = checkpoint / ".metadata"
    metadata = pickle.loads(path.read_bytes())
    metadata.__dict__["payload"] = _touch(marker)
    path.write_bytes(pickle.dumps(metadata))
    _rewrite_manifest(checkpoint)


def _tamper_value(checkpoint: Path, marker: Path) -> str:
    """An optimizer ``param_groups`` value (an ``lr``) replaced by ``torch.save`` bytes whose
    unpickling runs ``touch MARKER`` (and gives 0: a valid lr), appended to the shard and
    indexed by a clean ``.metadata``. Returns the value's name."""
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata, MetadataIndex

    metadata = pickle.loads((checkpoint / ".metadata").read_bytes())
    fqn = next(name for name, item in metadata.state_dict_metadata.items()
               if isinstance(item, BytesStorageMetadata) and name.endswith(".lr"))
    info = metadata.storage_data[MetadataIndex(fqn)]
    buffer = io.BytesIO()
    torch.save(_touch(marker), buffer)
    shard = checkpoint / info.relative_path
    offset = shard.stat().st_size
    with open(shard, "ab") as fh:
        fh.write(buffer.getvalue())
    metadata.storage_data[MetadataIndex(fqn)] = dataclasses.replace(
        info, offset=offset, length=len(buffer.getvalue()))
    (checkpoint / ".metadata").write_bytes(pickle.dumps(metadata))
    _rewrite_manifest(checkpoint)
    return fqn


def _tampered(made: dict, dest: Path, kind: str) -> tuple[Path, Path]:
    """A copy of the run whose checkpoint carries the ``kind`` payload with a consistent
    manifest: (checkpoint, marker)."""
    run = dest / "run"
    shutil.copytree(made["run"], run)
    marker = dest / "MARKER"
    (_tamper_metadata if kind == "metadata" else _tamper_value)(_step(run), marker)
    return _step(run), marker


def _refusal(checkpoint: Path, kind: str) -> str:
    """The refusal's line (for a value: its beginning; the value's name follows)."""
    if kind == "metadata":
        return f"{checkpoint}/.metadata: refuses to unpickle posix.system {WHY['metadata']}"
    return f"{checkpoint}/__0_0.distcp: refuses to unpickle posix.system (in optim.param_groups."


def _assert_refused(line: str, checkpoint: Path, kind: str, marker: Path) -> None:
    assert line.startswith(_refusal(checkpoint, kind)), line
    assert line.endswith(WHY[kind]) and "\n" not in line, line
    assert not marker.exists()


def _is_metadata_reader(path) -> bool:
    """Whether ``path`` is the one module allowed to read DCP's pickles itself."""
    return path.as_posix().endswith("trainer/checkpoint/metadata.py")


def _unpickles_its_own_children(path) -> bool:
    """``parallel/local_processes.py`` unpickles the return values of the processes it spawned
    itself (bytes over a pipe, never a file), so no checkpoint can reach it."""
    return path.as_posix().endswith("trainer/parallel/local_processes.py")


def test_payloads_run_code_under_dcps_own_loader(made, tmp_path, monkeypatch):
    """Bug this guards against: payloads that would not run anyway (the refusal tests would
    pass on an unprotected loader). The manifest's checks alone must pass on both tampered
    checkpoints, and DCP's own reader and planner must load them and create the marker."""
    import torch.distributed.checkpoint as dcp

    import bloomline.trainer.checkpoint.metadata as checkpoint_metadata

    for kind in ("metadata", "value"):
        checkpoint, marker = _tampered(made, tmp_path / kind, kind)
        with monkeypatch.context() as patch:  # sizes, sha256, state files: all agree
            patch.setattr(checkpoint_metadata, "check_pickles", lambda *_: [])
            assert verify_checkpoint(checkpoint) == []
        trainer = Trainer(tiny_config(made["corpus"], tmp_path / kind / "fresh", **SETTINGS),
                          log=lambda *_: None)
        dcp.load(ckpt.saved_state_dict(trainer.model, trainer.optimizer),
                 checkpoint_id=str(checkpoint))
        assert marker.exists(), kind


# -- every reader refuses -------------------------------------------------------------------
def _trainer_cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(TESTS), *filter(None, [env.get("PYTHONPATH")])])
    return subprocess.run([sys.executable, "-m", "bloomline.trainer", *args], env=env,
                          capture_output=True, text=True, timeout=timeout)


def _main(monkeypatch, capsys, *args: str) -> tuple[int, list[str]]:
    """``trainer ARGS`` in this process, as the console script runs it: (exit code, stderr
    lines)."""
    from bloomline.trainer.cli import main

    capsys.readouterr()
    monkeypatch.setattr(sys, "argv", ["trainer", *args])
    with pytest.raises(SystemExit) as exited:
        main()
    return exited.value.code, capsys.readouterr().err.splitlines()


@pytest.mark.parametrize("kind", [pytest.param("metadata", marks=pytest.mark.slow), "value"])
def test_verify_checkpoint_refuses_a_payload_with_a_consistent_manifest(made, tmp_path,
                                                                       monkeypatch, capsys,
                                                                       kind):
    """Bug: `trainer verify-checkpoint` says "ok" for a checkpoint whose manifest was
    recomputed around a crafted pickle (it checked checksums only), or unpickles it to find
    out (running it): it must exit 1 with the one line naming the file and the global, and
    the marker must not exist."""
    checkpoint, marker = _tampered(made, tmp_path, kind)
    if kind == "metadata":  # the console script in a process of its own
        done = _trainer_cli("verify-checkpoint", str(checkpoint))
        code, out, err = done.returncode, done.stdout, done.stderr.splitlines()
    else:  # the same, in this process (a process costs seconds)
        code, err = _main(monkeypatch, capsys, "verify-checkpoint", str(checkpoint))
        out = ""
    assert code == 1 and out == "" and len(err) == 1, err
    _assert_refused(err[0].removeprefix("error: "), checkpoint, kind, marker)


@pytest.mark.parametrize("command", ["generate", "export-hf", "evaluate"])
def test_commands_that_read_a_checkpoint_refuse_a_payload(made, tmp_path, monkeypatch, capsys,
                                                          command):
    """Bug: `trainer generate`, `export-hf` or `evaluate` hands a checkpoint to DCP, which
    unpickles `.metadata` with plain pickle (the manifest agreeing, nothing stops it): each
    must exit 1 with the refusal's line and the marker must not exist."""
    checkpoint, marker = _tampered(made, tmp_path, "metadata")
    args = {"generate": ["--prompt", "a"], "export-hf": [str(tmp_path / "hf")],
            "evaluate": []}[command]
    code, err = _main(monkeypatch, capsys, command, str(checkpoint), *args)
    assert code == 1 and err, err
    _assert_refused(err[-1].removeprefix("error: "), checkpoint, "metadata", marker)
    assert not (tmp_path / "hf").exists()


@pytest.mark.parametrize("kind", ["metadata", "value"])
def test_resume_refuses_a_payload_rather_than_run_or_fall_back(made, tmp_path, monkeypatch,
                                                               capsys, kind):
    """Bug: `trainer pretrain --resume auto` loads the newest checkpoint through DCP's plain
    unpickling (the payload runs), or takes the crafted checkpoint for a damaged one and
    falls back past it (training on, on top of a tampered run folder): it must exit 1 with
    the refusal's line, train nothing, and the marker must not exist."""
    checkpoint, marker = _tampered(made, tmp_path, kind)
    run = checkpoint.parent.parent
    metrics = (run / "metrics.jsonl").read_text()
    code, err = _main(monkeypatch, capsys, "pretrain", "--config", str(made["recipe"]),
                      "--resume", "auto", f"train.run_dir={run}")
    assert code == 1, err
    _assert_refused(err[-1].removeprefix("error: "), checkpoint, kind, marker)
    assert (run / "metrics.jsonl").read_text() == metrics  # no step trained


@pytest.mark.parametrize("kind", ["metadata", "value"])
def test_rollback_refuses_a_payload(made, tmp_path, kind):
    """Bug: a spike rollback (latest_checkpoint before the step, then Trainer.load of it
    with verified=True: no second verification) unpickles the checkpoint with DCP's plain
    pickle, or falls back past it: latest_checkpoint must raise the refusal without logging
    a fallback, and Trainer.load, which skips verification, must refuse in DCP's reader or
    planner; the marker must not exist."""
    checkpoint, marker = _tampered(made, tmp_path, kind)
    run = checkpoint.parent.parent
    lines: list[str] = []
    with pytest.raises(TamperedCheckpointError) as refused:
        ckpt.latest_checkpoint(run, before_step=STEP + 1, log=lines.append)
    assert lines == []
    _assert_refused(str(refused.value), checkpoint, kind, marker)
    trainer = Trainer(tiny_config(made["corpus"], run, **SETTINGS), log=lambda *_: None)
    with pytest.raises(UserError) as refused:
        trainer.load(checkpoint, verified=True)
    _assert_refused(str(refused.value), checkpoint, kind, marker)


def _stack_global(module: str, name: str) -> bytes:
    """A protocol-4 pickle of the global ``module``/``name`` (which pickle.dumps would not
    write for a dotted name)."""
    def text(value: str) -> bytes:
        return b"\x8c" + bytes([len(value)]) + value.encode()

    return b"\x80\x04" + text(module) + text(name) + b"\x93."


PICKLES = {  # crafted by hand: every way a pickle names a global
    "GLOBAL + REDUCE (protocol 0)": (b"cposix\nsystem\n(S'touch MARKER'\ntR.", "posix.system"),
    "INST (protocol 0)": (b"(S'touch MARKER'\niposix\nsystem\n.", "posix.system"),
    "STACK_GLOBAL (protocol 4)": (pickle.dumps(_RunsOnLoad("touch MARKER"), protocol=4),
                                  "posix.system"),
    "an attribute of an allowed class": (
        _stack_global("torch.distributed.checkpoint.metadata", "Metadata.__init__"),
        "torch.distributed.checkpoint.metadata.Metadata.__init__"),
    "builtins.getattr": (b"cbuiltins\ngetattr\n.", "builtins.getattr"),
}


@pytest.mark.parametrize("name", PICKLES)
def test_metadata_unpickler_refuses_every_way_of_naming_a_global(tmp_path, monkeypatch, name):
    """Bug: the restricted unpickler checks one opcode (GLOBAL) but not another (INST,
    STACK_GLOBAL), or admits a dotted name reaching into an allowed class: each must be
    refused with the global's name, and nothing run."""
    data, refused_global = PICKLES[name]
    monkeypatch.chdir(tmp_path)
    with pytest.raises(TamperedCheckpointError) as refused:
        unpickle_metadata(io.BytesIO(data), "CKPT/.metadata")
    assert str(refused.value) == (f"CKPT/.metadata: refuses to unpickle {refused_global} "
                                  f"{WHY['metadata']}")
    assert not (tmp_path / "MARKER").exists()


def test_allow_list_holds_only_dcps_classes_and_plain_values():
    """Bug: the allow-list grows a callable that can do harm (builtins.getattr, eval,
    torch.load, os.system...) when someone meets a new global: every entry must be one of
    DCP's metadata classes, torch.Size, a path class, torch's layout lookup, or a dtype /
    layout / memory format value."""
    import importlib

    from torch.serialization import _get_layout

    classes = {"torch.distributed.checkpoint.metadata", "torch.distributed.checkpoint.filesystem"}
    for module, name in ALLOWED_GLOBALS:
        try:
            value = getattr(importlib.import_module(module), name)
        except ModuleNotFoundError:
            assert module == "pathlib._local"  # Python 3.13's
            continue
        if isinstance(value, (torch.dtype, torch.layout, torch.memory_format)):
            continue
        assert (module in classes and isinstance(value, type)) or value in (
            torch.Size, _get_layout) or (module.startswith("pathlib") and isinstance(
                value, type) and issubclass(value, os.PathLike)), (module, name)


# -- real checkpoints load as before --------------------------------------------------------
def _loaded(made: dict, checkpoint: Path, tmp_path: Path) -> dict:
    """The full state of a fresh one-process trainer after load_checkpoint (model, optimizer:
    what a resume loads, before the loop sets the next step's lr)."""
    trainer = Trainer(tiny_config(made["corpus"], tmp_path / "run", **SETTINGS),
                      log=lambda *_: None)
    assert ckpt.load_checkpoint(checkpoint, trainer.model, trainer.optimizer)["step"] == STEP
    return _full_state(trainer)


def test_one_process_checkpoint_loads_unchanged_through_the_restricted_reader(made, tmp_path):
    """Bug: the restricted unpickler changes what it reads (a field dropped or converted, the
    storage_meta DCP adds missing) or refuses a global real metadata uses: .metadata must
    unpickle equal to plain pickle (and CheckpointReader read what FileSystemReader reads),
    verify, and a resume must restore every parameter, moment and param_groups value."""
    from torch.distributed.checkpoint.filesystem import FileSystemReader

    checkpoint = _step(made["run"])
    assert read_metadata(checkpoint) == pickle.loads((checkpoint / ".metadata").read_bytes())
    ours, torchs = CheckpointReader(checkpoint), FileSystemReader(checkpoint)
    torchs.load_id = ours.load_id
    assert ours.read_metadata() == torchs.read_metadata()
    assert verify_checkpoint(checkpoint) == []
    _assert_same_state(_loaded(made, checkpoint, tmp_path), made["saved"], "one process")


def _save_sharded(corpus: str, root: str) -> dict:
    """On each of 2 ranks: train 2 steps at dp2 ZeRO-3 (FSDP2 DTensors) and at tp2, each
    ending with a checkpoint; the full states they saved."""
    _fast_trainers()
    saved = {}
    for name, parallel in {"dp2_zero3": {"data_parallel": 2, "zero_stage": 3},
                           "tp2": {"tensor_parallel": 2}}.items():
        trainer = Trainer(tiny_config(corpus, Path(root) / name, **SETTINGS, parallel=parallel),
                          log=lambda *_: None)
        trainer.run()
        saved[name] = _full_state(trainer)
    return saved


@pytest.fixture(scope="module")
def sharded(made):
    root = made["root"] / "sharded"
    return root, run_distributed(2, _save_sharded, made["corpus"], str(root))[0]


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["dp2_zero3", "tp2"])
def test_sharded_checkpoints_load_unchanged_through_the_restricted_reader(made, sharded,
                                                                         tmp_path, layout):
    """Bug: metadata of a sharded checkpoint (DTensor chunks of FSDP2 or tp, several shard
    files) uses a global the allow-list lacks, or reads differently: it must unpickle equal
    to plain pickle, verify, and load into one process with the state the ranks saved."""
    root, saved = sharded
    checkpoint = _step(root / layout)
    assert read_metadata(checkpoint) == pickle.loads((checkpoint / ".metadata").read_bytes())
    assert verify_checkpoint(checkpoint) == []
    _assert_same_state(_loaded(made, checkpoint, tmp_path), saved[layout], layout)


# -- no other way in ------------------------------------------------------------------------
def _product_sources() -> list[Path]:
    return sorted(REPO.glob("packages/*/src/**/*.py"))  # tools is a package too now


def test_every_checkpoint_read_in_the_product_goes_through_the_restricted_reader():
    """Bug: a new DCP load without the restricted reader (``dcp.load(state, checkpoint_id=)``
    unpickles .metadata with plain pickle), a torch.load without weights_only=True, or a
    pickle.load in the trainer: each would run code from a checkpoint again."""
    offenders = []
    for path in _product_sources():
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if (isinstance(node, ast.ImportFrom) and node.module
                    and node.module.startswith("torch.distributed.checkpoint")
                    and {a.name for a in node.names} & {"load", "load_state_dict",
                                                        "FileSystemReader"}
                    and not _is_metadata_reader(path)):
                offenders.append(f"{path.relative_to(REPO)}:{node.lineno}: imports DCP's load")
            if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
                continue
            owner = ast.unparse(node.func.value)
            keywords = {k.arg: k.value for k in node.keywords}
            where = f"{path.relative_to(REPO)}:{node.lineno}"
            if (node.func.attr in ("load", "load_state_dict")
                    and (owner == "dcp" or owner.endswith("distributed.checkpoint"))
                    and "storage_reader" not in keywords):
                offenders.append(f"{where}: DCP load without storage_reader")
            if owner == "torch" and node.func.attr == "load" and not (
                    isinstance(keywords.get("weights_only"), ast.Constant)
                    and keywords["weights_only"].value is True):
                offenders.append(f"{where}: torch.load without weights_only=True")
            if (owner == "pickle" and node.func.attr in ("load", "loads", "Unpickler")
                    and "trainer" in path.parts and not _is_metadata_reader(path)
                    and not _unpickles_its_own_children(path)):
                offenders.append(f"{where}: pickle.{node.func.attr}")
            if node.func.attr == "FileSystemReader":
                offenders.append(f"{where}: DCP's FileSystemReader")
    assert offenders == []
