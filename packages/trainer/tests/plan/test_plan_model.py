"""The analytic side of ``trainer plan``: memory formulas, step-time model, published checks."""

from __future__ import annotations

from dataclasses import replace

import pytest

from bloomline.trainer.plan.devices import DEVICES, device
from bloomline.trainer.plan.memory_formulas import (
    Layout,
    activation_bytes_per_layer,
    layers_on_stage,
    micro_batches_in_flight,
    model_state_bytes,
    rank_memory,
)
from bloomline.trainer.plan.published import (
    BLOOM_176B,
    CALIBRATION_ROW,
    EXPECTED_MISSES,
    PUBLISHED,
    implied_efficiency,
    memory_table,
    predict,
    table,
)
from bloomline.trainer.plan.time_model import (
    DEFAULT_EFFICIENCY,
    flops_per_token,
    hardware_flops_per_token,
    step_time,
)

GIB = 2**30
SMALL = Layout(layers=12, hidden=768, heads=12, vocab=50304, seq=1024, micro_batch=4,
               global_batch=64, tp=2, pp=3, dp=2)
# BLOOM-176B as this trainer would hold it: fp32 parameters and gradients, Adam m and v
BLOOM_HERE = replace(BLOOM_176B, param_bytes=4, grad_bytes=4, optimizer_bytes=8,
                     fsdp_engine=True)


def test_counts_agree_with_the_model_config():
    """Catches: the plan's parameter or FLOP count drifting from the model's own
    (ModelConfig.num_parameters / flops_per_token), so plans and run reports disagree."""
    from bloomline.trainer.model.config import ModelConfig

    for lay in (SMALL, BLOOM_176B, replace(SMALL, ffn=1000)):
        cfg = ModelConfig(vocab_size=lay.vocab, hidden_size=lay.hidden, num_layers=lay.layers,
                          num_heads=lay.heads, ffn_hidden_size=lay.ffn)
        assert lay.parameters() == cfg.num_parameters()
        assert flops_per_token(lay) == pytest.approx(cfg.flops_per_token(lay.seq), rel=1e-12)
    assert BLOOM_176B.parameters() == 176_247_271_424  # the BLOOM model card's count


def test_stage_split_is_the_trainers_uniform_split():
    """Catches: the plan putting a different number of blocks on a stage than
    parallel/partition.py's uniform split does (BLOOM's 70 blocks over 12 stages)."""
    from bloomline.trainer.parallel.partition import uniform_split

    for layers, pp in ((70, 12), (105, 35), (12, 5), (7, 7), (13, 2)):
        lay = replace(SMALL, layers=layers, pp=pp)
        assert [layers_on_stage(lay, i) for i in range(pp)] == [
            len(r) for r in uniform_split(layers, pp)]


def test_megatron_flop_count_with_full_recomputation():
    """Catches: TFLOP/s per GPU counted differently from Megatron-LM/BLOOM, whose figures
    include the recomputed forward: 96 B s l h^2 (1 + s/6h + V/16lh) per B s tokens."""
    lay = BLOOM_176B
    s, h, n, v = lay.seq, lay.hidden, lay.layers, lay.vocab
    megatron = 96 * n * h * h * (1 + s / (6 * h) + v / (16 * n * h))
    assert hardware_flops_per_token(lay) == pytest.approx(megatron, rel=1e-12)
    plain = replace(lay, recompute="none")
    assert hardware_flops_per_token(plain) == flops_per_token(plain)


def test_activation_formulas_are_korthikanti_table_2():
    """Catches: a wrong activation term (the 34 + 5as/h per-layer count, its tp and sp forms,
    selective recomputation dropping the attention scores, full keeping the input)."""
    lay = replace(SMALL, tp=1, micro_batch=1)
    s, b, h, a = lay.seq, lay.micro_batch, lay.hidden, lay.heads
    assert activation_bytes_per_layer(lay) == pytest.approx(s * b * h * (34 + 5 * a * s / h))
    assert activation_bytes_per_layer(replace(lay, sequence_parallel=True)) == pytest.approx(
        activation_bytes_per_layer(lay))
    t4 = replace(lay, tp=4)
    assert activation_bytes_per_layer(t4) == pytest.approx(
        s * b * h * (10 + 24 / 4 + 5 * a * s / (h * 4)))
    assert activation_bytes_per_layer(replace(t4, sequence_parallel=True)) == pytest.approx(
        s * b * h * (34 / 4 + 5 * a * s / (h * 4)))
    assert activation_bytes_per_layer(t4, "selective") == pytest.approx(s * b * h * 16)
    assert activation_bytes_per_layer(t4, "full") == 2 * s * b * h
    assert activation_bytes_per_layer(replace(t4, sequence_parallel=True), "full") == (
        2 * s * b * h / 4)


def test_zero_stages_shard_what_the_paper_says():
    """Catches: a ZeRO stage sharding the wrong state (1: optimizer; 2: + gradients;
    3: + parameters), or not by dp."""
    base = model_state_bytes(replace(SMALL, dp=4, fsdp_engine=False), 1)
    for stage, sharded in ((1, {"optimizer"}), (2, {"optimizer", "gradients"}),
                           (3, {"optimizer", "gradients", "parameters"})):
        got = model_state_bytes(replace(SMALL, dp=4, zero_stage=stage, fsdp_engine=False), 1)
        for kind in base:
            assert got[kind] == pytest.approx(base[kind] / (4 if kind in sharded else 1))
    # bytes per parameter as the trainer keeps them: 4 + 4 + 8, and FSDP2's 4-byte copy
    # wherever it wraps the model (not one process at ZeRO-0)
    one = replace(SMALL, tp=1, pp=1, dp=1)
    assert sum(model_state_bytes(one, 0).values()) == 16 * (one.parameters() - 2 * one.hidden)
    states = model_state_bytes(replace(one, dp=2), 0)
    assert sum(states.values()) == 20 * (one.parameters() - 2 * one.hidden)
    z3 = model_state_bytes(replace(SMALL, dp=4, zero_stage=3), 1)
    assert z3["parameter_workspace"] == SMALL.block_parameters() / SMALL.tp * 4


def test_micro_batches_in_flight_per_schedule():
    """Catches: 1F1B's in-flight count (p - stage) or GPipe's (all m) being swapped or not
    capped by the step's micro-batches."""
    lay = replace(SMALL, pp=4, global_batch=64, micro_batch=4, dp=2)  # m = 8
    assert [micro_batches_in_flight(lay, i) for i in range(4)] == [4, 3, 2, 1]
    assert micro_batches_in_flight(replace(lay, schedule="gpipe"), 3) == 8
    assert micro_batches_in_flight(replace(lay, global_batch=16), 0) == 2


def test_bloom_fits_80gb_and_its_variants_do_not():
    """Catches: a memory model that would pass layouts that cannot run: BLOOM-176B's layout
    (tp4 pp12 dp8, ZeRO-1, full recomputation) fits an 80 GB A100 on every stage; without
    recomputation, or with tp 1, its first stage does not; the logits buffer is the loss path's."""
    limit = DEVICES["a100-80gb"].memory_bytes
    for lay in (BLOOM_HERE, BLOOM_176B):
        assert max(rank_memory(lay, i)["total"] for i in range(lay.pp)) < limit
    assert rank_memory(replace(BLOOM_HERE, recompute="none"), 0)["total"] > limit
    assert rank_memory(replace(BLOOM_HERE, tp=1, dp=32), 0)["total"] > limit
    last = rank_memory(BLOOM_HERE, BLOOM_HERE.pp - 1)
    # pp > 1 takes the unfused loss: bf16 logits + fp32 upcast + fp32 log-softmax
    assert last["logits"] == 10 * 2048 * 2 * 250880 / 4 and rank_memory(BLOOM_HERE)["logits"] == 0
    fused = replace(SMALL, tp=1, pp=1)
    tokens, vocab, h = fused.seq * fused.micro_batch, fused.vocab, fused.hidden
    # the fused head + loss: the logits and the two gradients its forward computes
    assert rank_memory(fused)["logits"] == 2 * (tokens * vocab + vocab * h + tokens * h)


@pytest.mark.parametrize("row", PUBLISHED, ids=lambda r: r.name)
def test_published_rows_within_15_percent(row):
    """Catches: a time model that no longer reproduces published throughput (BLOOM-176B,
    Narayanan et al. 2021 Table 1) within 15%; the known misses must still miss, so that the
    list of misses and the doc explaining them stay true."""
    error = predict(row).tflops_per_gpu / row.tflops_per_gpu - 1
    if row.name in EXPECTED_MISSES:
        assert abs(error) > 0.15
    else:
        assert abs(error) <= 0.15


def test_efficiency_is_calibrated_on_one_row():
    """Catches: the efficiency constant changed without recalibrating (it must be the
    calibration row's implied efficiency, rounded to two places)."""
    row = next(r for r in PUBLISHED if r.name == CALIBRATION_ROW)
    assert round(implied_efficiency(row), 2) == DEFAULT_EFFICIENCY
    assert CALIBRATION_ROW not in EXPECTED_MISSES and "| GPT-1008B |" in table()
    assert memory_table().count("| yes |") == 3  # the doc's table: 3 of 6 variants fit


def test_bubble_and_units_without_communication():
    """Catches: a wrong bubble ((p-1)/m of the compute) or wrong derived units (tokens/s,
    MFU) once communication is taken out with infinite bandwidth."""
    fast = device("h100-80gb", nvlink_bytes_per_s=float("inf"),
                  network_bytes_per_s=float("inf"))
    lay = replace(SMALL, layers=12, pp=3, global_batch=64, micro_batch=4, dp=2)  # m = 8
    t = step_time(lay, fast, efficiency=0.5)
    assert t.tensor_parallel == t.data_parallel == t.pipeline_p2p == 0
    assert t.bubble == pytest.approx(t.compute * 2 / 8)
    tokens = lay.global_batch * lay.seq
    assert t.tokens_per_s == pytest.approx(tokens / t.step)
    assert t.mfu == pytest.approx(flops_per_token(lay) * tokens / t.step / lay.gpus / 989e12)


def test_device_overrides_make_a_new_device():
    """Catches: an override mutating the shared table, or a typo'd field or device name
    being ignored (planning silently for the wrong hardware)."""
    slow = device("a100-80gb", network_bytes_per_s=6.25e9)
    assert slow.network_bytes_per_s == 6.25e9 and DEVICES["a100-80gb"].network_bytes_per_s == 25e9
    with pytest.raises(TypeError):
        device("a100-80gb", netwrok_bytes_per_s=1.0)
    with pytest.raises(KeyError):
        device("a100-81gb")


@pytest.mark.parametrize("change", [dict(global_batch=63), dict(pp=13), dict(recompute="ful"),
                                    dict(schedule="interleaved"), dict(zero_stage=4)])
def test_impossible_layouts_are_refused(change):
    """Catches: a plan silently made for a layout the trainer cannot run (a batch that does
    not split into micro-batches, more stages than layers, a misspelt option)."""
    with pytest.raises(ValueError):
        replace(SMALL, **change)
