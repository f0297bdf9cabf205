"""Every recipe in configs/ built at its stated world size, rank by rank, without the hardware.

Each recipe states the world its layout is for as ``[parallel]`` fields (``world_size``, and
``tensor_parallel`` / ``pipeline_parallel`` where not 1), which ``trainer pretrain`` holds a
run to and ``trainer plan`` plans. For the first, a middle and the last rank, and for one rank
of every pipeline stage, the rank is built through the trainer's own path on the meta device under a
fake process group (``bloomline.trainer.plan.rank_build``) and checked: the stages partition
the layers, the embedding / head / final norm sit where the pipeline needs them, the vocabulary
is split over tp, and the model states fit the recipe's GPU with room for activations.
"""

from __future__ import annotations

import functools
from pathlib import Path

import pytest

from bloomline.common.errors import UserError
from bloomline.trainer.config import load_trainer_config
from bloomline.trainer.plan.planner import activation_breakdown, formula_layout
from bloomline.trainer.plan.rank_build import RankPlan, build_rank

CONFIGS = Path(__file__).resolve().parents[4] / "configs"
RECIPES = sorted(p.stem for p in CONFIGS.glob("*.toml"))

# Device memory each recipe is meant for (bytes). Vendor capacities, not measurements: an
# A100-80GB has 80 GiB; tiny-cpu runs on a CPU, given a modest 8 GiB here.
DEVICE_MEMORY = {"A100-80GB": 80 * 2 ** 30, "cpu": 8 * 2 ** 30}
RECIPE_DEVICE = {"tiny-cpu": "cpu"}  # every other recipe: A100-80GB
# Share of device memory the model states and the activations may take together: the rest is
# for the allocator's fragmentation, communication buffers and the CUDA context.
MEMORY_SHARE = 0.9
# tiny-cpu sizes its vocabulary from the demo's tokenizer (model.vocab_size = 0), which a test
# run does not build: a stand-in size, a multiple of 128 as the trainer pads to
STAND_IN = {"tiny-cpu": ["model.vocab_size=4096"]}

@functools.cache
def _cfg(name: str):
    overrides = STAND_IN.get(name, [])
    world = load_trainer_config(CONFIGS / f"{name}.toml", overrides).parallel.world_size
    assert world, f"configs/{name}.toml states no parallel.world_size"
    return world, overrides


def test_recipes_state_their_layout_as_settings_not_comments():
    """The bug: a recipe stating its world and layout in a comment that `trainer
    plan` parsed and `trainer pretrain` ignored (7b1's comment said tp4 pp2, its config ran tp1
    pp1). Every recipe sets parallel.world_size, and nothing in configs/ (the SLURM scripts
    included) says "world size" in a comment any more."""
    stale = [f"{path.relative_to(CONFIGS.parent)}:{number}"
             for path in sorted(CONFIGS.rglob("*")) if path.is_file()
             for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
             if "world size" in line.lower()]
    assert not stale, stale
    assert all(_cfg(name)[0] > 0 for name in RECIPES)


@functools.cache
def plan(name: str, rank: int) -> RankPlan:
    world, overrides = _cfg(name)
    return build_rank(load_trainer_config(CONFIGS / f"{name}.toml", overrides), world, rank)


def _ranks_to_check(name: str) -> list[int]:
    """First, middle, last rank, and the (dp 0, tp 0) rank of every pipeline stage."""
    world, _ = _cfg(name)
    first = plan(name, 0)
    per_stage = first.dp * first.tp
    return sorted({0, world // 2, world - 1, *range(0, world, per_stage)})


@pytest.mark.parametrize("name", [pytest.param(name, marks=pytest.mark.slow) if name == "176b"
                                  else name for name in RECIPES])
def test_stages_partition_layers_and_hold_the_ends(name):
    """The bug: a recipe whose layout breaks at its real world size (a divisibility the
    single-process runs never meet), a pipeline split that drops or repeats a block, an
    embedding / head / final norm on the wrong stage, or a vocabulary not split over tp."""
    world, overrides = _cfg(name)
    cfg = load_trainer_config(CONFIGS / f"{name}.toml", overrides)
    plans = [plan(name, r) for r in _ranks_to_check(name)]
    first = plans[0]
    assert first.world_size == world
    # the pp slice of dp 0 / tp 0: one rank per stage, together every block exactly once
    slice_ = [p for p in plans if p.coords[1:] == (0, 0)]
    assert sorted(p.coords[0] for p in slice_) == list(range(first.pp))
    held = [i for p in slice_ for i in p.layers]
    assert sorted(held) == list(range(cfg.model.num_layers)), "blocks lost or repeated"
    assert sorted(i for stage in first.stage_layers for i in stage) == sorted(held)
    padded_vocab = cfg.model.vocab_size
    for p in plans:
        pp_rank = p.coords[0]
        first_stage, last_stage = pp_rank == 0, pp_rank == p.pp - 1
        assert p.has_embedding == first_stage, p.describe()
        assert p.has_head == last_stage and p.has_final_norm == last_stage, p.describe()
        if first_stage or last_stage:
            assert p.embedding_rows * p.tp == padded_vocab, p.describe()
        else:
            assert p.embedding_rows == 0, p.describe()


@pytest.mark.parametrize("name", RECIPES)
def test_model_states_and_activations_fit_the_device(name):
    """The bug: a recipe whose parameters, gradients, optimizer state and working copies (what
    this trainer keeps per rank at its precision and ZeRO stage) plus the activations of the
    micro-batches its schedule keeps in flight (Korthikanti et al.'s formula) do not fit its
    GPU, found only once 384 GPUs are allocated."""
    world, overrides = _cfg(name)
    cfg = load_trainer_config(CONFIGS / f"{name}.toml", overrides)
    budget = MEMORY_SHARE * DEVICE_MEMORY[RECIPE_DEVICE.get(name, "A100-80GB")]
    for rank in _ranks_to_check(name):
        p = plan(name, rank)
        assert p.local_parameters > 0
        activations = sum(activation_breakdown(formula_layout(cfg, p), p).values())
        assert activations > 0
        used = p.model_state_bytes + activations
        assert used <= budget, (f"configs/{name}.toml:\n{p.describe()}\n"
                                f"activations {activations:,.0f}")


def test_divisibility_at_384_ranks_is_a_clear_error():
    """The bug: a layout that does not divide the world (or the batch), or a world that is
    not the recipe's parallel.world_size, failing deep inside mesh or FSDP code (or building)
    instead of naming the fields to fix."""
    cfg = load_trainer_config(CONFIGS / "176b.toml", ["parallel.world_size=380"])
    with pytest.raises(UserError, match="world size 380 is not divisible by"):
        build_rank(cfg, 380, 0)
    with pytest.raises(UserError, match="parallel.world_size 384 .* this run has 380"):
        build_rank(load_trainer_config(CONFIGS / "176b.toml"), 380, 0)
    cfg = load_trainer_config(CONFIGS / "176b.toml", ["parallel.pipeline_parallel=1"])
    with pytest.raises(UserError, match="not a multiple of train.micro_batch_size"):
        build_rank(cfg, 384, 0)  # dp 96 x micro-batch 2 does not divide the ramp-up's 16
