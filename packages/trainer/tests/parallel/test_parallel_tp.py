"""Tensor parallelism (and sequence parallelism) trains exactly like one process.

Each layout trains the equivalence model 5 steps in 2 (or 4) gloo processes and is compared
with the single-process run: losses, gradient norms (the clipped norm over DTensor
gradients), every gathered parameter, the activation stats of one extra step, and each
rank's attention heads and ALiBi slopes.

Adam epsilon is 1e-6 in these runs (reference included): Adam divides each gradient element
by its own magnitude, so an element whose gradient is zero up to roundoff (the key bias: the
softmax ignores a per-query constant) takes an lr-sized step with the roundoff's sign, and any
other summation order (tp's partial sums) flips it. With eps 1e-6 such elements stay put and
the parameters agree to 1e-5 (with 1e-8: ~1e-4 on the key bias alone).
"""

from __future__ import annotations

import pytest
import torch
from equivalence import (
    GBS,
    LR,
    MBS,
    SEQ,
    VOCAB,
    assert_same_training,
    equivalence_config,
    run_steps,
)

from bloomline.trainer.model import alibi_slopes
from bloomline.trainer.parallel.local_processes import run_distributed

ADAM = {"optimizer": {"eps": 1e-6}}


def _train_and_probe(sections: dict) -> dict:
    """run_steps, then one activation-stats step and an evaluation on a fresh trainer, and this
    rank's heads."""
    from bloomline.trainer.loop import Trainer

    result = run_steps(sections)
    trainer = Trainer(equivalence_config(**sections), log=lambda *_: None)
    dp, rank = trainer.layout.dp, trainer.layout.dp_rank
    batch = torch.randint(0, VOCAB, (GBS, SEQ + 1), generator=torch.Generator().manual_seed(1))
    micro = [batch[k * MBS * dp + rank * MBS: k * MBS * dp + (rank + 1) * MBS]
             for k in range(GBS // (MBS * dp))]
    result["activation_stats"] = trainer.train_step(micro, LR,
                                                    activation_stats=True)["activation_stats"]
    result["valid_loss"] = trainer.evaluate(list(batch), GBS)["valid_loss"]
    model = trainer.model
    result["heads"] = [(b.self_attention.head_start, b.self_attention.num_heads,
                        alibi_slopes(b.self_attention.total_heads, b.self_attention.head_start,
                                     b.self_attention.head_start + b.self_attention.num_heads))
                       for b in model.h.values()]
    result["bias_shape"] = tuple(model.attention_bias(SEQ, torch.device("cpu")).shape)
    result["tp_rank"] = trainer.layout.tp_rank
    result["param_types"] = {type(p.data).__name__ for p in model.parameters()}
    return result


@pytest.fixture(scope="module")
def reference() -> dict:
    return _train_and_probe(ADAM)


def _assert_matches(reference: dict, results: list[dict], loss_rtol: float = 1e-5,
                    param_atol: float = 1e-5, readings: tuple[str, ...] = (
                        "max_attention_logit", "max_mlp_output", "max_residual", "grad_norm"),
                    ) -> None:
    """``readings``: the activation stats to compare (with dp, each rank's maxima come from its
    own first micro-batch, not the single process's)."""
    for result in results:
        assert_same_training(reference, result, loss_rtol, param_atol)
        for want, got in zip(reference["grad_norms"], result["grad_norms"], strict=True):
            assert got == pytest.approx(want, rel=loss_rtol), "gradient norm (clip) differs"
        assert result["valid_loss"] == pytest.approx(reference["valid_loss"], rel=loss_rtol)
        for key in readings:
            want = reference["activation_stats"][key]
            assert result["activation_stats"][key] == pytest.approx(want, rel=loss_rtol), key


def _parallel(**parallel) -> dict:
    return {**ADAM, "parallel": parallel}


@pytest.fixture(scope="module")
def tp2() -> list[dict]:
    return run_distributed(2, _train_and_probe, _parallel(tensor_parallel=2))


@pytest.mark.slow
@pytest.mark.compat
def test_tp2_trains_like_one_process(reference, tp2):
    """Bug: a wrong shard (QKV rows not by head, the row-wise bias added on every rank), a
    missing reduction (embedding partial sums, LayerNorm gradients), an untied head, a loss
    over a vocabulary shard, a clip norm over local gradients, or activation stats that read one
    rank's heads (max logit) or local gradients (per-layer norm), or an evaluation loss
    outside loss_parallel."""
    _assert_matches(reference, tp2)
    for result in tp2:
        assert result["param_types"] == {"DTensor"}  # clip, FSDP2 and DCP see one kind


@pytest.mark.slow
def test_tp2_sequence_parallel_trains_like_one_process(reference):
    """Bug: a LayerNorm or residual region left replicated or reduced twice, a reduce-scatter
    on the wrong dimension, the ALiBi bias sized from the local sequence shard, or an
    activation stat (max |residual|, max |MLP output|) read from one sequence shard."""
    results = run_distributed(2, _train_and_probe,
                              _parallel(tensor_parallel=2, sequence_parallel=True))
    _assert_matches(reference, results)
    for result in results:
        assert result["bias_shape"] == (2, SEQ, SEQ)  # local heads, full sequence


@pytest.mark.slow
def test_tp_rank_holds_its_heads_and_their_alibi_slopes(tp2):
    """Bug: every rank keeps heads [0, h/tp) (its ALiBi slopes those of the first heads), or
    the attention still believes it holds all heads (its view of the local QKV fails)."""
    total, tp = equivalence_config().model.num_heads, 2
    local = total // tp
    for result in tp2:
        r = result["tp_rank"]
        for start, num_heads, slopes in result["heads"]:
            assert (start, num_heads) == (r * local, local)
            torch.testing.assert_close(slopes, alibi_slopes(total, r * local, (r + 1) * local),
                                       rtol=0, atol=0)
    assert [r["tp_rank"] for r in tp2] == [0, 1]


@pytest.mark.slow
def test_tp2_bf16_smoke():
    """Bug: autocast and DTensor disagree (a bf16 weight shard cast twice, the loss-parallel
    cross-entropy in bf16, the fp32 residual stream meeting a bf16 DTensor): the run crashes or
    drifts from the single-process bf16 run by more than bf16's own rounding (the bf16 run
    differs from fp32 by ~6e-5 in loss, ~2e-3 in a parameter). Adam epsilon 1e-4: bf16's
    gradient noise is larger than fp32's (see the module docstring)."""
    bf16 = {"optimizer": {"eps": 1e-4}, "precision": {"dtype": "bf16"}}
    reference = run_steps(bf16)
    results = run_distributed(2, run_steps, {**bf16, "parallel": {"tensor_parallel": 2,
                                                                  "sequence_parallel": True}})
    for result in results:
        assert_same_training(reference, result, loss_rtol=5e-4, param_atol=4e-3)
        for want, got in zip(reference["grad_norms"], result["grad_norms"], strict=True):
            assert got == pytest.approx(want, rel=2e-3)


def test_padded_vocabulary_divides_by_tp(monkeypatch):
    """Bug: model.vocab_size = 0 pads the tokenizer's vocabulary to 128 only, which tp 2
    cannot split into equal 128-aligned shards (Megatron pads to 128 x tp)."""
    from bloomline.trainer import run_spec

    class FakeTokenizer:
        vocab_size = 300

    monkeypatch.setattr(run_spec, "load_run_tokenizer", lambda data: FakeTokenizer())
    monkeypatch.setattr(run_spec, "check_vocabulary", lambda *_: None)
    for tp, want in ((1, 384), (2, 512), (4, 512), (8, 1024)):
        cfg = equivalence_config(model={"vocab_size": 0, "num_heads": 8},
                                 parallel={"tensor_parallel": tp})
        cfg.data.tokenizer = "fake.model"
        assert run_spec.settle(cfg, tp).config.model.vocab_size == want, tp


@pytest.mark.parametrize("sections, message", [
    ({"data": {"seq_length": 15}}, "data.seq_length 15 is not divisible"),
    ({"curriculum": {"seqlen_warmup": True, "seq_length_step": 7, "start_seq_length": 8}},
     "curriculum.seq_length_step 7 is not divisible"),
])
def test_sequence_parallel_needs_lengths_divisible_by_tp(sections, message):
    """Bug: a sequence (or a warmup length) that tp cannot split evenly reaches the
    reduce-scatter, which kills the process group instead of naming the field."""
    from bloomline.common.errors import UserError
    from bloomline.trainer.config_rules import resolve_layout

    cfg = equivalence_config(parallel={"tensor_parallel": 2, "sequence_parallel": True},
                             **sections)
    with pytest.raises(UserError, match=message):
        resolve_layout(cfg, world_size=2)


@pytest.mark.slow  # 4 processes: ~30 s each on 2 cores
@pytest.mark.parametrize("parallel", [
    {"zero_stage": 0},
    {"zero_stage": 1, "sequence_parallel": True},  # the buffers engine
    {"zero_stage": 3, "sequence_parallel": True},
], ids=["zero0", "zero1-sp", "zero3-sp"])
def test_dp2_tp2_trains_like_one_process(reference, parallel):
    """Bug: tp and dp on one mesh disagree: FSDP2 shards a tp DTensor on the wrong axis, the
    dp reduction misses a tp-replicated parameter (LayerNorm), the clip norm is reduced over
    one axis only (or counts a tp-replicated gradient tp times on the buffers engine), a
    sequence-parallel LayerNorm's partial gradient is bucketed unreduced, or the dp slice of
    the batch is taken by global rank instead of dp rank."""
    results = run_distributed(4, _train_and_probe,
                              _parallel(tensor_parallel=2, data_parallel=2, **parallel))
    _assert_matches(reference, results, readings=("grad_norm",))
