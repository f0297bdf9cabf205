"""A model whose fp32 initialization cannot fit the machine is refused before allocating."""

from __future__ import annotations

import pytest
import torch

from bloomline.common.errors import UserError
from bloomline.trainer import build
from bloomline.trainer.model import ModelConfig


def test_a_model_too_large_for_the_machine_is_refused_in_one_line(monkeypatch):
    """Bug: `model.hidden_size=65536 model.num_layers=64` (a typo's scale) on a 24 GiB machine
    died in the allocator (MemoryError traceback, or the out-of-memory killer) while building
    the model: it must be one line naming the parameter count, the bytes and the memory."""
    huge = ModelConfig(vocab_size=128, hidden_size=65536, num_layers=64, num_heads=4)
    monkeypatch.setattr(build, "memory_limit", lambda: 24 * 2**30)
    with pytest.raises(UserError, match=r"model: 3,298,598,060,032 parameters \(hidden_size "
                                        r"65536, num_layers 64, vocab_size 128\) need 12\.0 TiB "
                                        r"to initialize in fp32, more than this machine's "
                                        r"memory \(24\.0 GiB\)"):
        build.check_model_fits(huge, torch.device("cpu"))
    small = ModelConfig(vocab_size=128, hidden_size=32, num_layers=2, num_heads=4)
    build.check_model_fits(small, torch.device("cpu"))  # fits: no error
