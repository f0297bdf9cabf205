"""Data parallelism with ZeRO stages 0-3 and CPU offload (``parallel/data_parallel.py``,
``parallel/memory.py``), proven against one process on CPU with gloo.

Every distributed case runs in one 2-process spawn (``_all_cases``: starting the processes
costs more than the cases); each test reads its part of the results. Tolerances:

- fp32 losses within 1e-5 relative, gradient norms within 1e-5 relative, parameters within
  1e-5 absolute (seen: <= 5e-7), except the attention key biases, within LR / 10: their
  gradient is zero in exact arithmetic (q.b_k shifts all of a query's scores alike, softmax
  ignores it), so they get rounding noise (~1e-10) that Adam (eps 1e-8) turns into updates of
  up to ~lr/100 per step, and any change of summation order (dp's averaging) moves them.
- Gradient clipping is on in every case (``CLIP`` is below the tiny model's gradient norm, so
  every step is scaled by it): a norm that is not the global one changes the update.
- bf16 losses within 1e-4 relative (seen: 1e-7; the same micro-batches meet the same bf16
  roundings, only the fp32 accumulation order differs; one bf16 ulp is 4e-3).
- Memory: exact bytes. The tiny model's dim 0 sizes are all even, so dp2 shards have no
  padding; with padding, FSDP2 adds at most dp - 1 rows per tensor.
"""

from __future__ import annotations

import math

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

from bloomline.trainer.parallel.local_processes import run_distributed

# zero1/zero2 run on the buffers engine (the default for fp32 and bf16 at ZeRO-1/2), the
# -fsdp2 cases on FSDP2's (the engine fp16 and ZeRO-0/3 use)
STAGES = {"zero0": {"zero_stage": 0}, "zero1": {"zero_stage": 1}, "zero2": {"zero_stage": 2},
          "zero1-fsdp2": {"zero_stage": 1, "zero_engine": "fsdp2"},
          "zero2-fsdp2": {"zero_stage": 2, "zero_engine": "fsdp2"},
          # buckets of 2000 elements: several per model, reduced while backward goes on
          "zero1-buckets": {"zero_stage": 1, "bucket_size": 2000},
          "zero3": {"zero_stage": 3}, "offload": {"zero_stage": 3, "offload": True}}
BUFFERS = ("zero1", "zero2", "zero1-buckets")

CLIP = 0.5  # the tiny model's gradient norms are ~0.9: every step clips
HEADS = equivalence_config().model.num_heads
DP = 2
STEP_MICRO_BATCHES = range(GBS // (MBS * DP))


def _sections(**extra) -> dict:
    return {"optimizer": {"clip_grad": CLIP}, **extra}


# -- what every rank runs ---------------------------------------------------------------------


def _batches(steps: int = 5, seed: int = 0) -> list[torch.Tensor]:
    """The global batches of ``equivalence.run_steps``."""
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(0, VOCAB, (GBS, SEQ + 1), generator=generator) for _ in range(steps)]


def _train(trainer, batches: list[torch.Tensor]) -> list[float]:
    """``run_steps``' loop: this dp rank's Megatron slices of each global batch."""
    dp, rank = trainer.layout.dp, trainer.layout.dp_rank
    losses = []
    for batch in batches:
        micro = [batch[k * MBS * dp + rank * MBS: k * MBS * dp + (rank + 1) * MBS]
                 for k in range(GBS // (MBS * dp))]
        losses.append(trainer.train_step(micro, LR)["loss"])
    return losses


def _local_bytes(tensor: torch.Tensor) -> int:
    local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
    return local.numel() * local.element_size()


def _zero_formula(num_params: int, stage: int, dp: int, offload: bool,
                  buffers: bool = False) -> dict:
    """The planner's ZeRO formula under memory.py's keys: offload puts it all on the host.
    The buffers engine in fp32 holds the same kinds (fp32 parameters that are their own
    master, fp32 gradient buffers, Adam's moments over dp): the formula's defaults."""
    from bloomline.trainer.plan.memory_formulas import zero_model_states

    states = zero_model_states(num_params, stage, dp)
    where, other = ("host", "device") if offload else ("device", "host")
    short = {"parameters": "params", "gradients": "grads", "optimizer": "optim"}
    return {**{f"{short[kind]}_{where}": value for kind, value in states.items()},
            **{f"{name}_{other}": 0.0 for name in short.values()}}


def _memory_case(parallel: dict, **sections) -> dict:
    """Model-state bytes at the end of forward, at the optimizer step and between steps, the
    formula, and the log record's figures."""
    from bloomline.trainer.loop import Trainer
    from bloomline.trainer.parallel.memory import model_state_bytes
    from bloomline.trainer.reporting.monitor import Window

    trainer = Trainer(equivalence_config(**_sections(parallel=parallel, **sections)),
                      log=lambda *_: None)
    offload = trainer.cfg.parallel.offload
    seen = {}

    def measure(when: str):
        def hook(*_):
            seen.setdefault(when, model_state_bytes(trainer.model, trainer.optimizer, "cpu",
                                                    offload))
        return hook

    trainer.model.register_forward_hook(measure("forward"))
    calls = []

    def before_forward(*_):  # the second micro-batch's: have the first's gradients been reduced?
        calls.append(1)
        if len(calls) == 2:
            grads = [p.grad for p in trainer.model.parameters() if p.grad is not None]
            seen["reduced_early"] = sum(_local_bytes(g) for g in grads)
            buffers = getattr(trainer.optimizer, "buffers", None)
            if buffers is not None:  # the buffers engine: unreduced buckets, reduced shards
                seen["held_early"] = {
                    "unreduced": sum(_local_bytes(b.buffer) for b in buffers.buckets
                                     if b.buffer is not None),
                    "shards_nonzero": all(bool(b.shard.abs().sum()) for b in buffers.buckets)}

    # prepended: before FSDP2's own pre-forward registers the unsharded parameters
    trainer.model.register_forward_pre_hook(before_forward, prepend=True)
    trainer.optimizer.register_step_pre_hook(measure("step"))
    dp, rank = trainer.layout.dp, trainer.layout.dp_rank
    batch = _batches(1)[0]
    micro = [batch[k * MBS * dp + rank * MBS: k * MBS * dp + (rank + 1) * MBS]
             for k in range(GBS // (MBS * dp))]
    result = trainer.train_step(micro, LR, activation_stats=True)
    buffers = getattr(trainer.optimizer, "buffers", None)
    if buffers is not None:
        seen["buckets"] = (len(buffers.buckets), buffers.started_in_backward)
    seen["rest"] = model_state_bytes(trainer.model, trainer.optimizer, "cpu", offload)
    seen["formula"] = _zero_formula(trainer.cfg.model.num_parameters(),
                                    parallel["zero_stage"], dp, offload)
    trainer.monitor.window = Window(start=0.0, tokens=1, samples=1, steps=1)
    record = trainer.monitor.train_record(result, LR, GBS, SEQ, trainer.state)
    seen["record"] = {k: v for k, v in record.items() if k.startswith("memory_")
                      and k != "memory_gb"}
    seen["activation_stats"] = sorted(result["activation_stats"])
    return seen


def _resume_case(parallel: dict, run_dir: str, saved_by: dict | None = None) -> dict:
    """3 steps, save, a new Trainer resumes, 2 more steps. ``saved_by``: the first 3 steps
    and the save in another layout (another ZeRO engine)."""
    import torch.distributed as dist

    from bloomline.trainer.loop import Trainer

    cfg = lambda: equivalence_config(run_dir, **_sections(parallel=parallel))  # noqa: E731
    batches = _batches(5)
    first = Trainer(equivalence_config(run_dir, **_sections(parallel=saved_by or parallel)),
                    log=lambda *_: None)
    losses = _train(first, batches[:3])
    first.state.step = 3
    first.save()
    dist.barrier()  # rank 0 renames the finished checkpoint folder after DCP's own barrier
    second = Trainer(cfg(), log=lambda *_: None)
    assert second.resume() is not None and second.state.step == 3
    losses += _train(second, batches[3:])
    return {"losses": losses, "params": second.full_model_state()}


def _bf16_case() -> dict:
    """dp2 ZeRO-3 in bf16: 5 steps' losses, then the sharded gradients of a sixth step of one
    micro-batch per rank as the optimizer sees them (one micro-batch: the fp32 values come
    from the reduction alone, not from accumulating micro-batches)."""
    from torch.distributed.tensor import DTensor

    from bloomline.trainer.loop import Trainer

    cfg = equivalence_config(**_sections(parallel=STAGES["zero3"], precision={"dtype": "bf16"}))
    trainer = Trainer(cfg, log=lambda *_: None)
    grads = {}

    def look(*_):
        if grads:
            return
        for name, param in trainer.model.named_parameters():
            local = param.grad.to_local()
            grads[name] = {"dtype": str(local.dtype), "sharded": isinstance(param.grad, DTensor)
                           and local.shape[0] * DP == param.shape[0],
                           # fp32 values a bf16 reduction would have rounded away
                           "beyond_bf16": int((local.bfloat16().float() != local).sum())}

    losses = _train(trainer, _batches(5))
    trainer.optimizer.register_step_pre_hook(look)
    trainer.runner.clip_grad = 0  # off: clipping's scaling would hide a bf16 rounding
    rank = trainer.layout.dp_rank
    trainer.train_step([_batches(6)[5][rank * MBS: (rank + 1) * MBS]], LR)
    return {"losses": losses, "grads": grads}


def _nan_case(parallel: dict) -> dict:
    """A step whose loss is NaN on rank 1 only: both ranks must skip it."""
    import torch.distributed as dist

    from bloomline.trainer.loop import Trainer

    trainer = Trainer(equivalence_config(**_sections(parallel=parallel)), log=lambda *_: None)
    batches = _batches(2)
    _train(trainer, batches[:1])
    before = trainer.full_model_state()
    if dist.get_rank() == 1:
        handle = trainer.model.h["0"].register_forward_hook(lambda m, i, out: out * math.nan)
    result = trainer.train_step([batches[1][:MBS], batches[1][MBS:2 * MBS]], LR)
    if dist.get_rank() == 1:
        handle.remove()
    after = trainer.full_model_state()
    return {"skipped": result["skipped"],
            "unchanged": all(torch.equal(before[k], after[k]) for k in before)}


def _all_cases(run_dir: str) -> dict:
    return {"stages": {name: run_steps(_sections(parallel=parallel))
                       for name, parallel in STAGES.items()},
            "memory": {name: _memory_case(parallel) for name, parallel in STAGES.items()},
            "memory_bf16": {name: _memory_case(STAGES[name], precision={"dtype": "bf16"})
                            for name in ("zero1", "zero2")},
            "resume": {**{name: _resume_case(STAGES[name], f"{run_dir}/{name}")
                          for name in ("zero1", "zero2", "zero3")},
                       # a checkpoint of the previous ZeRO-1 (FSDP2) resumed on the buffers
                       # engine, and back
                       "fsdp2-to-buffers": _resume_case(STAGES["zero1"], f"{run_dir}/f2b",
                                                        saved_by=STAGES["zero1-fsdp2"]),
                       "buffers-to-fsdp2": _resume_case(STAGES["zero1-fsdp2"],
                                                        f"{run_dir}/b2f",
                                                        saved_by=STAGES["zero1"])},
            "bf16": _bf16_case(),
            "nan": {name: _nan_case(STAGES[name]) for name in ("zero1", "zero2", "zero3")},
            "bf16_buffers": {name: run_steps(_sections(parallel=STAGES[name],
                                                       precision={"dtype": "bf16"}))
                             for name in ("zero1", "zero1-fsdp2")}}


# -- the tests --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> list[dict]:
    return run_distributed(DP, _all_cases, str(tmp_path_factory.mktemp("zero")))


@pytest.fixture(scope="module")
def reference() -> dict:
    return run_steps(_sections())


def _key_biases_apart(params: dict) -> tuple[dict, dict]:
    """(params with the attention key biases zeroed, the key biases): see the tolerances."""
    rest, keys = dict(params), {}
    for name, value in params.items():
        if name.endswith("self_attention.query_key_value.bias"):
            per_head = value.view(HEADS, 3, -1).clone()  # BLOOM's [heads, (q, k, v), head_dim]
            keys[name] = per_head[:, 1].clone()
            per_head[:, 1] = 0
            rest[name] = per_head.view_as(value)
    return rest, keys


def _assert_same(reference: dict, result: dict) -> None:
    ref_rest, ref_keys = _key_biases_apart(reference["params"])
    got_rest, got_keys = _key_biases_apart(result["params"])
    assert_same_training({**reference, "params": ref_rest}, {**result, "params": got_rest})
    for name, want in ref_keys.items():
        error = (got_keys[name] - want).abs().max().item()
        assert error <= LR / 10, f"{name} (key part): max |difference| {error:.3g}"
    for step, (want, got) in enumerate(zip(reference["grad_norms"], result["grad_norms"],
                                           strict=True)):
        assert abs(got - want) <= 1e-5 * want, f"step {step}: grad norm {got} vs {want}"


@pytest.mark.slow
@pytest.mark.compat
@pytest.mark.parametrize("stage", list(STAGES))
def test_dp2_trains_like_one_process(runs, reference, stage):
    """Bug: a stage reduces gradients wrongly (summed instead of averaged, skipped on the
    accumulated micro-batches, reduced twice), ZeRO-1 steps or gathers the wrong slice, offload
    loses the update, clipping uses a per-rank norm, or the ranks' replicas drift apart: 5 steps
    at dp2 must give one process's losses, gradient norms and parameters on both ranks."""
    assert reference["grad_norms"][0] > CLIP  # the clipping path is exercised
    for rank_result in runs:
        _assert_same(reference, rank_result["stages"][stage])


@pytest.mark.slow
@pytest.mark.parametrize("stage", list(STAGES))
def test_model_state_memory_matches_zero_formula(runs, stage):
    """Bug: a stage keeps more than it should (whole gradients at ZeRO-2, whole optimizer state
    at ZeRO-1, parameters on the device under offload) or memory.py miscounts shards: the
    bytes each rank holds must equal ZeRO's formula, where the parameters are counted while
    computing (end of forward: whole for stages 0-2, shards for 3) and between steps (shards
    from stage 2 on: FSDP2 reshards after backward)."""
    for rank_result in runs:
        seen = rank_result["memory"][stage]
        formula = seen["formula"]
        for kind in ("params", "grads", "optim"):
            for place in ("device", "host"):
                key, want = f"{kind}_{place}", formula[f"{kind}_{place}"]
                if kind == "params":
                    assert seen["forward"][key] == want, (key, seen["forward"])
                    # FSDP2 reshards after backward; the buffers engine keeps whole parameters
                    at_rest = want / DP if stage == "zero2-fsdp2" else want
                    assert seen["rest"][key] == at_rest, (key, seen["rest"])
                elif kind == "grads":
                    assert seen["step"][key] == want, (key, seen["step"])  # as reduced
                    assert seen["rest"][key] == want, (key, seen["rest"])  # their size
                else:
                    assert seen["rest"][key] == want, (key, seen["rest"])
                record = f"memory_{'host_' if place == 'host' else ''}{kind}_gb"
                assert seen["record"][record] == pytest.approx(seen["rest"][key] / 1e9)
        assert seen["activation_stats"]  # set_activation_stats still reaches the blocks


@pytest.mark.slow
@pytest.mark.parametrize("stage", ["zero1", "zero2"])
def test_bf16_buffers_engine_holds_megatron_bytes_per_parameter(runs, stage):
    """Bug: the bf16 model keeps fp32 parameters (or a second copy), the gradients are held
    twice (``.grad`` beside the buffer) or in bf16, or the master is not sharded: per rank,
    Megatron's distributed optimizer holds 2 bytes of bf16 parameters, 4 of fp32 gradient
    buffer (4/dp at ZeRO-2) and 12/dp of fp32 master + Adam's moments per parameter, at the
    step and between steps."""
    from bloomline.trainer.plan.memory_formulas import zero_model_states

    for rank_result in runs:
        seen = rank_result["memory_bf16"][stage]
        psi = seen["formula"]["params_device"] / 4  # the fp32 formula's 4 bytes x Ψ
        want = zero_model_states(psi, int(stage[-1]), DP, param_bytes=2, grad_bytes=4,
                                 optimizer_bytes=12)
        for when in ("step", "rest"):
            assert seen[when]["params_device"] == want["parameters"], (when, seen[when])
            assert seen[when]["grads_device"] == want["gradients"], (when, seen[when])
        # Adam's moments exist from the first step on (before it: the masters alone, 4/dp)
        assert seen["step"]["optim_device"] == want["optimizer"] / 3, seen["step"]
        assert seen["rest"]["optim_device"] == want["optimizer"], seen["rest"]


@pytest.mark.slow
@pytest.mark.parametrize("stage", list(STAGES))
def test_gradients_reduced_once_per_step_or_kept_sharded(runs, stage):
    """Bug: stages 0-1 all-reduce after every micro-batch (dp x the traffic), or stages 2-3
    skip the reduce-scatter on the accumulated micro-batches (FSDP2's no-sync mode), holding
    the whole unsharded gradient until the last one: before the second micro-batch, stages
    0-1 must hold no reduced gradient yet, stages 2-3 their gradient shards (4 bytes x Ψ/dp).
    On the buffers engine, a parameter's ``.grad`` kept beside the buffer (gradients held
    twice), or a ZeRO-2 bucket kept after its reduction."""
    for rank_result in runs:
        seen = rank_result["memory"][stage]
        formula = seen["formula"]
        if stage in BUFFERS:
            # the hooks moved every gradient into the buckets: no parameter holds one; ZeRO-1
            # keeps its whole fp32 buffer unreduced, ZeRO-2 reduced it into its shards and
            # freed it
            held = seen["held_early"]
            assert seen["reduced_early"] == 0
            # every bucket's reduction was launched from backward, as its last gradient came
            buckets, started = seen["buckets"]
            assert started == buckets * (len(STEP_MICRO_BATCHES) if stage == "zero2" else 1)
            assert buckets > 1 if stage == "zero1-buckets" else buckets == 1
            if stage.startswith("zero1"):
                assert held["unreduced"] == formula["grads_device"]
            else:
                assert held == {"unreduced": 0, "shards_nonzero": True}
            continue
        want = 0 if stage in ("zero0", "zero1-fsdp2") else formula["grads_device"] + \
            formula["grads_host"]
        assert seen["reduced_early"] == want


@pytest.mark.slow
@pytest.mark.parametrize("stage", ["zero1", "zero2", "zero3"])
def test_checkpoint_resume_equals_straight_run(runs, stage):
    """Bug: the ZeRO-1 optimizer state (our own sharding) or FSDP2's sharded state is not
    saved or not loaded back (DCP sees no sharded state, names differ, the inner state is not
    refilled): 3 steps + save + resume + 2 steps must equal 5 straight steps exactly."""
    for rank_result in runs:
        straight, resumed = rank_result["stages"][stage], rank_result["resume"][stage]
        assert resumed["losses"] == straight["losses"]
        for name, want in straight["params"].items():
            assert torch.equal(resumed["params"][name], want), name


@pytest.mark.slow
@pytest.mark.parametrize("direction", ["fsdp2-to-buffers", "buffers-to-fsdp2"])
def test_checkpoint_of_the_other_zero_engine_resumes(runs, direction):
    """Bug: the buffers engine saves its state under other names or shapes than the FSDP2
    engine (bf16 parameters instead of the fp32 masters, flat shards DCP cannot reshard), so a
    run's checkpoints stop loading when the engine changes: saved by one engine, resumed by
    the other, the next losses must equal a run that never stopped (1e-6 relative, fp32) and
    the parameters the straight run's within the parity tolerance."""
    for rank_result in runs:
        straight = rank_result["stages"]["zero1"]
        resumed = rank_result["resume"][direction]
        for want, got in zip(straight["losses"], resumed["losses"], strict=True):
            assert abs(got - want) <= 1e-6 * abs(want), (direction, got, want)
        for name, want in straight["params"].items():
            error = (resumed["params"][name] - want).abs().max().item()
            assert error <= LR / 10, (name, error)


@pytest.mark.slow
def test_bf16_zero3_keeps_fp32_gradients_and_matches_one_process(runs):
    """Bug: under bf16 the ZeRO-3 gradients are accumulated or reduced in bf16 (FSDP2 reduces
    in the compute dtype unless told otherwise): the sharded gradients the optimizer sees must
    be fp32 with values a bf16 reduction would have rounded, and the losses must follow one
    bf16 process's."""
    reference = run_steps(_sections(precision={"dtype": "bf16"}))
    for rank_result in runs:
        grads = rank_result["bf16"]["grads"]
        assert grads and all(g["dtype"] == "torch.float32" and g["sharded"]
                             for g in grads.values()), grads
        assert sum(g["beyond_bf16"] for g in grads.values()) > 0
        for want, got in zip(reference["losses"], rank_result["bf16"]["losses"], strict=True):
            assert abs(got - want) <= 1e-4 * want, (got, want)


@pytest.mark.slow
def test_bf16_buffers_engine_follows_one_process(runs):
    """Bug: the buffers engine accumulates or reduces bf16 gradients in bf16, steps a bf16
    master, or gathers stale parameters: its bf16 losses must follow one bf16 process's as
    closely as the FSDP2 engine's do. Its parameters are bf16 where the one process computes
    from fp32 weights under autocast (the LayerNorms and biases see bf16-rounded values), so
    the bound is 5e-4 relative (seen: 1.3e-4; one bf16 ulp is 4e-3)."""
    reference = run_steps(_sections(precision={"dtype": "bf16"}))
    for rank_result in runs:
        for name in ("zero1", "zero1-fsdp2"):
            losses = rank_result["bf16_buffers"][name]["losses"]
            for want, got in zip(reference["losses"], losses, strict=True):
                assert abs(got - want) <= 5e-4 * want, (name, got, want)


@pytest.mark.slow
@pytest.mark.parametrize("stage", ["zero1", "zero2", "zero3"])
def test_non_finite_step_is_skipped_on_every_rank(runs, stage):
    """Bug: one rank's NaN is seen by that rank only, so it skips the step while the other
    steps (replicas diverge, or FSDP2's collectives stop matching)."""
    for rank_result in runs:
        assert rank_result["nan"][stage] == {"skipped": True, "unchanged": True}


def test_offload_in_one_process_is_refused():
    """Bug: ``parallel.offload`` in a single process is silently ignored (no process group, so
    no FSDP2) and the run keeps everything on the device it was meant to relieve."""
    from bloomline.common.errors import UserError
    from bloomline.trainer.loop import Trainer

    with pytest.raises(UserError, match="parallel.offload needs torch.distributed"):
        Trainer(equivalence_config(parallel=STAGES["offload"]), log=lambda *_: None)


def test_the_buffers_engine_asked_for_in_one_process_trains_the_plain_model():
    """Bug: ``parallel.zero_engine = "buffers"`` in one process building the engine without
    a device mesh (a crash at start), or a bf16 model with a master copy that shards nothing:
    with one replica neither ZeRO engine applies, and the run trains like the plain model."""
    from bloomline.trainer.loop import Trainer
    from bloomline.trainer.master_weights import master_weights_of

    cfg = equivalence_config(**_sections(parallel={"zero_stage": 1, "zero_engine": "buffers"}))
    trainer = Trainer(cfg, log=lambda *_: None)
    assert master_weights_of(trainer.model) is None
    want = run_steps(_sections(), steps=1)
    assert _train(trainer, _batches(1)) == want["losses"]
