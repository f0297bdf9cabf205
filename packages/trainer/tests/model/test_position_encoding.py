"""The position-encoding seam (model/position.py): attention takes its bias, score_mod and
rotation from the encoding, ALiBi fills it, and other names are refused clearly."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from bloomline.common.config_loader import config_from_dict
from bloomline.common.errors import UserError
from bloomline.trainer.config import Config
from bloomline.trainer.hf import HFInteropError, bloom_config
from bloomline.trainer.model import ModelConfig, alibi_bias, alibi_slopes, position
from bloomline.trainer.model.attention import Attention


class _DoubledQueries:
    """A stand-in encoding with no bias of its own (the causal mask only) that rotates: it
    doubles q, which any real rotation would not, so the test can tell it was applied."""

    rotates_qk = True

    def bias(self, total_heads, head_start, head_end, seq_length, device, dtype):
        mask = torch.ones(seq_length, seq_length, dtype=torch.bool, device=device).triu(1)
        return torch.zeros(1, seq_length, seq_length, device=device).masked_fill(
            mask, float("-inf")).to(dtype)

    def score_mod(self, total_heads, head_start, head_end, device):
        return None

    def rotate(self, q, k):
        return 2 * q, k


def test_alibi_fills_the_seam_with_its_bias():
    """Bug: the seam's ALiBi bias differing from ``alibi_bias`` for a tensor-parallel head
    range (the wrong heads' slopes, or no causal mask)."""
    encoding = position.position_encoding("alibi")
    assert not encoding.rotates_qk
    got = encoding.bias(6, 2, 5, 16, "cpu", torch.float32)
    assert torch.equal(got, alibi_bias(alibi_slopes(6, 2, 5), 16))


@pytest.mark.parametrize("kernel", ["eager", "sdpa"])
def test_attention_goes_through_the_encoding(kernel, monkeypatch):
    """Bug: attention special-casing ALiBi (adding its own bias, or sending the unrotated
    QKV to the fused CPU core) instead of using the encoding a config names: a new encoding
    would then be silently ignored."""
    monkeypatch.setitem(position.ENCODINGS, "doubled", _DoubledQueries)
    torch.manual_seed(0)
    cfg = dataclasses.replace(ModelConfig(hidden_size=48, num_heads=4, attention=kernel),
                              position_encoding="doubled")
    layer = Attention(cfg)
    x = torch.randn(2, 12, 48)
    with torch.no_grad():
        q, k, v = layer._split_heads(layer.query_key_value(x))
        expected = F.scaled_dot_product_attention(2 * q, k, v, is_causal=True)
        expected = layer.dense(layer._merge_heads(expected))
        torch.testing.assert_close(layer(x), expected, atol=1e-5, rtol=1e-5)


def test_unknown_position_encoding_is_refused_with_the_known_names():
    """Bug: a typo in ``model.position_encoding`` training with ALiBi anyway, or failing
    deep in the model with a KeyError instead of one line naming the accepted values."""
    with pytest.raises(UserError, match="position_encoding.*alibi"):
        config_from_dict(Config, {"model": {"position_encoding": "rope"}}, "test")
    with pytest.raises(ValueError, match="'rope': unknown; one of 'alibi'"):
        position.position_encoding("rope")


def test_hf_export_refuses_an_encoding_bloom_lacks():
    """Bug: exporting a model trained with another position encoding as a BLOOM folder,
    which transformers would load and run with ALiBi (wrong outputs, no error)."""
    cfg = dataclasses.replace(ModelConfig(hidden_size=48, num_heads=4),
                              position_encoding="rope")
    with pytest.raises(HFInteropError, match="position_encoding"):
        bloom_config(cfg)
