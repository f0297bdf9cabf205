"""`trainer plan`: the dry run of a recipe at its full world size from the command line.

Every rank here is built on meta tensors under a fake process group (seconds for 176B), with
the formulas' memory (``--no-trace``); the traced step is tested on a tiny recipe at 8 ranks
(it takes tens of seconds per 176B rank).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from bloomline.common.errors import UserError
from bloomline.trainer.cli import app

CONFIGS = Path(__file__).resolve().parents[4] / "configs"
BLOOM = str(CONFIGS / "176b.toml")
SEVEN_B = str(CONFIGS / "7b1.toml")
GIB = 2 ** 30


def _plan(*args: str, config: str = BLOOM) -> dict:
    result = CliRunner().invoke(app, ["plan", "--config", config, "--json", "--no-trace", *args])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def test_bloom_176b_plan_at_384_gpus_reports_each_rank_and_the_time_model():
    """The bug: `trainer plan` of the 176B recipe not building its stated 384-rank world (the
    recipe's parallel.world_size ignored), putting the head anywhere but the last rank, reporting
    memory that does not add up to its total or that disagrees with the ZeRO formula, or a
    JSON without the fields scripts read (ranks[].memory_bytes, fits, step_time_s, mfu)."""
    plan = _plan()
    assert plan["world_size"] == 384
    assert plan["layout"] == {"pp": 12, "dp": 8, "tp": 4}
    assert [r["rank"] for r in plan["ranks"]] == [0, 192, 383]
    first, middle, last = plan["ranks"]
    assert "embedding" in first["holds"] and "head" in last["holds"]
    assert middle["holds"] == [] and middle["stage"] == 6
    for rank in plan["ranks"]:
        memory = rank["memory_bytes"]
        # the logits and the recompute workspace never coexist: the larger counts
        exclusive = ("logits", "temporary")  # the recompute workspace, under its traced name
        assert memory["total"] == sum(v for k, v in memory.items()
                                      if k not in (*exclusive, "total")) + max(
            memory[k] for k in exclusive)
        assert memory["activations"] > 0 and memory["optimizer"] > 0
        assert rank["device_bytes"] == 80 * GIB and rank["fits"]
        # the build and the ZeRO formula agree on the model states within 1%
        assert rank["model_states_built_over_formula"] == pytest.approx(1.0, abs=0.01)
    assert last["memory_bytes"]["logits"] > 0 == first["memory_bytes"]["logits"]
    # BLOOM-176B's published ~150 TFLOP/s per GPU and a step of about 100-110 s
    assert 120 < plan["tflops_per_gpu"] < 180
    assert 80 < plan["step_time_s"] < 140
    assert 0 < plan["mfu"] < 1


def test_7b1_plans_and_configures_the_layout_its_fields_state():
    """The bug: `trainer plan` approving tp4 pp2 dp4 from a comment while `trainer
    config` (what pretrain runs) showed tp1 pp1: the plan and the run must read the same
    [parallel] fields, world 32 = tp4 x pp2 x dp4, with no note of another world."""
    plan = _plan("--rank", "0", config=SEVEN_B)
    assert plan["world_size"] == 32 and plan["note"] is None
    assert plan["layout"] == {"pp": 2, "dp": 4, "tp": 4}
    shown = CliRunner().invoke(app, ["config", "--config", SEVEN_B, "--json"])
    assert shown.exit_code == 0, shown.output
    parallel = json.loads(shown.output)["parallel"]
    assert (parallel["world_size"], parallel["tensor_parallel"],
            parallel["pipeline_parallel"]) == (32, 4, 2)


def test_nodes_plan_another_world_keeping_tp_and_pp_and_say_so():
    """The bug: `--nodes 8` dropping the recipe's layout silently (planning tp1 pp1
    dp64 of 7b1), or planning another world without saying that it is not the recipe's. The
    world becomes 8 x 8 = 64, tp4 pp2 kept, dp 8, and one line says so (in the text output
    first, as `note` in the JSON)."""
    note = "planning 64 GPUs (--nodes 8 x 8; the recipe states parallel.world_size 32)"
    plan = _plan("--nodes", "8", "--rank", "0", config=SEVEN_B)
    assert plan["world_size"] == 64 and plan["layout"] == {"pp": 2, "dp": 8, "tp": 4}
    assert plan["note"] == note
    text = CliRunner().invoke(app, ["plan", "--config", SEVEN_B, "--nodes", "8", "--rank", "0",
                                    "--no-trace"])
    assert text.exit_code == 0, text.output
    assert text.output.splitlines()[:2] == [
        note, "64 x a100-80gb (80 GiB): pp2 x dp8 x tp4, 64 micro-batches per step on each "
        "pipeline"]


def test_a_recipe_without_a_world_needs_nodes():
    """The bug: a recipe that states no parallel.world_size planned at some made-up world
    (or failing with a traceback) when no --nodes is given: one line saying what to give."""
    result = CliRunner().invoke(app, ["plan", "--config", SEVEN_B, "--no-trace",
                                      "parallel.world_size=0"])
    assert result.exit_code != 0 and isinstance(result.exception, (UserError, SystemExit))
    text = str(result.exception) + result.output
    assert "no world to plan: set parallel.world_size in the recipe (or override it), or give " \
           "--nodes N (and --gpus-per-node)" in text, text


def test_the_same_model_on_one_tensor_parallel_rank_does_not_fit():
    """The bug: a planner that calls every layout fitting. BLOOM-176B with tp 1 (dp 32) holds
    four times the model states per rank: more than an 80 GB A100."""
    plan = _plan("--rank", "0", "parallel.tensor_parallel=1", "parallel.sequence_parallel=false")
    assert plan["layout"]["tp"] == 1 and plan["layout"]["dp"] == 32
    assert not plan["ranks"][0]["fits"]


def test_nodes_and_gpu_options_and_their_errors():
    """The bug: --nodes / --gpus-per-node not setting the world, a --gpu-set override
    ignored, or a bad rank, device or override ending in a traceback instead of one line."""
    plan = _plan("--nodes", "48", "--gpus-per-node", "8", "--gpu", "h100-80gb", "--rank", "5",
                 "--gpu-set", "network_bytes_per_s=1e10")
    assert plan["world_size"] == 384 and [r["rank"] for r in plan["ranks"]] == [5]
    assert plan["device"]["name"] == "h100-80gb"
    assert plan["device"]["network_bytes_per_s"] == 1e10
    for args, message in ((["--rank", "384"], "outside a world of 384"),
                          (["--gpu", "tpu-v9"], "unknown device"),
                          (["--gpu-set", "bandwidth"], "expected FIELD=VALUE"),
                          (["--nodes", "47"], "not divisible")):
        result = CliRunner().invoke(app, ["plan", "--config", BLOOM, *args])
        assert result.exit_code != 0
        assert isinstance(result.exception, (UserError, SystemExit)), result.exception
        text = str(result.exception) + result.output
        assert message in text, text


def test_search_ranks_fitting_layouts_and_places_the_recipes_own():
    """The bug: --search offering a layout that does not fit (or one the trainer would
    refuse: tp not dividing the heads or crossing a node, a batch that does not split),
    ranking by anything but predicted speed, or losing the recipe's own layout (BLOOM's
    tp4 pp12 dp8 ZeRO-1 micro-batch 2 full recomputation fits, so it must be ranked)."""
    plan = _plan("--search")
    top = plan["top"]
    assert len(top) == 5 and plan["fitting"] >= 5
    speeds = [c["tokens_per_s"] for c in top]
    assert speeds == sorted(speeds, reverse=True)
    for c in top:
        assert c["memory_bytes"] <= 0.9 * 80 * GIB
        assert 112 % c["tp"] == 0 and c["tp"] <= 8
        assert c["tp"] * c["pp"] * c["dp"] == 384
        assert 2048 % (c["dp"] * c["micro_batch"]) == 0
    assert isinstance(plan["recipe_rank"], int) and 1 <= plan["recipe_rank"] <= plan["fitting"]
    assert plan["dropped"]["does not fit the device memory"] > 0
    # on 40 GB devices fewer layouts fit
    smaller = _plan("--search", "--gpu", "a100-40gb")
    assert smaller["fitting"] < plan["fitting"]


@pytest.mark.slow
@pytest.mark.compat
def test_traced_plan_of_a_three_dimensional_tiny_layout(tmp_path):
    """The bug: the traced step failing on a pipelined, tensor-parallel, ZeRO-1 rank (a
    fake tensor reaching code that reads values, a second rank handed the first one's
    process groups), a stage holding the wrong number of micro-batches, or a traced total
    that is not what decides "fits". Tiny recipe, pp2 x dp2 x tp2 (8 ranks): every rank
    traced, the first stage holding 2 micro-batches in flight (1F1B: pp - stage), the last 1."""
    recipe = tmp_path / "tiny3d.toml"
    recipe.write_text((CONFIGS / "tiny-cpu.toml").read_text(encoding="utf-8").replace(
        "vocab_size = 0 ", "vocab_size = 8064 "), encoding="utf-8")
    result = CliRunner().invoke(app, [
        "plan", "--config", str(recipe), "--json", "--nodes", "1", "parallel.tensor_parallel=2",
        "parallel.pipeline_parallel=2", "parallel.zero_stage=1", "train.micro_batch_size=4"])
    assert result.exit_code == 0, result.output
    plan = json.loads(result.output)
    assert plan["traced"] and plan["layout"] == {"pp": 2, "dp": 2, "tp": 2}
    first, middle, last = plan["ranks"]
    assert [first["traced_micro_batches"], last["traced_micro_batches"]] == [2, 1]
    for rank in plan["ranks"]:
        traced = rank["traced_memory_bytes"]
        assert rank["memory_bytes"] == traced
        assert traced["activations"] > 0 and traced["parameters"] > 0
        assert traced["total"] >= sum(v for k, v in traced.items() if k != "total") * 0.999
        assert rank["fits"] == (traced["total"] <= rank["device_bytes"])
        # tiny layers: the formulas and the trace agree within a factor of two
        assert 0.5 < rank["traced_over_formula"] < 2.0
