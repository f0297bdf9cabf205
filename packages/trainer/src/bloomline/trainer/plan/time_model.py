"""Step time of a training layout on a device, from FLOP counts and link bandwidths (no torch).

``step_time(layout, device)`` returns the step's parts (compute, tensor-parallel collectives,
pipeline transfers, data-parallel reduction, pipeline bubble) and the figures a run reports:
seconds per step, tokens/s, TFLOP/s per GPU and MFU.

The model, and what it assumes:

- FLOPs per token are ModelConfig.flops_per_token's count (3x the forward's 2 FLOPs per
  multiply-add, attention scores over the full s x s square), recomputed here from the layout
  so this module imports no torch (a test checks the two agree). Recomputation adds one
  forward of the blocks (full) or of the attention core (selective). "TFLOP/s per GPU" counts
  those recomputed FLOPs, as Megatron-LM and BLOOM report it (96Bslh^2(1 + s/6h + V/16lh) with
  full recomputation); MFU does not.
- Compute runs at ``efficiency`` x the device's dense bf16 peak: the fraction large GEMMs
  reach in practice. DEFAULT_EFFICIENCY is calibrated once, on one published row
  (plan/published.py says which); every other prediction is made with it unchanged.
- Tensor parallelism (within a node, over NVLink): 2 all-reduces of the s x b x h bf16
  activations per block in forward and 2 in backward (Megatron's f/g operators), 2 more when
  full recomputation reruns the forward; sequence parallelism's reduce-scatter + all-gather
  pairs move the same bytes. Ring cost 2(t-1)/t x bytes / bandwidth. Not overlapped.
- Pipeline: each micro-batch's activation is sent forward and its gradient back between
  stages over the network, split over the t ranks (Megatron's scatter/gather). The 1F1B and
  GPipe schedules both take (m + p - 1) slots of the slowest stage: bubble (p-1)/m.
- Data parallelism: the gradient reduction after the last micro-batch, over the network when
  the dp group spans nodes (tp ranks fill a node first, then dp, as Megatron orders them),
  not overlapped with compute (``dp_overlap`` = 0; set it to the hidden fraction otherwise).
  ZeRO-1 adds the all-gather of the updated parameters; ZeRO-2/3 reduce-scatter every
  micro-batch and all-gather the parameters (twice per micro-batch for stage 3). On the
  buffers engine (``fsdp_engine`` False: Megatron's distributed optimizer) ZeRO-1 is one
  reduce-scatter of the fp32 gradients and one all-gather of the parameters per step, ZeRO-2
  a reduce-scatter per micro-batch and one all-gather.
"""

from __future__ import annotations

from dataclasses import dataclass

from bloomline.trainer.plan.devices import Device
from bloomline.trainer.plan.memory_formulas import Layout, layers_on_stage

__all__ = ["DEFAULT_EFFICIENCY", "StepTime", "flops_per_token", "hardware_flops_per_token",
           "step_time"]

DEFAULT_EFFICIENCY = 0.54
"""Fraction of dense peak the GEMMs reach; calibration in plan/published.py."""


def _block_matmul_flops_fwd(layout: Layout) -> float:
    """Forward FLOPs per token of one block: the 4h^2 + 2hf weight matmuls and the s x s
    attention score and value matmuls (2sh multiply-adds), at 2 FLOPs per multiply-add."""
    h = layout.hidden
    return 2.0 * (4 * h * h + 2 * h * layout.ffn_size + 2 * layout.seq * h)


def _head_flops_fwd(layout: Layout) -> float:
    return 2.0 * layout.vocab * layout.hidden


def flops_per_token(layout: Layout) -> float:
    """Model FLOPs of forward + backward per token (ModelConfig.flops_per_token's count)."""
    return 3.0 * (layout.layers * _block_matmul_flops_fwd(layout) + _head_flops_fwd(layout))


def _recompute_flops_fwd(layout: Layout) -> float:
    """Extra forward FLOPs per token per block that recomputation spends."""
    if layout.recompute == "full":
        return _block_matmul_flops_fwd(layout)
    if layout.recompute == "selective":
        return 2.0 * 2 * layout.seq * layout.hidden  # the attention core only
    return 0.0


def hardware_flops_per_token(layout: Layout) -> float:
    """FLOPs per token actually executed: the model's plus the recomputed forward."""
    return flops_per_token(layout) + layout.layers * _recompute_flops_fwd(layout)


@dataclass(frozen=True)
class StepTime:
    """One step's predicted time (seconds) by part, and the figures derived from it."""

    compute: float
    tensor_parallel: float
    pipeline_p2p: float
    bubble: float
    data_parallel: float
    step: float
    tokens_per_s: float
    tflops_per_gpu: float
    """Hardware FLOP/s per GPU in TFLOP/s, recomputation counted (Megatron's/BLOOM's count)."""
    mfu: float


def _ring(bytes_: float, ranks: int, bandwidth: float, all_reduce: bool = True) -> float:
    """Seconds of a ring collective over ``ranks``: all-reduce moves 2(n-1)/n of the buffer,
    reduce-scatter or all-gather (n-1)/n."""
    if ranks <= 1:
        return 0.0
    return (2.0 if all_reduce else 1.0) * (ranks - 1) / ranks * bytes_ / bandwidth


def step_time(layout: Layout, device: Device, efficiency: float = DEFAULT_EFFICIENCY,
              dp_overlap: float = 0.0) -> StepTime:
    """Predicted time of one optimizer step of ``layout`` on ``device`` (see module doc)."""
    s, b, h, t, p, m = (layout.seq, layout.micro_batch, layout.hidden, layout.tp, layout.pp,
                        layout.micro_batches)
    tokens = s * b
    rate = device.peak_bf16_flops * efficiency * t
    block_flops = 3 * _block_matmul_flops_fwd(layout) + _recompute_flops_fwd(layout)
    tp_calls = 4 + (2 if layout.recompute == "full" else 0)
    tp_per_block = tp_calls * _ring(2.0 * tokens * h, t, device.nvlink_bytes_per_s)
    # the slowest stage sets the pipeline's pace: most blocks, or the head's extra matmul
    slot_compute, slot_tp = 0.0, 0.0
    for stage in range(p):
        n = layers_on_stage(layout, stage)
        flops = n * block_flops + (3 * _head_flops_fwd(layout) if stage == p - 1 else 0.0)
        if flops * tokens / rate + n * tp_per_block > slot_compute + slot_tp:
            slot_compute, slot_tp = flops * tokens / rate, n * tp_per_block
    slot_p2p = 2 * 2.0 * tokens * h / t / device.network_bytes_per_s if p > 1 else 0.0
    slot = slot_compute + slot_tp + slot_p2p
    compute, tensor_parallel, p2p = m * slot_compute, m * slot_tp, m * slot_p2p
    bubble = (p - 1) * slot

    # the first stage's ranks reduce their blocks plus the embedding: taken as the slowest
    params_rank = (layers_on_stage(layout, 0) * layout.block_parameters()
                   + layout.vocab * h) / t
    spans_nodes = t * layout.dp > device.gpus_per_node
    bw = device.network_bytes_per_s if spans_nodes else device.nvlink_bytes_per_s
    grads = params_rank * layout.grad_bytes
    params = params_rank * layout.param_bytes
    dp, z = layout.dp, layout.zero_stage
    if z in (1, 2) and not layout.fsdp_engine:
        # the buffers engine (Megatron's distributed optimizer): the fp32 buckets
        # reduce-scattered once per step (ZeRO-2: per micro-batch), the updated parameters
        # all-gathered once, in their dtype
        scatters = m if z == 2 else 1
        reduction = (scatters * _ring(grads, dp, bw, all_reduce=False)
                     + _ring(params, dp, bw, all_reduce=False))
    elif z == 0:
        reduction = _ring(grads, dp, bw)
    elif z == 1:
        reduction = _ring(grads, dp, bw) + _ring(params, dp, bw, all_reduce=False)
    else:
        gathers = 1 if z == 2 else 2
        reduction = m * (_ring(grads, dp, bw, all_reduce=False)
                         + gathers * _ring(params, dp, bw, all_reduce=False))
    data_parallel = (1.0 - dp_overlap) * reduction

    step = compute + tensor_parallel + p2p + bubble + data_parallel
    step_tokens = layout.global_batch * s
    return StepTime(
        compute=compute, tensor_parallel=tensor_parallel, pipeline_p2p=p2p, bubble=bubble,
        data_parallel=data_parallel, step=step, tokens_per_s=step_tokens / step,
        tflops_per_gpu=hardware_flops_per_token(layout) * step_tokens / step / layout.gpus / 1e12,
        mfu=flops_per_token(layout) * step_tokens / step / layout.gpus / device.peak_bf16_flops)
