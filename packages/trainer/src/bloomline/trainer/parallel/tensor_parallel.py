"""Megatron tensor parallelism, with optional sequence parallelism, on DTensor.

``apply_tensor_parallel(model, tp_mesh, cfg)`` rewrites a GPT (or a pipeline stage of one) in
place with ``torch.distributed.tensor.parallel`` styles; the model code knows nothing of it.

Mental model (Megatron-LM's layout, written as torch's parallel styles):

- Attention: the fused QKV projection column-wise, the output projection row-wise. QKV's rows
  are laid out [heads, 3, head_dim], so a contiguous row shard is a shard of whole heads: tp
  rank r holds heads [r h/tp, (r+1) h/tp) and their position bias (ALiBi's slopes;
  ``Attention.head_start`` / ``num_heads`` are set to that range). MLP: fc1 column-wise, fc2
  row-wise. Forward costs one all-reduce per attention and per MLP (Megatron's "g"), backward
  one each ("f").
- Embedding vocabulary-parallel (row-wise on the table: each rank looks up the ids of its
  vocabulary range in its local shard, the partial sums are reduced: ``_VocabParallelEmbedding``,
  whose backward gives the shard's gradient only). The LM head stays tied to it: ``GPT.head``
  is ``F.linear(ln_f(x), word_embeddings.weight)`` with that weight a Shard(0) DTensor, so the
  logits come out vocabulary-sharded (Shard(-1)) and one parameter collects both gradients.
  The trainer computes cross-entropy under ``loss_parallel()`` on those sharded logits (no
  gather of the [b, L, vocab] logits).
- Sequence parallelism (``parallel.sequence_parallel``): the LayerNorm / dropout / residual
  regions hold a sequence shard [b, L/tp, h] instead of a replica. The row-wise outputs
  reduce-scatter into the shard, the attention / MLP inputs all-gather from it (same traffic
  as the all-reduce, 1/tp of the activation memory in those regions).
- Every parameter ends up a DTensor on the tp mesh (LayerNorms and row-wise biases
  Replicate), so gradient clipping, FSDP2 over a (dp, tp) mesh and DCP see one kind.
- Between modules activations are plain local tensors (torchtitan's convention): the residual
  stream is a replica (or a sequence shard) in the residual dtype, and the blocks run
  unchanged. The one exception is the embedding's output under sequence parallelism: it stays
  a DTensor (global shape) up to the first block so that ``GPT.attention_bias`` (the position
  encoding's bias) sees the full sequence length, and each block's input hook turns it local.

Activation stats (max |attention logit|, max |MLP output|, max |residual|) are per-rank
values inside a block (local heads, local sequence shard); each block gets ``tp_mesh`` and
``metrics.activation_stats`` takes the max over it, so the readings equal one process's
(at reading time: a forward hook would be undone by activation checkpointing's replay).

Dropout note: dropout on local tensors draws from each rank's own generator, which every rank
seeds the same: with attention dropout the tp ranks drop the same positions in different heads,
with sequence parallelism the same positions in different sequence shards (Megatron forks a
"model-parallel" RNG for these). The BLOOM recipe trains without dropout.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import (
    DTensor,
    Partial,
    Replicate,
    Shard,
    distribute_module,
    distribute_tensor,
)
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    PrepareModuleOutput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)
from torch.distributed.tensor.parallel.style import ParallelStyle

__all__ = ["apply_tensor_parallel"]


class _ReplicateNorm(ParallelStyle):
    """A LayerNorm over a replicated activation (tp without sequence parallelism): parameters
    become Replicate DTensors (so every parameter is a DTensor on the tp mesh), the input is
    taken as Replicate, the output handed on as a local tensor (or, with
    ``use_local_output=False``, as the Replicate DTensor). torch ships no such style:
    SequenceParallel shards the input, PrepareModuleInput does not touch parameters."""

    def __init__(self, *, use_local_output: bool = True) -> None:
        super().__init__()
        self.use_local_output = use_local_output

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        def wrap_input(_module, inputs, mesh):
            x = inputs[0]
            if not isinstance(x, DTensor):
                x = DTensor.from_local(x, mesh, (Replicate(),), run_check=False)
            return (x, *inputs[1:])

        def unwrap_output(_module, output, _mesh):
            return output.to_local() if self.use_local_output else output

        # partition_fn None: distribute_module replicates every parameter
        return distribute_module(module, device_mesh, None, wrap_input, unwrap_output)


class _VocabParallelEmbedding(ParallelStyle):
    """Megatron's ``VocabParallelEmbedding`` as a style: the table a Shard(0) DTensor, each
    rank looking up the ids of its own vocabulary rows in its local shard (the others masked
    to zero) and the partial results summed over tp (an all-reduce, or with sequence
    parallelism a reduce-scatter into ``output_layout``'s shard); the output handed on as a
    local tensor.

    Why not torch's ``RowwiseParallel`` on the embedding: its backward computes the table's
    gradient as a *Replicate* DTensor, the whole [vocab, h] table on every rank (7.2 GB in
    bf16 for BLOOM's 250880 x 14336), before it is cut to the shard. Here the lookup runs on
    the local shard, so autograd produces the gradient of the shard only, and the tied head's
    Shard(0) gradient adds to it in place."""

    def __init__(self, output_layout) -> None:
        super().__init__()
        self.output_layout = output_layout

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        def shard_table(_name, mod, mesh):
            mod.register_parameter("weight", nn.Parameter(
                distribute_tensor(mod.weight, mesh, (Shard(0),))))

        distribute_module(module, device_mesh, shard_table)
        output_layout = self.output_layout

        def lookup(input_ids: torch.Tensor) -> torch.Tensor:
            table = module.weight.to_local()  # its gradient comes back as the Shard(0) one
            rows = table.shape[0]
            start = device_mesh.get_local_rank() * rows  # the padded vocabulary splits evenly
            outside = (input_ids < start) | (input_ids >= start + rows)
            local = F.embedding((input_ids - start).masked_fill(outside, 0), table)
            local = local.masked_fill(outside.unsqueeze(-1), 0.0)
            partial = DTensor.from_local(local, device_mesh, (Partial(),), run_check=False)
            return partial.redistribute(device_mesh, (output_layout,)).to_local()

        module.forward = lookup
        return module


def _blocks(model) -> list[nn.Module]:
    h = getattr(model, "h", None)
    return list(h.values()) if h is not None else []


def _block_plan(sequence_parallel: bool) -> dict[str, ParallelStyle]:
    if not sequence_parallel:
        return {
            "input_layernorm": _ReplicateNorm(),
            "self_attention.query_key_value": ColwiseParallel(),
            "self_attention.dense": RowwiseParallel(),
            "post_attention_layernorm": _ReplicateNorm(),
            "mlp.dense_h_to_4h": ColwiseParallel(),
            "mlp.dense_4h_to_h": RowwiseParallel(),
        }
    seq = Shard(1)  # [b, L, h]: the sequence dimension
    return {
        # the residual stream arrives as a local sequence shard (or, into the first block, as
        # the embedding's DTensor): the block adds local tensors
        "": PrepareModuleInput(input_layouts=(seq, None), desired_input_layouts=(seq, None),
                               use_local_output=True),
        "input_layernorm": SequenceParallel(),
        # all-gather the normalized shard; attention runs on local [b, L, local heads] tensors
        "self_attention": PrepareModuleInput(input_layouts=(seq, None),
                                             desired_input_layouts=(Replicate(), None),
                                             use_local_output=True),
        "self_attention.query_key_value": ColwiseParallel(),
        "self_attention.dense": RowwiseParallel(output_layouts=seq),  # reduce-scatter
        "post_attention_layernorm": SequenceParallel(),
        "mlp": PrepareModuleInput(input_layouts=(seq,), desired_input_layouts=(Replicate(),),
                                  use_local_output=True),
        "mlp.dense_h_to_4h": ColwiseParallel(),
        "mlp.dense_4h_to_h": RowwiseParallel(output_layouts=seq),
    }


def _outer_plan(model, sequence_parallel: bool) -> dict[str, ParallelStyle]:
    """Embedding, its LayerNorm and the final LayerNorm, those of them this model (or
    pipeline stage) holds."""
    plan: dict[str, ParallelStyle] = {}
    seq = Shard(1)
    if getattr(model, "word_embeddings", None) is not None:
        # also on a last pipeline stage that keeps the table only as the tied head's weight
        plan["word_embeddings"] = _VocabParallelEmbedding(seq if sequence_parallel
                                                          else Replicate())
    if getattr(model, "word_embeddings_layernorm", None) is not None:
        plan["word_embeddings_layernorm"] = (
            SequenceParallel(use_local_output=False) if sequence_parallel else _ReplicateNorm())
    embeds = model.embeds_tokens and "word_embeddings" in plan
    if sequence_parallel and not embeds:
        # a later pipeline stage takes this rank's local sequence shard of the hidden states:
        # as a DTensor its shape is the global one, which GPT.attention_bias sizes the bias by
        plan[""] = PrepareModuleInput(input_layouts=(seq,), desired_input_layouts=(seq,))
    if getattr(model, "ln_f", None) is not None:
        # the head's input is replicated (all-gathered from the shard with sequence
        # parallelism) so that F.linear with the Shard(0) tied weight gives Shard(-1) logits
        plan["ln_f"] = (SequenceParallel() if sequence_parallel
                        else _ReplicateNorm(use_local_output=False))
    return plan


def apply_tensor_parallel(model: nn.Module, tp_mesh: DeviceMesh, cfg) -> nn.Module:
    """Shard ``model`` (a GPT or a pipeline stage of one) over the 1-D ``tp_mesh`` in place:
    Megatron's column/row split of attention and MLP, vocabulary-parallel embedding and tied
    head, and with ``cfg.parallel.sequence_parallel`` sequence-sharded LayerNorm regions.
    Returns the model."""
    tp = tp_mesh.size()
    tp_rank = tp_mesh.get_local_rank()
    sequence_parallel = bool(cfg.parallel.sequence_parallel)
    for block in _blocks(model):
        attention = block.self_attention
        if attention.total_heads % tp:
            raise ValueError(f"{attention.total_heads} heads are not divisible by tp {tp}")
        # the contiguous row shard of the [heads, 3, head_dim] QKV rows is this head range
        attention.num_heads = attention.total_heads // tp
        attention.head_start = tp_rank * attention.num_heads
        parallelize_module(block, tp_mesh, _block_plan(sequence_parallel))
    parallelize_module(model, tp_mesh, _outer_plan(model, sequence_parallel))
    if sequence_parallel and getattr(model, "ln_f", None) is not None:
        parallelize_module(model.ln_f, tp_mesh, PrepareModuleOutput(
            output_layouts=Shard(1), desired_output_layouts=Replicate(), use_local_output=False))
    return model
