"""Hostile transformers folders given to ``checkpoint.init_from``: every bad config value,
weight file, shard index or tensor is refused in one line naming the file and the field or
tensor, before anything of the size the folder claims is allocated."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from bloomline.common.errors import UserError
from bloomline.trainer.config import Config
from bloomline.trainer.hf import export_hf, import_hf, load
from bloomline.trainer.model import ModelConfig, build_model
from bloomline.trainer.model_source import resolve_model_settings

_CFG = ModelConfig(vocab_size=128, hidden_size=32, num_layers=1, num_heads=4)


@pytest.fixture(scope="module")
def good_folder(tmp_path_factory) -> Path:
    """A small valid BLOOM folder (model.safetensors), copied by each test before it spoils it."""
    return export_hf(build_model(_CFG, seed=0).state_dict(), _CFG,
                     tmp_path_factory.mktemp("hf") / "good")


@pytest.fixture
def folder(good_folder, tmp_path) -> Path:
    return Path(shutil.copytree(good_folder, tmp_path / "model"))


def _edit_config(folder: Path, **fields) -> None:
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **fields}))


def _refused(folder: Path, pattern: str) -> str:
    """import_hf's error: a UserError of one line that matches ``pattern``."""
    with pytest.raises(UserError, match=pattern) as caught:
        import_hf(folder)
    message = str(caught.value)
    assert "\n" not in message
    return message


@pytest.mark.parametrize("field,value,expected", [
    ("n_head", 0, "n_head = 0: must be >= 1"),
    ("hidden_size", 0, "hidden_size = 0: must be >= 1"),
    ("hidden_size", -32, "hidden_size = -32: must be >= 1"),
    ("n_layer", 0, "n_layer = 0: must be >= 1"),
    ("vocab_size", -1, r"vocab_size = -1: must be in \[1, 2\*\*31 - 1\]"),
    ("layer_norm_epsilon", 0, "layer_norm_epsilon = 0.0: must be > 0"),
    ("hidden_dropout", 1.5, r"hidden_dropout = 1.5: must be in \[0, 1\)"),
    ("n_head", True, "n_head = True: expected int"),
    ("n_layer", 1.0, "n_layer = 1.0: expected int"),
    ("hidden_size", "32", "hidden_size = '32': expected int"),
    ("n_layer", 10**30, f"n_layer = {10**30}: does not fit in a 64-bit integer"),
])
def test_out_of_range_or_mistyped_config_fields_are_one_line(folder, field, value, expected):
    """Bug: n_head 0 raised ZeroDivisionError, a negative hidden_size a math domain error,
    and a zero epsilon or a dropout of 1.5 built a model that computes NaN."""
    _edit_config(folder, **{field: value})
    assert "config.json" in _refused(folder, expected)


def test_nan_and_infinity_in_config_json_are_refused(folder):
    """Bug: JSON's NaN/Infinity (which Python's json reads) passed as layer_norm_epsilon."""
    text = (folder / "config.json").read_text()
    config = json.loads(text)
    (folder / "config.json").write_text(
        text.replace(f'"layer_norm_epsilon": {config["layer_norm_epsilon"]}',
                     '"layer_norm_epsilon": NaN'))
    _refused(folder, "config.json: layer_norm_epsilon = nan: not a finite number")


@pytest.mark.parametrize("field,value", [("hidden_size", 10**7), ("n_layer", 10**6)])
def test_a_config_its_weights_cannot_back_is_refused_before_allocating(folder, tmp_path, field,
                                                                      value):
    """Bug: hidden_size 10**7 or n_layer 10**6 in config.json built (or tried to allocate) a
    model of ~10**15 parameters before the weights were compared with it; the run's own
    settings step (before the model is built) must refuse it too."""
    _edit_config(folder, **{field: value}, n_head=4)
    message = _refused(folder, r"config.json: describes .* parameters .* more than "
                               r"model.safetensors's .* of weights can hold")
    assert field in message
    cfg = Config()
    cfg.checkpoint.init_from, cfg.checkpoint.resume = str(folder), "none"
    with pytest.raises(UserError, match="describes .* parameters"):
        resolve_model_settings(cfg)


def test_a_model_larger_than_the_machines_memory_is_refused_naming_both(folder, monkeypatch):
    """Bug: a folder whose fp32 model exceeds this machine's memory was loaded anyway (an
    out-of-memory kill or a traceback deep in torch instead of a message)."""
    monkeypatch.setattr(load, "memory_limit", lambda: 10_000)
    params = _CFG.num_parameters()
    _refused(folder, f"loading its {params:,}-parameter model needs .* more than this "
                     r"machine's 9\.8 KiB of memory")


def test_the_machines_memory_is_known():
    """Bug: the memory check silently disabled (no size read on Linux)."""
    memory = load.memory_limit()  # Linux: /proc/meminfo
    assert memory is not None and memory > 2**20


def _weights(folder: Path) -> dict[str, torch.Tensor]:
    return load_file(folder / "model.safetensors")


@pytest.mark.parametrize("content,expected", [
    ("list", "holds a list, not a state dict"),
    ("tuple", "holds a tuple, not a state dict"),
    ("dict with a number", "entry 'step' is a int, not a tensor"),
])
def test_pytorch_model_bin_that_is_not_a_state_dict_is_one_line(folder, content, expected):
    """Bug: a pytorch_model.bin holding a list (or a dict of non-tensors) failed with
    AttributeError: 'list' object has no attribute 'items'."""
    tensors = _weights(folder)
    (folder / "model.safetensors").unlink()
    # each holds the model's tensors (the file has the model's size): only its shape is wrong
    payload = {"list": list(tensors.values()), "tuple": tuple(tensors.values()),
               "dict with a number": {**tensors, "step": 7}}[content]
    torch.save(payload, folder / "pytorch_model.bin")
    _refused(folder, "pytorch_model.bin: " + expected)


class NotAllowlisted:
    """A class no library adds to torch's weights-only allowlist (megatron-core, imported by
    the compatibility tests, allowlists pathlib.PosixPath for the whole process)."""


def test_pytorch_model_bin_stays_weights_only(folder):
    """Bug: the .bin loader unpickling arbitrary objects (code execution) instead of torch's
    restricted weights-only loader, or its refusal printed as torch's page of advice (with
    terminal escapes) to turn that loader off."""
    tensors = _weights(folder)
    (folder / "model.safetensors").unlink()
    torch.save({**tensors, "evil": NotAllowlisted()}, folder / "pytorch_model.bin")
    message = _refused(folder, r"pytorch_model.bin: holds more than tensors \(torch's "
                               "weights-only loader: Unsupported global: GLOBAL "
                               r".*NotAllowlisted")
    assert "\x1b" not in message and "weights_only" not in message


def _sharded(folder: Path, weight_map) -> None:
    (folder / "model.safetensors").rename(folder / "model-00001-of-00001.safetensors")
    (folder / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": weight_map}))


@pytest.mark.parametrize("bad", ["list", "dotdot", "absolute", "subfolder"])
def test_index_entries_must_be_file_names_in_the_folder(folder, tmp_path, bad):
    """Bug: a weight_map that is a list raised AttributeError, '../../etc/passwd' an
    IndexError from torch.load, and an absolute path silently loaded a file from another
    folder."""
    elsewhere = export_hf(build_model(_CFG, seed=1).state_dict(), _CFG, tmp_path / "other")
    names = list(_weights(folder))
    shard = {"list": None, "dotdot": "../../../../etc/passwd",
             "absolute": str(elsewhere / "model.safetensors"),
             "subfolder": "sub/model.safetensors"}[bad]
    weight_map = (["model-00001-of-00001.safetensors"] if bad == "list" else
                  {**dict.fromkeys(names, "model-00001-of-00001.safetensors"), names[0]: shard})
    _sharded(folder, weight_map)
    pattern = ("weight_map is list" if bad == "list" else
               f"weight_map\\['{names[0]}'\\] = .*: a shard must be a file name")
    assert "model.safetensors.index.json" in _refused(folder, pattern)


def test_index_shard_that_is_not_a_regular_file_is_one_line(folder):
    """Bug: a shard named in the index that is a folder (or missing) failed inside
    safetensors instead of naming the entry."""
    names = list(_weights(folder))
    (folder / "shard2.safetensors").mkdir()
    _sharded(folder, {**dict.fromkeys(names, "model-00001-of-00001.safetensors"),
                      names[0]: "shard2.safetensors"})
    _refused(folder, "shard2.safetensors: the weight shard of model.safetensors.index.json is a "
                     "folder")


def test_a_valid_sharded_folder_still_loads(folder):
    """Bug: the index checks refusing transformers' own shard names."""
    _sharded(folder, dict.fromkeys(_weights(folder), "model-00001-of-00001.safetensors"))
    cfg, state = import_hf(folder)
    assert cfg.num_layers == 1 and len(state) == len(build_model(_CFG).state_dict())


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_non_finite_weights_are_refused_naming_the_tensor(folder, value):
    """Bug: a folder with NaN/inf weights started a run that skipped every step as
    non-finite, saved the NaN weights and reported "completed"."""
    tensors = _weights(folder)
    name = "transformer.h.0.mlp.dense_4h_to_h.weight"
    tensors[name][3, 5] = value
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    _refused(folder, f"model.safetensors: {name} holds NaN or inf")


def test_integer_weights_are_refused(folder):
    """Bug: an integer tensor of the right shape silently converted to float weights."""
    tensors = _weights(folder)
    tensors["transformer.ln_f.bias"] = tensors["transformer.ln_f.bias"].to(torch.int64)
    tensors["pad"] = torch.zeros(_CFG.num_parameters())
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    _refused(folder, "transformer.ln_f.bias is int64; model weights are floating point")
