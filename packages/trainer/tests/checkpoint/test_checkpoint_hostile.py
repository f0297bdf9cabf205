"""Hostile checkpoints: files whose manifest agrees with them (recomputed) or an edit that
skipped it, each refused in one line naming the file and the entry by every reader
(verify-checkpoint, generate, export-hf, evaluate, resume, ``checkpoint.init_from``), before a
model is built from them or a byte of them is inflated.

Each test copies one finished 2-step run (module fixture) and edits its checkpoint; the
hostile files are a few KB.
"""

from __future__ import annotations

import dataclasses
import io
import json
import pickle
import shutil
import struct
import zipfile
from pathlib import Path

import pytest
import torch
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.metadata import MetadataIndex
from trainer_fixtures import tiny_config, write_corpus
from typer.testing import CliRunner

from bloomline.common.errors import UserError
from bloomline.trainer import checkpoint as ckpt
from bloomline.trainer.checkpoint.manifest import MANIFEST, verify_checkpoint, write_manifest
from bloomline.trainer.checkpoint.metadata import read_metadata
from bloomline.trainer.config import Config
from bloomline.trainer.loop import Trainer
from bloomline.trainer.model import build_model
from bloomline.trainer.survival.rollback import ROLLBACKS_FILE, read_rollbacks
from bloomline.trainer.train_state import TrainState

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")

STEP = 2
EMBEDDING = "model.word_embeddings.weight"  # 128 x 32 fp32 in the tiny config


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """A finished 2-step one-process run (its checkpoint: step 2)."""
    import bloomline.trainer.reporting.monitor as monitor

    monitor.measure_peak_flops = lambda device, dtype: 1e12
    root = tmp_path_factory.mktemp("hostile")
    corpus = write_corpus(root / "corpus")
    Trainer(tiny_config(corpus, root / "run", train={"train_samples": 8}),
            log=lambda *_: None).run()
    return root / "run" / "checkpoints" / f"step_{STEP:08d}"


@pytest.fixture
def copy(made, tmp_path) -> Path:
    """A copy of the run's checkpoint to edit."""
    return Path(shutil.copytree(made, tmp_path / made.name))


def _rehash(path: Path) -> None:
    """The manifest recomputed: the edited files are what it lists."""
    (path / MANIFEST).unlink()
    write_manifest(path, STEP, is_writer=True)


def _only_line(err: pytest.ExceptionInfo) -> str:
    text = str(err.value)
    assert isinstance(err.value, UserError) and "\n" not in text, text
    return text


def _point(path: Path, fqn: str, data: bytes, transforms=None) -> None:
    """The storage entry of ``fqn``'s only chunk moved to a new file holding ``data``."""
    metadata = read_metadata(path)
    key = next(k for k in metadata.storage_data if k.fqn == fqn)
    (path / "__0_1.distcp").write_bytes(data)
    metadata.storage_data[key] = _StorageInfo("__0_1.distcp", 0, len(data),
                                              transform_descriptors=transforms)
    with open(path / ".metadata", "wb") as fh:
        pickle.dump(metadata, fh)
    _rehash(path)


def _zstd_bomb() -> bytes:
    """A zstd frame of a few bytes whose header claims 8 GiB of content (RLE blocks of
    zeros): what DCP's stream.zstd extension would inflate."""
    header = struct.pack("<IB", 0xFD2FB528, 0xE0) + struct.pack("<Q", 8 << 30)
    block = ((128 << 10) << 3 | 1 << 1).to_bytes(3, "little") + b"\0"  # RLE, 128 KiB
    return header + block * 64


def _saved(tensor: torch.Tensor, compress: int = zipfile.ZIP_STORED) -> bytes:
    """``torch.save`` bytes of ``tensor``, its zip members rewritten with ``compress`` (at
    level 0: deflate's framing around the bytes, so that the entry is as long as the chunk
    and only the compression gives it away)."""
    raw = io.BytesIO()
    torch.save(tensor, raw)
    source, out = zipfile.ZipFile(raw), io.BytesIO()
    with zipfile.ZipFile(out, "w", compress, compresslevel=0) as zipped:
        for member in source.infolist():
            zipped.writestr(member.filename, source.read(member.filename))
    return out.getvalue()


def test_transform_descriptors_are_refused(copy):
    """Bug: a storage entry given transform_descriptors=["stream.zstd/1"] over a small zstd
    frame claiming GBs verified ok, and generate inflated it (8.8 GB RSS, then a torch
    traceback); any transform crashed every reader. bloomline writes none: verify must refuse
    it naming the entry, and a load must not get as far as DCP."""
    _point(copy, EMBEDDING, _zstd_bomb(), transforms=["stream.zstd/1"])
    problems = verify_checkpoint(copy)
    assert problems and EMBEDDING in problems[0] and "stream.zstd/1" in problems[0], problems
    model = build_model(ckpt.load_config_of(copy, Config).model, "cpu", seed=None)
    with pytest.raises(UserError) as err:
        ckpt.load_checkpoint(copy, model)
    assert "stream.zstd/1" in _only_line(err)


def test_an_entry_past_the_end_of_its_file_is_refused(copy):
    """Bug: the metadata's offset + length of an entry was never held against its file's
    size: an entry reaching past the end verified ok."""
    metadata = read_metadata(copy)
    key = MetadataIndex(EMBEDDING, torch.Size([0, 0]), 0)
    info = metadata.storage_data[key]
    size = (copy / info.relative_path).stat().st_size
    metadata.storage_data[key] = _StorageInfo(info.relative_path, info.offset, size)
    with open(copy / ".metadata", "wb") as fh:
        pickle.dump(metadata, fh)
    _rehash(copy)
    problems = verify_checkpoint(copy)
    assert problems == [f".metadata: {EMBEDDING}: bytes [{info.offset}, {info.offset + size}) "
                        f"of {info.relative_path}, which has {size}"]


@pytest.mark.parametrize("data, why", [
    (_saved(torch.zeros(128, 32), zipfile.ZIP_DEFLATED), "a compressed member"),
    (_saved(torch.zeros(256, 32)), "32768 bytes of storage for a chunk of 16384 bytes"),
    (b"\0" * (128 * 32 * 4), "not a torch.save archive"),
], ids=["deflated", "twice the storage", "not a zip"])
def test_a_tensor_entry_must_hold_its_chunk_stored(copy, data, why):
    """Bug: torch.load inflates a deflated member of a tensor's torch.save archive, so a few
    KB could claim GBs; an entry's storage was never held against the tensor's size. Each
    entry must be stored uncompressed with exactly the chunk's bytes (what DCP writes)."""
    _point(copy, EMBEDDING, data)
    problems = verify_checkpoint(copy)
    assert len(problems) == 1 and problems[0].startswith(f"__0_1.distcp: {EMBEDDING}: {why}")


def test_an_edited_config_is_refused_before_any_reader_builds_a_model(copy, monkeypatch):
    """Bug: config.toml edited in a checkpoint (no rehash): verify-checkpoint named it, but
    generate, export-hf, evaluate and init_from built the model from it first (and died
    allocating 33 GB). Every reader must check the manifest before it reads the config."""
    import bloomline.trainer.model as model_module
    from bloomline.trainer.cli import app
    from bloomline.trainer.evaluate_command import evaluate_checkpoint
    from bloomline.trainer.model_source import resolve_model_settings

    config = copy / ckpt.CONFIG_FILE
    config.write_text(config.read_text().replace("hidden_size = 32", "hidden_size = 48", 1))

    def refuse(*args, **kwargs):
        raise AssertionError("a model built from an unverified config")

    monkeypatch.setattr(model_module, "build_model", refuse)
    expected = f"{copy}: damaged or incomplete checkpoint: config.toml: sha256 differs"
    for command in (["generate", str(copy), "--prompt", "a"],
                    ["export-hf", str(copy), str(copy.parent / "hf")]):
        result = CliRunner().invoke(app, command)
        assert isinstance(result.exception, UserError), result.output
        assert str(result.exception).startswith(expected), command
    with pytest.raises(UserError) as err:
        evaluate_checkpoint(copy)
    assert _only_line(err).startswith(expected)
    cfg = Config()
    cfg.checkpoint.init_from = str(copy)
    with pytest.raises(UserError) as err:
        resolve_model_settings(cfg)
    assert _only_line(err).startswith(expected)


def _edit_json(path: Path, name: str, edit) -> None:
    value = json.loads((path / name).read_text())
    (path / name).write_text(json.dumps(edit(value)))
    _rehash(path)


STATES = {
    "negative consumed_samples": (lambda s: {**s, "consumed_samples": -100},
                                  "consumed_samples -100: must be an int >= 0"),
    "negative skip range": (lambda s: {**s, "skip_samples": [[-5, 70]]},
                            "skip_samples[0]: [-5, 70] is not a range"),
    "inverted skip range": (lambda s: {**s, "skip_samples": [[70, 5]]},
                            "skip_samples[0]: [70, 5] is not a range"),
    "step as a string": (lambda s: {**s, "step": "2"}, "step '2': must be an int >= 0"),
    "a bool as a counter": (lambda s: {**s, "rollbacks": True},
                            "rollbacks True: must be an int >= 0"),
    "spike history of strings": (lambda s: {**s, "spike_history": {"losses": ["x"]}},
                                 "spike_history.losses: must be a list of finite numbers"),
}


@pytest.mark.parametrize("edit", STATES)
def test_a_trainer_state_of_wrong_types_or_ranges_is_refused(copy, edit):
    """Bug: trainer_state.json was loaded as it came: consumed_samples -100 trained at sample
    positions -100..-68, a skip range [[-5, 70]] ended a run at "step 8 of 7" having trained
    nothing. verify, and the load itself (a caller that verified another copy), must refuse
    it naming the field."""
    change, why = STATES[edit]
    _edit_json(copy, "trainer_state.json", change)
    assert any(f"trainer_state.json: {why}" in line for line in verify_checkpoint(copy))
    model = build_model(tiny_config("", "").model, "cpu", seed=None)  # the run's model
    optimizer = torch.optim.AdamW(model.parameters())
    with pytest.raises(UserError) as err:
        ckpt.load_checkpoint(copy, model, optimizer, verified=True)
    assert why in _only_line(err)
    with pytest.raises(UserError, match="trainer_state.json: "):
        TrainState().load_state_dict(json.loads((copy / "trainer_state.json").read_text()))


@pytest.mark.parametrize("edit, why", [
    (lambda r: {**r, "python": {**r["python"], "state": r["python"]["state"][:10]}}, "python:"),
    (lambda r: {**r, "numpy": {**r["numpy"], "pos": 10**6}}, "numpy:"),
    (lambda r: {**r, "torch": "AAAA"}, "torch: not base64 of torch's"),
], ids=["short python state", "numpy pos", "torch state size"])
def test_an_rng_state_of_wrong_sizes_is_refused(copy, edit, why):
    """Bug: rng.json went straight into the generators' setters: a short or out-of-range
    state died in random.setstate / np.random.set_state / torch.set_rng_state with a
    traceback. It must be refused in one line naming the generator."""
    _edit_json(copy, "rng.json", edit)
    assert verify_checkpoint(copy)[0].startswith(f"rng.json: {why}")
    model = build_model(tiny_config("", "").model, "cpu", seed=None)
    optimizer = torch.optim.AdamW(model.parameters())
    with pytest.raises(UserError) as err:
        ckpt.load_checkpoint(copy, model, optimizer, verified=True)
    assert f"rng.json: {why}" in _only_line(err)


def test_a_tensor_of_another_shape_than_the_config_is_refused(copy):
    """Bug: a consistent checkpoint whose config.toml and tensors disagree (hidden 48 in the
    config, 32 in the tensors) failed deep in DCP with a multi-rank traceback; it must be one
    line naming the tensor, its shape and the expected one."""
    config = copy / ckpt.CONFIG_FILE
    config.write_text(config.read_text().replace("hidden_size = 32", "hidden_size = 48", 1))
    _rehash(copy)
    model = build_model(ckpt.load_config_of(copy, Config).model, "cpu", seed=None)
    with pytest.raises(UserError) as err:
        ckpt.load_checkpoint(copy, model)
    assert f"tensor {EMBEDDING} has shape [128, 32] in the checkpoint, the model built from " \
           "the config expects [128, 48]" in _only_line(err)


@pytest.mark.parametrize("text, why", [
    ("null", "holds null, not an object"),
    ('{"events": []}', "skip_samples: None is not a list"),
    ('{"skip_samples": "x", "events": []}', "skip_samples: 'x' is not a list"),
    ('{"skip_samples": [[0, 8]], "eve', "does not parse"),
    ('{"skip_samples": [[-5, 70]], "events": []}', "skip_samples[0]: [-5, 70] is not a range"),
    ('{"skip_samples": [[9, 3]], "events": []}', "skip_samples[0]: [9, 3] is not a range"),
    ('{"skip_samples": [[1, 2, 3]], "events": []}', "skip_samples[0]: [1, 2, 3] is not"),
    ('{"skip_samples": [[0.5, 2]], "events": []}', "skip_samples[0]: [0.5, 2] is not"),
    ('{"skip_samples": [], "events": {}}', "events: {} is not a list of objects"),
], ids=["null", "no skips", "skips a string", "truncated", "negative", "inverted",
        "not a pair", "float", "events an object"])
def test_a_bad_rollbacks_record_is_refused_in_one_line(tmp_path, text, why):
    """Bug: RUN/rollbacks.json was used as parsed: null or a missing key died with a
    TypeError/KeyError traceback, truncated JSON with a JSONDecodeError, and a range
    [[-5, 70]] skipped the whole run ("run complete: step 8 of 7"). Each must be one line
    naming the file and the entry."""
    (tmp_path / ROLLBACKS_FILE).write_text(text)
    with pytest.raises(UserError) as err:
        read_rollbacks(tmp_path)
    line = _only_line(err)
    assert line.startswith(f"{tmp_path / ROLLBACKS_FILE}: ") and why in line, line
    assert read_rollbacks(tmp_path / "none") == {"skip_samples": [], "events": []}


def test_the_run_checkpoint_still_verifies_and_loads(made):
    """Bug: the new checks refuse what bloomline itself writes (a save's torch.save archives,
    its trainer and RNG states)."""
    assert verify_checkpoint(made) == []
    cfg = ckpt.load_config_of(made, Config)
    model = build_model(cfg.model, "cpu", seed=None)
    optimizer = torch.optim.AdamW(model.parameters())
    state = ckpt.load_checkpoint(made, model, optimizer)
    assert TrainState.problems(state) == [] and state["step"] == STEP
    assert dataclasses.asdict(cfg.model)["hidden_size"] == 32
