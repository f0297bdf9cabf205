"""Hugging Face interop: exports load in transformers' BloomForCausalLM with the same logits,
and BLOOM folders (ours or transformers') import back exactly."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch
from safetensors.torch import load_file, save_file

from bloomline.common.errors import UserError
from bloomline.trainer.hf import (
    HFInteropError,
    bloom_config,
    export_hf,
    from_hf_state_dict,
    import_hf,
    model_config_from_bloom,
    to_hf_state_dict,
)
from bloomline.trainer.model import GPT, ModelConfig, build_model

TOLERANCE = 1e-4  # fp32, max abs over the logits


def _cfg(num_heads: int = 4, hidden_size: int = 48, **kw) -> ModelConfig:
    return ModelConfig(vocab_size=256, hidden_size=hidden_size, num_layers=2,
                       num_heads=num_heads, **kw)


@torch.no_grad()
def _perturb(model: torch.nn.Module, seed: int = 1) -> None:
    """Move LayerNorms off identity and biases off zero (the init leaves them there, where a
    swapped or dropped LayerNorm/bias would go unnoticed)."""
    generator = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():
        noise = torch.randn(p.shape, generator=generator)
        if "layernorm" in name or "ln_f" in name:
            p.add_(0.2 * noise)
        elif name.endswith("bias"):
            p.add_(0.05 * noise)


def _our_model(cfg: ModelConfig) -> GPT:
    model = build_model(cfg, seed=0)
    _perturb(model)
    return model.eval()


def _ids(cfg: ModelConfig, batch: int = 2, seq: int = 24) -> torch.Tensor:
    generator = torch.Generator().manual_seed(2)
    return torch.randint(0, cfg.vocab_size, (batch, seq), generator=generator)


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
@pytest.mark.parametrize("num_heads,hidden_size", [(4, 48), (6, 96)])
def test_export_matches_transformers_logits(tmp_path, num_heads, hidden_size, attention):
    """Bug: a wrong name map, QKV layout, ALiBi slope (non-power-of-two heads), GELU variant,
    LayerNorm epsilon or an untied head makes transformers compute different logits."""
    transformers = pytest.importorskip("transformers")
    cfg = _cfg(num_heads, hidden_size, attention=attention, layernorm_epsilon=1e-6)
    model = _our_model(cfg)
    out = export_hf(model.state_dict(), cfg, tmp_path / "hf")
    hf = transformers.BloomForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    assert hf.config.layer_norm_epsilon == 1e-6
    ids = _ids(cfg)
    with torch.no_grad():
        ours = model(ids)
        # with a mask of ones HF builds ALiBi from its cumsum, without one from arange: both
        with_mask = hf(ids, attention_mask=torch.ones_like(ids)).logits
        without_mask = hf(ids).logits
    diff = max((ours - with_mask).abs().max().item(), (ours - without_mask).abs().max().item())
    print(f"heads={num_heads} hidden={hidden_size} {attention}: max |logit diff| {diff:.2e}")
    assert diff < TOLERANCE
    assert ours.abs().max() > 0.1  # not trivially equal


def test_round_trip_is_exact(tmp_path):
    """Bug: a config field lost or mistranslated (epsilon, dropout, init std, heads), or tensors
    altered (dtype, transposed, missing) on the way out and back in."""
    cfg = _cfg(6, 48, layernorm_epsilon=1e-6, hidden_dropout=0.1, attention_dropout=0.05,
               init_std=0.01)
    model = _our_model(cfg)
    out = export_hf(model.state_dict(), cfg, tmp_path / "hf", bos_token_id=1, eos_token_id=2)
    cfg_back, state = import_hf(out)
    assert cfg_back == cfg
    reference = model.state_dict()
    assert state.keys() == reference.keys()
    for name, tensor in reference.items():
        assert torch.equal(state[name], tensor), name
    config = json.loads((out / "config.json").read_text())
    assert config["eos_token_id"] == 2 and config["n_head"] == 6
    # the tied weight once, under HF's name, with HF's format metadata
    saved = load_file(out / "model.safetensors")
    assert "lm_head.weight" not in saved and "transformer.word_embeddings.weight" in saved
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".")]  # no leftovers


def test_round_trip_default_init_and_numerics_from_base(tmp_path):
    """Bug: the default init (init_std = 0, a formula of h) comes back as a fixed number, or
    the fields BLOOM does not record (kernel, fp32 flags) cannot be carried over."""
    cfg = _cfg(attention="eager", softmax_fp32=False)
    out = export_hf(build_model(cfg).state_dict(), cfg, tmp_path / "hf")
    assert import_hf(out)[0] == replace(cfg, attention="auto", softmax_fp32=True)
    assert import_hf(out, base=ModelConfig(attention="eager", softmax_fp32=False))[0] == cfg


def test_bf16_export(tmp_path):
    """Bug: the dtype argument ignored (fp32 file labelled bf16) or imports not returned fp32."""
    cfg = _cfg()
    model = _our_model(cfg)
    out = export_hf(model.state_dict(), cfg, tmp_path / "hf", dtype=torch.bfloat16)
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"
    assert load_file(out / "model.safetensors")["transformer.ln_f.weight"].dtype == torch.bfloat16
    _, state = import_hf(out)
    expected = model.state_dict()["h.1.mlp.dense_h_to_4h.weight"].bfloat16().float()
    assert state["h.1.mlp.dense_h_to_4h.weight"].dtype == torch.float32
    assert torch.equal(state["h.1.mlp.dense_h_to_4h.weight"], expected)


def _hf_model(transformers, num_heads: int = 6, hidden_size: int = 48):
    config = transformers.BloomConfig(vocab_size=256, hidden_size=hidden_size, n_layer=2,
                                      n_head=num_heads)
    torch.manual_seed(0)
    model = transformers.BloomForCausalLM(config)
    _perturb(model, seed=3)
    return model.eval()


@pytest.mark.parametrize("shard", [False, True])
def test_transformers_save_pretrained_imports(tmp_path, shard):
    """Bug: folders written by transformers' own writer (single file or sharded index) do not
    import, or import into a model that computes different logits."""
    transformers = pytest.importorskip("transformers")
    hf = _hf_model(transformers)
    hf.save_pretrained(tmp_path, **({"max_shard_size": "20KB"} if shard else {}))
    assert (tmp_path / "model.safetensors.index.json").exists() == shard
    cfg, state = import_hf(tmp_path)
    model = GPT(cfg)
    model.load_state_dict(state)
    ids = _ids(cfg)
    with torch.no_grad():
        diff = (model.eval()(ids) - hf(ids).logits).abs().max().item()
    print(f"save_pretrained (shard={shard}) -> ours: max |logit diff| {diff:.2e}")
    assert diff < TOLERANCE
    assert hf(ids).logits.abs().max() > 0.1  # not trivially equal


def test_pytorch_model_bin_with_tied_head_imports(tmp_path):
    """Bug: a legacy pytorch_model.bin (with the tied lm_head.weight stored too) is rejected or
    its head taken for an extra tensor."""
    cfg = _cfg()
    model = _our_model(cfg)
    hf_state = to_hf_state_dict(model.state_dict())
    hf_state["lm_head.weight"] = hf_state["transformer.word_embeddings.weight"]
    torch.save(hf_state, tmp_path / "pytorch_model.bin")
    (tmp_path / "config.json").write_text(json.dumps(bloom_config(cfg)))
    cfg_back, state = import_hf(tmp_path)
    assert cfg_back == cfg and torch.equal(state["word_embeddings.weight"],
                                           model.word_embeddings.weight)


def test_state_dict_renames():
    """Bug: BloomModel-style names (no transformer. prefix) not accepted, or an untied head
    silently dropped."""
    state = build_model(_cfg()).state_dict()
    hf_state = to_hf_state_dict(state)
    assert all(name.startswith("transformer.") for name in hf_state)
    assert from_hf_state_dict(hf_state).keys() == state.keys()
    assert from_hf_state_dict(state).keys() == state.keys()  # unprefixed (BloomModel) names
    hf_state["lm_head.weight"] = torch.zeros_like(hf_state["transformer.word_embeddings.weight"])
    with pytest.raises(HFInteropError, match="lm_head.weight"):
        from_hf_state_dict(hf_state)


def test_config_that_bloom_cannot_express():
    """Bug: an MLP width other than 4h, or a post-LN residual, converted silently into a model
    that computes something else."""
    with pytest.raises(ValueError, match="ffn_hidden_size"):
        bloom_config(_cfg(ffn_hidden_size=100))
    config = bloom_config(_cfg())
    with pytest.raises(HFInteropError, match="apply_residual_connection_post_layernorm"):
        model_config_from_bloom({**config, "apply_residual_connection_post_layernorm": True})
    with pytest.raises(HFInteropError, match="n_head"):
        model_config_from_bloom({k: v for k, v in config.items() if k != "n_head"})
    # older BLOOM configs use aliases
    legacy = {k: v for k, v in config.items() if k not in ("hidden_size", "n_head")}
    assert model_config_from_bloom({**legacy, "n_embed": 48, "num_attention_heads": 4}) == _cfg()


def test_export_refuses_bad_input_and_existing_output(tmp_path):
    """Bug: an inexpressible config exported anyway, or an existing export clobbered without
    overwrite, or a failed export leaving a partial folder."""
    cfg = _cfg(ffn_hidden_size=100)
    with pytest.raises(UserError, match="ffn_hidden_size"):
        export_hf(build_model(cfg).state_dict(), cfg, tmp_path / "bad")
    assert not list(tmp_path.iterdir())  # nothing written, not even a partial folder
    cfg = _cfg()
    state = build_model(cfg).state_dict()
    out = export_hf(state, cfg, tmp_path / "hf")
    with pytest.raises(UserError, match="exists"):
        export_hf(state, cfg, out)
    del state["ln_f.bias"]
    with pytest.raises(UserError, match="ln_f.bias"):
        export_hf(state, cfg, tmp_path / "other")
    state = _our_model(cfg).state_dict()
    export_hf(state, cfg, out, overwrite=True)
    assert torch.equal(import_hf(out)[1]["ln_f.bias"], state["ln_f.bias"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf"]


def test_export_ships_the_tokenizer(tmp_path, tiny_tokenizer):
    """Bug: the SentencePiece model not shipped with the export (sentencepiece users and our
    generate read it), or config.json's special ids not the tokenizer's."""
    from bloomline.dataprep.tokenizer import load_tokenizer

    cfg = ModelConfig(vocab_size=512, hidden_size=48, num_layers=2, num_heads=4)
    out = export_hf(build_model(cfg).state_dict(), cfg, tmp_path / "hf",
                    tokenizer=load_tokenizer(tiny_tokenizer))
    assert (out / "tokenizer.model").read_bytes() == tiny_tokenizer.read_bytes()
    assert (out / "tokenizer.json").is_file()
    config = json.loads((out / "config.json").read_text())
    assert (config["bos_token_id"], config["eos_token_id"], config["pad_token_id"]) == (1, 2, 3)


def test_import_errors_name_the_file_and_field(tmp_path):
    """Bug: bad folders fail deep inside safetensors/torch, or load half a model, instead of
    a one-line UserError naming the file and the field or tensor."""
    with pytest.raises(UserError, match="config.json"):
        import_hf(tmp_path)
    cfg = _cfg()
    out = export_hf(build_model(cfg).state_dict(), cfg, tmp_path / "hf")
    config = json.loads((out / "config.json").read_text())

    (out / "config.json").write_text(json.dumps({**config, "model_type": "gpt2"}))
    with pytest.raises(UserError, match="config.json.*model_type.*gpt2"):
        import_hf(out)

    (out / "config.json").write_text(json.dumps({**config, "n_head": 6}))  # 48 / 6 still fits
    tensors = load_file(out / "model.safetensors")
    partial = {k: v for k, v in tensors.items() if k != "transformer.h.1.self_attention.dense.bias"}
    save_file(partial, out / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(UserError, match="model.safetensors.*transformer.h.1.self_attention"
                                        ".dense.bias"):
        import_hf(out)

    save_file(tensors, out / "model.safetensors", metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps({**config, "hidden_size": 96}))
    with pytest.raises(UserError, match="model.safetensors.*shape"):
        import_hf(out)

    (out / "model.safetensors").unlink()
    with pytest.raises(UserError, match="no weights"):
        import_hf(out)
