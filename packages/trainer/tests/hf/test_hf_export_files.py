"""The files of a ``trainer export-hf`` folder get ordinary permissions: what a plain ``open()``
gives under the process's umask, the same for every file (a team shares exports)."""

from __future__ import annotations

import os
import stat

import pytest

from bloomline.dataprep.tokenizer import load_tokenizer
from bloomline.trainer.hf import export_hf
from bloomline.trainer.model import ModelConfig, build_model, padded_vocab_size


@pytest.mark.parametrize("umask", [0o022, 0o002])
def test_every_file_of_an_export_has_the_mode_of_a_plain_open(umask, tiny_tokenizer, tmp_path):
    """Bug: model.safetensors written 0600 (safetensors saves through a private temporary
    file) while config.json and the tokenizer files get the umask's 0644 / 0664: the weights
    of a shared export unreadable by the team. Two umasks, so that neither 0600 nor a fixed
    0644 can pass."""
    tokenizer = load_tokenizer(tiny_tokenizer)
    cfg = ModelConfig(vocab_size=padded_vocab_size(tokenizer.vocab_size), hidden_size=16,
                      num_layers=1, num_heads=2)
    state = build_model(cfg, seed=0).state_dict()
    previous = os.umask(umask)
    try:
        out = export_hf(state, cfg, tmp_path / "hf", tokenizer=tokenizer)
        with open(tmp_path / "plain", "w"):
            pass
    finally:
        os.umask(previous)
    plain = stat.S_IMODE((tmp_path / "plain").stat().st_mode)
    assert plain == 0o666 & ~umask
    modes = {path.name: stat.S_IMODE(path.stat().st_mode) for path in out.iterdir()}
    assert "model.safetensors" in modes and "tokenizer.json" in modes, modes
    assert modes == dict.fromkeys(modes, plain), {k: oct(v) for k, v in modes.items()}
