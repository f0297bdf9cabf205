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
    GBS,
    MBS,
    SEQ,
    VOCAB,
    assert_same_training,
    equivalence_config,
    run_steps,
)
from pipeline_workers import released_outputs, resume_run, train_evaluate_inspect
from torch.multiprocessing.reductions import StorageWeakRef

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
from bloomline.trainer.parallel.pipeline import release_output

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


# -- sent stage outputs released (Megatron's deallocate_output_tensor) ------------------------


def _stage_gradients(release: bool) -> tuple[list[torch.Tensor], object]:
    """A first pipeline stage of the equivalence model (embedding and two blocks, no head):
    forward, optionally ``release_output`` on its output (as ``_Stage`` does once it is sent),
    then the schedule's backward from a received gradient. Returns the input-side gradients
    (every parameter's) and the output's autograd node's class name."""
    torch.manual_seed(0)
    model = build_model(equivalence_config().model)
    for name in ("2", "3"):
        del model.h[name]
    model.ln_f = None  # the stage returns hidden states
    tokens = torch.randint(0, VOCAB, (MBS, SEQ))
    out = model(tokens)
    node = type(out.grad_fn).__name__
    if release:
        buffer = StorageWeakRef(out.untyped_storage())
        assert release_output(out)
        assert buffer.expired(), "the output's buffer is still referenced"
        assert out.untyped_storage().nbytes() == out.element_size()
        assert out.shape == (MBS, SEQ, model.config.hidden_size) and out.grad_fn is not None
    grad = torch.randn(MBS, SEQ, model.config.hidden_size, generator=torch.Generator()
                       .manual_seed(1))
    torch.autograd.backward((out,), grad_tensors=(grad,))  # what PipelineStage calls
    return [p.grad for p in model.parameters()], node


def test_release_output_frees_a_stage_output_and_keeps_its_gradients():
    """Bug: releasing a sent stage output's data changes the stage's gradients (the autograd
    node that made the output reads its values in backward: a GPT stage must end in an op that
    does not save its result; the block's residual add does not), fails torch's size check in
    ``torch.autograd.backward``, or frees nothing (the buffer still referenced)."""
    (kept, node), (released, _) = _stage_gradients(False), _stage_gradients(True)
    assert node == "AddBackward0"
    assert len(kept) == len(released) > 0
    for want, got in zip(kept, released, strict=True):
        assert torch.equal(want, got)


def test_release_output_refuses_what_it_cannot_free():
    """Bug: an output its own autograd node saves (exp, sigmoid: the node keeps the data)
    reported released (the plan then counting memory the run still holds), a view's or a
    leaf's buffer (a stage input handed through: torch's receive buffer, reused every step)
    replaced, or the aliases torch's send ops hold left holding the buffer."""
    x = torch.randn(4, 8, requires_grad=True)
    saved = x.exp()
    view = (x * 2).view(32)
    for refused in (saved, view, x):
        size = refused.untyped_storage().nbytes()
        assert not release_output(refused)
        assert refused.untyped_storage().nbytes() == size
    out = x * 2 + 1
    alias = out.detach()  # what get_fwd_send_ops hands to isend
    buffer = StorageWeakRef(out.untyped_storage())
    assert release_output(out, [alias])
    assert buffer.expired() and alias.untyped_storage().nbytes() == 4
    assert not release_output(out)  # once
    out.backward(torch.ones(4, 8))
    assert torch.equal(x.grad, torch.full((4, 8), 2.0))


_RELEASED: dict = {}
MICRO_BATCHES = GBS // MBS  # per step of the equivalence run (4)


def released(schedule: str) -> list[dict]:
    """``released_outputs`` on both ranks of a pp2 run of ``schedule`` (cached)."""
    if schedule not in _RELEASED:
        parallel = {"pipeline_parallel": 2, "pipeline_schedule": schedule}
        _RELEASED[schedule] = run_distributed(2, released_outputs, {"parallel": parallel, **ADAM})
    return _RELEASED[schedule]


@pytest.mark.slow
def test_pp2_1f1b_frees_each_sent_output_before_its_backward():
    """Bug: 1F1B's first stage holding each in-flight micro-batch's output ([mbs, seq, hidden])
    from its forward to its backward, as torch's schedule keeps it in ``fwd_cache`` (the waste
    Megatron's deallocate_output_tensor removes: 12 outputs on BLOOM-176B's stage 0), the
    output released but its buffer still held (by the send op or work torch keeps), the last
    stage's logits released (the loss needs them), or the release changing the training:
    losses and gradient norms as one process's."""
    first, last = released("1f1b")
    # at every backward of the first stage, its cached outputs are one element each, and the
    # buffers their forwards made are freed; the first backward comes after both warm-up
    # forwards (4 micro-batches, pp 2)
    assert [mb for mb, _, _ in first["at_backward"][0]] == [0, 1]
    assert len(first["at_backward"]) == MICRO_BATCHES
    for cached in first["at_backward"]:
        assert cached and all(size == 4 and freed for _, size, freed in cached), cached
    logits = MBS * SEQ * VOCAB * 4
    for cached in last["at_backward"]:
        assert all(size == logits and not freed for _, size, freed in cached), cached
    want = reference()
    for rank in (first, last):
        assert_same({"losses": want["losses"][:2], "grad_norms": want["grad_norms"][:2],
                     "params": {}}, {**rank, "params": {}})


@pytest.mark.slow
@pytest.mark.parametrize("schedule", ["gpipe", "1f1b", "interleaved"])
def test_pp2_releases_outputs_where_the_planner_does(schedule):
    """Bug: an output released before torch's schedule has waited its send (gloo and NCCL read
    the buffer until then), or the planner's traced step releasing its fake outputs at other
    points than the run does: ``PipelineStages.actions(..., sends=True)`` (what the plan
    replays) against the forwards, backwards and releases recorded on torch's stages in a real
    step. A torch that moves its waits fails here, not silently in the plans. GPipe waits every
    forward's send after the last forward: its backwards find all outputs released; the runtime
    schedules (interleaved) wait at the end of the step: nothing is released before its
    backward."""
    ranks = released(schedule)
    for rank in ranks:
        assert rank["events"] == rank["planned"]
    sent = [e for e in ranks[0]["events"] if e[0] == "SENT"]
    assert len(sent) == MICRO_BATCHES * (2 if schedule == "interleaved" else 1)
    if schedule == "gpipe":
        assert [mb for mb, _, _ in ranks[0]["at_backward"][0]] == [0, 1, 2, 3]
        assert all(size == 4 and freed for cached in ranks[0]["at_backward"]
                   for _, size, freed in cached)
    if schedule == "interleaved":
        assert all(not freed for rank in ranks for cached in rank["at_backward"]
                   for _, _, freed in cached)
