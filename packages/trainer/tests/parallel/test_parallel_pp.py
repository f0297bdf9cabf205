"""Pipeline parallelism (torch.distributed.pipelining) trains exactly like one process: same
losses, gradient norms and parameters after 5 steps for every schedule and for pp composed
with dp and tp; the stage partitioners and activation checkpointing on their own.

CPU processes joined by gloo, fp32, the equivalence model (4 layers). All of it runs in CI:
~2 minutes on 2 shared cores, the 8-process pp2 x dp2 x tp2 run ~30 s of it.
"""

from __future__ import annotations

import itertools
import random

import pytest
import torch
from equivalence import (
    VOCAB,
    assert_same_training,
    equivalence_config,
    run_steps,
)
from pipeline_workers import resume_run, train_evaluate_inspect

from bloomline.trainer.model import build_model
from bloomline.trainer.model.config import ModelConfig
from bloomline.trainer.parallel.activation_checkpoint import apply_activation_checkpointing
from bloomline.trainer.parallel.local_processes import run_distributed
from bloomline.trainer.parallel.partition import (
    balanced_split,
    layer_costs,
    partition_layers,
    stage_cost,
    uniform_split,
)

# -- helpers -----------------------------------------------------------------------------


# Adam's epsilon 1e-6 (reference included), as in test_parallel_tp: with 1e-8, elements whose
# gradient is zero up to roundoff (the attention key bias: softmax ignores a per-query
# constant) take lr-sized steps with the roundoff's sign, and any other summation order (the
# tied embedding's gradient summed over stages, tp's partial sums) flips them: ~4e-5 apart on
# the key bias alone after 5 steps, everything else within ~1e-7
ADAM = {"optimizer": {"eps": 1e-6}}


def assert_same(reference: dict, result: dict, norm_rtol: float = 1e-5) -> None:
    """``assert_same_training`` (losses 1e-5 relative, parameters 1e-5) and the gradient norms
    (the clipping norm over all stages) 1e-5 relative."""
    assert_same_training(reference, result)
    for step, (want, got) in enumerate(zip(reference["grad_norms"], result["grad_norms"],
                                           strict=True)):
        assert abs(got - want) <= norm_rtol * want, f"step {step}: grad norm {got} vs {want}"


_REFERENCES: dict = {}


def reference(**sections) -> dict:
    """The single-process run with ``ADAM`` (cached per settings)."""
    sections = {**ADAM, **sections}
    key = repr(sorted((k, sorted(v.items())) for k, v in sections.items()))
    if key not in _REFERENCES:
        _REFERENCES[key] = run_steps(sections)
    return _REFERENCES[key]


# -- partitioning -------------------------------------------------------------------------


def test_balanced_split_is_optimal_against_brute_force():
    """Bug: the dynamic programme misses the best split (an off-by-one in the cut range, the
    embedding or head cost on the wrong stage), leaving a slower bottleneck stage."""
    rng = random.Random(0)
    for _ in range(60):
        n = rng.randint(1, 8)
        costs = [rng.choice([rng.random(), float(rng.randint(1, 5))]) for _ in range(n)]
        first, last = rng.random() * 4, rng.random() * 4
        for k in range(1, n + 1):
            stages = balanced_split(costs, k, first, last)
            assert [i for s in stages for i in s] == list(range(n))  # contiguous, complete
            assert all(len(s) >= 1 for s in stages) and len(stages) == k
            best = min(max(stage_cost(costs, [range(a, b) for a, b in
                                              zip((0, *cuts), (*cuts, n), strict=True)],
                                      first, last))
                       for cuts in itertools.combinations(range(1, n), k - 1))
            assert max(stage_cost(costs, stages, first, last)) == pytest.approx(best)


def test_uniform_split_gives_the_remainder_to_the_middle():
    """Bug: the extra layers pile onto the first or last stage, which already carry the
    embedding and the head."""
    assert [len(s) for s in uniform_split(10, 4)] == [2, 3, 3, 2]
    assert [len(s) for s in uniform_split(7, 3)] == [2, 3, 2]
    assert [len(s) for s in uniform_split(5, 3)] == [2, 2, 1]
    assert [len(s) for s in uniform_split(8, 4)] == [2, 2, 2, 2]
    with pytest.raises(ValueError):
        uniform_split(2, 3)


def _wide_vocab_model():
    cfg = ModelConfig()
    cfg.vocab_size, cfg.hidden_size, cfg.num_layers, cfg.num_heads = 512, 32, 8, 4
    return build_model(cfg), cfg


def test_parameter_partition_counts_the_embedding_and_the_tied_head():
    """Bug: the embedding or the head's copy of it is left out of the count, so the outer
    stages of a large-vocabulary model hold as many blocks as the others and run out of
    memory first."""
    model, mcfg = _wide_vocab_model()
    embed, blocks, head = layer_costs(model, "parameters")
    assert embed == 512 * 32 + 2 * 32 and head == 512 * 32 + 2 * 32
    assert blocks == [sum(p.numel() for p in model.h["0"].parameters())] * 8
    cfg = equivalence_config(parallel={"partition": "parameters"})
    cfg.model = mcfg
    stages = partition_layers(model, cfg, 4)
    # the embedding and the head weigh ~1.3 blocks each: [2, 2, 2, 2] would put 3.3 blocks'
    # worth on the outer stages, [1, 3, 3, 1] at most 3
    assert [len(s) for s in stages] == [1, 3, 3, 1]


@pytest.mark.slow
def test_profile_partition_measures_every_layer_and_splits():
    """Bug: profiling leaves its gradients on the model (the first step would add them), or
    skips the embedding/head, or fails on the run's micro-batch shape."""
    model, mcfg = _wide_vocab_model()
    embed, blocks, head = layer_costs(model, "profile", micro_batch_size=2, seq_length=16,
                                      repeats=1)
    assert embed > 0 and head > 0 and len(blocks) == 8 and min(blocks) > 0
    assert all(p.grad is None for p in model.parameters())
    cfg = equivalence_config(parallel={"partition": "profile"})
    cfg.model = mcfg
    stages = partition_layers(model, cfg, 4)
    assert [i for s in stages for i in s] == list(range(8))


# -- activation checkpointing ---------------------------------------------------------------


def _saved_storages(model, tokens) -> tuple[int, int]:
    """(bytes of the distinct storages autograd keeps for backward, how many of them hold
    L x L tensors) over one forward + backward of ``tokens`` [b, L]."""
    storages = {}

    def pack(tensor):
        storage = tensor.untyped_storage()
        storages[storage.data_ptr()] = (storage.nbytes(), tensor.shape[-2:] == tokens.shape[1:] * 2)
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(tokens).sum().backward()
    return (sum(size for size, _ in storages.values()),
            sum(square for _, square in storages.values()))


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["full", "selective"])
def test_activation_checkpointing_trains_the_same_and_keeps_names(mode):
    """Bug: recomputation changes the numbers (RNG, a missed input), renames parameters
    (``_checkpoint_wrapped_module.``, breaking checkpoints and HF export), or silently does
    nothing (activation memory unchanged)."""
    assert_same(reference(), run_steps({"parallel": {"activation_checkpoint": mode}, **ADAM}),
                norm_rtol=1e-6)
    cfg = equivalence_config().model
    plain, checked = build_model(cfg), build_model(cfg)
    apply_activation_checkpointing(checked, mode)
    assert list(checked.state_dict()) == list(plain.state_dict())
    # long enough for L x L scores to matter; L != 4h, so no MLP activation looks L x L
    tokens = torch.randint(0, VOCAB, (2, 160))
    (saved, squares), (plain_saved, plain_squares) = (_saved_storages(checked, tokens),
                                                      _saved_storages(plain, tokens))
    assert plain_squares >= cfg.num_layers  # each layer keeps its probabilities
    if mode == "full":
        assert saved < 0.3 * plain_saved
    else:  # no layer keeps its own L x L tensors: the one shared ALiBi bias at most
        assert squares <= 1 and saved < 0.7 * plain_saved


# -- pipeline equivalence -------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.compat
@pytest.mark.parametrize("schedule, partition", [
    ("gpipe", "parameters"), ("1f1b", "profile"), ("interleaved", "uniform")])
def test_pp2_trains_like_one_process(schedule, partition):
    """Bug: a schedule mis-scales the micro-batch losses (sum vs mean, or by the loop's
    micro-batch count instead of parallel.pipeline_microbatches), a stage drops or
    duplicates blocks, the interleaved stages are assigned to the wrong ranks, the tied
    embedding's gradient misses the head's part, the clipping norm misses a stage or counts
    the tied weight twice, the loss is only known on the last stage, or the first stage
    handed inputs a torch version refuses (2.11 checks their strides: torch_compat.py)."""
    parallel = {"pipeline_parallel": 2, "pipeline_schedule": schedule, "partition": partition}
    if schedule == "gpipe":  # the schedule splits the step into 8 micro-batches, not 4
        parallel["pipeline_microbatches"] = 8
    # interleaved: 4 stages of one layer each; clip below the norm to exercise clipping
    clip = {"optimizer": {**ADAM["optimizer"], "clip_grad": 0.5}}
    sections = clip if schedule == "interleaved" else ADAM
    want = reference(**sections)
    for got in run_distributed(2, run_steps, {"parallel": parallel, **sections}):
        assert_same(want, got)


@pytest.mark.slow
def test_pp4_middle_stages_train_like_one_process():
    """Bug: a middle stage (no embedding, no head) keeps or drops the wrong modules, joins
    the tied-embedding group (whose collective would then hang or pair the wrong ranks), or
    the clipping norm misses its gradients."""
    parallel = {"pipeline_parallel": 4, "pipeline_schedule": "1f1b"}
    want = reference()
    for got in run_distributed(4, run_steps, {"parallel": parallel, **ADAM}):
        assert_same(want, got)


@pytest.mark.slow
@pytest.mark.parametrize("zero_stage, schedule, checkpointing", [
    (1, "gpipe", "none"), (2, "1f1b", "none"), (3, "interleaved", "full")])
def test_pp2_dp2_trains_like_one_process(zero_stage, schedule, checkpointing):
    """Bug: data parallelism inside a stage reduces gradients per micro-batch with the wrong
    scale or not at all (the schedule runs backward, not the loop), ZeRO's sharded gradients
    or optimizer state miss the tied embedding's all-reduce, the loss is averaged over the
    stage's ranks instead of dp, or FSDP2 (with a block's recomputation in backward) cannot
    run under the schedule."""
    parallel = {"pipeline_parallel": 2, "data_parallel": 2, "zero_stage": zero_stage,
                "pipeline_schedule": schedule, "activation_checkpoint": checkpointing}
    want = reference()
    for got in run_distributed(4, run_steps, {"parallel": parallel, **ADAM}):
        assert_same(want, got)


@pytest.mark.slow
def test_pp2_tp2_sequence_parallel_trains_like_one_process():
    """Bug: a stage's tensor-parallel plan expects the embedding it does not hold, the hidden
    states crossing stages carry the wrong (sequence-sharded) shape, the vocabulary-sharded
    logits of the last stage miss loss_parallel in the schedule's backward, or the tied
    embedding's gradient is all-reduced between mismatched tp shards."""
    parallel = {"pipeline_parallel": 2, "tensor_parallel": 2, "sequence_parallel": True,
                "pipeline_schedule": "1f1b", "activation_checkpoint": "selective"}
    want = reference()
    for got in run_distributed(4, run_steps, {"parallel": parallel, **ADAM}):
        assert_same(want, got)


@pytest.mark.slow
def test_pp2_dp2_tp2_trains_like_one_process():
    """Bug: the three axes compose wrongly on 8 processes: the tied-embedding groups pair
    ranks of different dp/tp coordinates, the clipping norm is reduced over the wrong axis,
    or ZeRO-1's sharded optimizer misses the tied copy."""
    parallel = {"pipeline_parallel": 2, "data_parallel": 2, "tensor_parallel": 2,
                "zero_stage": 1, "pipeline_schedule": "interleaved"}
    want = reference()
    for got in run_distributed(8, run_steps, {"parallel": parallel, **ADAM}):
        assert_same(want, got)


@pytest.mark.slow
def test_pp2_tied_copies_evaluation_and_activation_stats():
    """Bug: the last stage's copy of the tied embedding drifts from the first stage's (no
    gradient all-reduce, or a different update), evaluation under pipelining averages
    micro-batches wrongly or fails on a remainder, or the per-layer activation stats come back
    for one stage's layers only or out of order."""
    want = train_evaluate_inspect(ADAM)
    got = run_distributed(2, train_evaluate_inspect,
                          {"parallel": {"pipeline_parallel": 2, "pipeline_schedule": "1f1b"},
                           **ADAM})
    assert torch.equal(got[0]["tied"], got[1]["tied"])  # bit-identical copies
    assert torch.allclose(got[0]["tied"], want["tied"], atol=1e-6)
    for rank in got:
        assert rank["valid"] == pytest.approx(want["valid"], rel=1e-6)
        for key, values in want["activation_stats"].items():
            assert len(rank["activation_stats"][key]) == 4
            assert rank["activation_stats"][key] == pytest.approx(values, rel=1e-4,
                                                                  abs=1e-6), key


@pytest.mark.slow
def test_pp2_checkpoint_resumes_exactly(tmp_path):
    """Bug: a stage saves its modules under stage-local names, the tied weight is saved twice
    or not at all, the optimizer's per-stage parameter groups overwrite each other in the
    checkpoint, or resuming loses a stage's state (the continued losses would differ)."""
    want = reference()
    parallel = {"parallel": {"pipeline_parallel": 2, "pipeline_schedule": "gpipe"}, **ADAM}
    got = run_distributed(2, resume_run, parallel, str(tmp_path / "pp"))
    single = resume_run(ADAM, str(tmp_path / "single"))
    for rank in got:  # the same names as one process's, the tied weight's state once
        assert rank["keys"] == single["keys"]
        assert_same({"losses": want["losses"][2:], "params": want["params"],
                     "grad_norms": []}, {**rank, "grad_norms": []})
