"""The model on the meta device, the recipes' sizes, and the config tree's errors."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from bloomline.common.config_loader import load_config, to_toml
from bloomline.common.errors import UserError
from bloomline.trainer.config import Config, load_trainer_config
from bloomline.trainer.model import GPT, ModelConfig, build_model, padded_vocab_size
from bloomline.trainer.run_spec import load_run

CONFIGS = Path(__file__).resolve().parents[4] / "configs"

# published parameter counts (BLOOM model cards) or nominal sizes (GPT-3 table)
SIZES = {"125m": (125e6, 0.05), "350m": (350e6, 0.05), "1b3": (1.3e9, 0.05),
         "7b1": (7_069_016_064, 0), "176b": (176_247_271_424, 0)}


@pytest.mark.parametrize("name", sorted(SIZES))
def test_recipe_builds_on_meta_with_the_published_size(name):
    """Catches: a recipe with a wrong layer count/width (BLOOM-176B: 70 x 14336, 112 heads,
    vocab 250880) or a model that allocates memory before parallelism is applied."""
    cfg = load_trainer_config(CONFIGS / f"{name}.toml")
    with torch.device("meta"):
        model = GPT(cfg.model)
    count = sum(p.numel() for p in model.parameters())
    assert count == cfg.model.num_parameters()
    published, tolerance = SIZES[name]
    assert abs(count - published) <= tolerance * published, count
    assert all(p.is_meta for p in model.parameters())


def test_vocabulary_padding_is_megatrons():
    """Catches: padding to 128 without the tensor-parallel factor (shards of unequal size)."""
    assert padded_vocab_size(250680) == 250752
    assert padded_vocab_size(250680, tensor_parallel=4) == 250880  # BLOOM trained with TP 4
    assert padded_vocab_size(8000, tensor_parallel=4) == 8192


def test_init_is_blooms_small_init_with_scaled_output_projections():
    """Catches: default PyTorch init (uniform, kaiming) surviving the meta-device build, or
    the residual-writing projections not scaled by 1/sqrt(2 L)."""
    cfg = ModelConfig(vocab_size=512, hidden_size=256, num_layers=8, num_heads=4)
    model = build_model(cfg, seed=0)
    std = (2 / (5 * 256)) ** 0.5
    assert abs(model.h["0"].mlp.dense_h_to_4h.weight.std().item() - std) < 0.05 * std
    assert abs(model.h["0"].mlp.dense_4h_to_h.weight.std().item() - std / 4) < 0.05 * std / 4
    assert model.h["0"].self_attention.dense.bias.abs().max() == 0
    assert torch.equal(model.ln_f.weight, torch.ones(256))
    again = build_model(cfg, seed=0)
    assert torch.equal(again.word_embeddings.weight, model.word_embeddings.weight)


def test_bf16_autocast_keeps_fp32_masters_and_fp32_grads():
    """Catches: bf16 gradients accumulating in bf16 (Megatron's main_grad is fp32) or a
    residual stream silently in bf16 when residual_fp32 is on."""
    model = build_model(ModelConfig(vocab_size=128, hidden_size=32, num_layers=2, num_heads=4))
    ids = torch.randint(0, 128, (2, 16))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        stream = model.embed(ids)
        logits = model(ids)
    assert stream.dtype == torch.float32 and logits.dtype == torch.bfloat16
    logits.float().sum().backward()
    assert all(p.dtype == torch.float32 and p.grad.dtype == torch.float32
               for p in model.parameters())


def test_unknown_key_names_the_closest_valid_one(tmp_path):
    """Catches: a typo in a recipe silently ignored (the run trains with the default)."""
    recipe = tmp_path / "r.toml"
    recipe.write_text("[optimizer]\nlearning_rate = 1e-3\n")
    with pytest.raises(UserError, match=r"r.toml: unknown config key optimizer.learning_rate"):
        load_trainer_config(recipe)
    with pytest.raises(UserError, match="did you mean model.num_layers"):
        load_trainer_config(None, ["model.num_layer=3"])


def test_wrong_types_and_cross_field_errors_name_the_field():
    """Catches: a string where a number belongs reaching the model as a crash deep inside."""
    with pytest.raises(UserError, match="train.micro_batch_size = 'x': expected an integer"):
        load_trainer_config(None, ["train.micro_batch_size='x'"])
    with pytest.raises(UserError, match="global_batch_size 10 is not a multiple"):
        load_run(None, ["train.micro_batch_size=4", "train.global_batch_size=10"])
    with pytest.raises(UserError, match="precision.dtype = 'bf32'"):
        load_trainer_config(None, ["precision.dtype=bf32"])


def test_resolved_config_round_trips_through_toml(tmp_path):
    """Catches: the run folder's config.toml not reproducing the run (a lost override)."""
    cfg = load_trainer_config(CONFIGS / "176b.toml", ["optimizer.lr=1e-4", "data.weights={a=2}"])
    path = tmp_path / "config.toml"
    path.write_text(to_toml(cfg))
    assert load_config(Config, path) == cfg
