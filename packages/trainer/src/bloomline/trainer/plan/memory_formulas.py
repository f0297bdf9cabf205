"""Per-rank memory of a training layout, in bytes, from closed-form formulas (no torch).

``Layout`` is the model shape and the parallel layout; ``rank_memory(layout, stage)`` returns a
breakdown by kind and its total for one rank of pipeline stage ``stage`` (the worst stage by
default: the first, which holds the embedding and the most micro-batches in flight).

Model states follow what this trainer keeps (parallel/data_parallel.py, precision.py): fp32
parameters that are also the optimizer's master weights (bf16 copies exist only transiently in
autocast), fp32 gradients, Adam's m and v in fp32: 4 + 4 + 8 bytes per parameter. ZeRO shards
them over dp as the ZeRO paper does: stage 1 the optimizer state, 2 also the gradients, 3 also
the parameters; ``parameter_workspace`` adds the transient copies FSDP2 makes (see
``Layout.fsdp_engine``). (A bf16-parameter trainer such as Megatron-DeepSpeed keeps 2 + 4 + 12
and no such copy; the per-kind byte counts are fields so such a layout can be described too.)

Activations per block are Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large
Transformer Models", Table 2), for s tokens, micro-batch b, hidden h, a heads, t-way tensor
parallelism: ``sbh(34 + 5as/h)`` unparallelised, ``sbh(10 + 24/t + 5as/(ht))`` with tp,
``sbh(34/t + 5as/(ht))`` with tp and sequence parallelism. Selective recomputation drops the
``5as/h`` term; full recomputation keeps the block input only, ``2sbh`` (``/t`` with sp), plus
one block's full activations while it is recomputed. ALiBi's bias adds nothing stored beyond
the attention scores already in ``5as/h``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["Layout", "activation_bytes_per_layer", "activation_memory", "layers_on_stage",
           "micro_batches_in_flight", "model_state_bytes", "peak_total", "rank_memory",
           "zero_model_states"]


@dataclass(frozen=True)
class Layout:
    """A model and how it is laid out on dp x pp x tp ranks."""

    layers: int
    hidden: int
    heads: int
    vocab: int
    seq: int
    micro_batch: int
    global_batch: int
    tp: int = 1
    pp: int = 1
    dp: int = 1
    zero_stage: int = 0
    sequence_parallel: bool = False
    recompute: str = "none"
    """``none``, ``selective`` or ``full``."""
    schedule: str = "1f1b"
    """``1f1b`` or ``gpipe``."""
    ffn: int = 0
    """MLP width; 0 means 4 * hidden."""
    param_bytes: int = 4
    grad_bytes: int = 4
    optimizer_bytes: int = 8
    """Optimizer state per parameter (Adam's m and v; plus a master copy if params are bf16)."""
    stores_attention_scores: bool = True
    """Whether backward keeps the [s, s] attention scores per head (Korthikanti's ``5as/h``):
    True for an attention that materializes them (Megatron's fused softmax, this trainer's
    eager path); False for fused kernels that recompute them (flash / flex attention, the
    trainer's GPU path)."""
    activation_bytes: int = 2
    """Bytes per stored activation element: 2 for bf16/fp16 compute (Korthikanti's
    assumption), 4 for fp32."""
    residual_bytes: int = 2
    """Bytes per element of the residual stream, which the LayerNorms store as their input:
    4 with this trainer's fp32 residual stream (``model.residual_fp32``)."""
    dropout: bool = True
    """Whether dropout runs (Korthikanti's count includes its masks and the dropped attention
    probabilities); False for a recipe with every dropout at 0."""
    fsdp_engine: bool = True
    """This trainer's FSDP2-based data parallelism (parallel/data_parallel.py), whose
    transient parameter copies the ZeRO paper's accounting lacks; False for Megatron-LM or
    DeepSpeed runs."""

    def __post_init__(self) -> None:
        # a layout the trainer would refuse must not get a plan: catch it here, by name
        if self.global_batch % (self.dp * self.micro_batch):
            raise ValueError(f"global_batch {self.global_batch} is not a multiple of dp x "
                             f"micro_batch = {self.dp * self.micro_batch}")
        if not 1 <= self.pp <= self.layers:
            raise ValueError(f"cannot split {self.layers} layers into {self.pp} stages")
        if self.recompute not in ("none", "selective", "full"):
            raise ValueError(f"recompute must be none, selective or full, not {self.recompute!r}")
        if self.schedule not in ("1f1b", "gpipe"):
            raise ValueError(f"schedule must be 1f1b or gpipe, not {self.schedule!r}")
        if self.zero_stage not in (0, 1, 2, 3):
            raise ValueError(f"zero_stage must be 0-3, not {self.zero_stage}")

    @property
    def ffn_size(self) -> int:
        return self.ffn or 4 * self.hidden

    @property
    def gpus(self) -> int:
        return self.tp * self.pp * self.dp

    @property
    def micro_batches(self) -> int:
        """Micro-batches per step on each pipeline (gradient accumulation steps)."""
        return self.global_batch // (self.dp * self.micro_batch)

    def block_parameters(self) -> int:
        """One transformer block's parameters (QKV, output, MLP, two LayerNorms, biases)."""
        h, f = self.hidden, self.ffn_size
        return 4 * h * h + 2 * h * f + 9 * h + f

    def parameters(self) -> int:
        """Whole model, tied head counted once (ModelConfig.num_parameters' count)."""
        return self.vocab * self.hidden + 4 * self.hidden + self.layers * self.block_parameters()


def layers_on_stage(layout: Layout, stage: int) -> int:
    """Blocks on pipeline stage ``stage``: parallel/partition.py's uniform split (remainder to
    the middle stages, ties toward the first)."""
    p = layout.pp
    base, extra = divmod(layout.layers, p)
    middle = (p - 1) / 2
    by_centrality = sorted(range(p), key=lambda s: (abs(s - middle), s))
    return base + (stage in by_centrality[:extra])


def zero_model_states(parameters: float, stage: int, dp: int, param_bytes: int = 4,
                      grad_bytes: int = 4, optimizer_bytes: int = 8) -> dict[str, float]:
    """ZeRO's per-rank bytes (Rajbhandari et al. 2020) for ``parameters`` held by one model
    replica, at ``stage`` over ``dp`` ranks: stage 1 divides the optimizer state by dp, stage
    2 the gradients too, stage 3 the parameters too. The defaults are this trainer's fp32
    parameters and gradients and Adam's two fp32 moments (the paper's mixed-precision
    2 + 2 + 12 describes bf16 parameters with an fp32 master copy in the optimizer state)."""
    return {"parameters": parameters * param_bytes / (dp if stage >= 3 else 1),
            "gradients": parameters * grad_bytes / (dp if stage >= 2 else 1),
            "optimizer": parameters * optimizer_bytes / (dp if stage >= 1 else 1)}


def model_state_bytes(layout: Layout, stage: int = 0) -> dict[str, float]:
    """Parameters, gradients and optimizer state held by one rank of ``stage`` at the peak of
    a step, sharded over tp (and pp by stage) and by ZeRO over dp."""
    n = layers_on_stage(layout, stage) * layout.block_parameters()
    if stage == 0 or stage == layout.pp - 1:
        # the first stage has the embedding, the last the tied head's copy of it
        n += layout.vocab * layout.hidden + 2 * layout.hidden
    n /= layout.tp
    dp, z = layout.dp, layout.zero_stage
    out = zero_model_states(n, z, dp, layout.param_bytes, layout.grad_bytes,
                            layout.optimizer_bytes)
    out["parameter_workspace"] = 0.0
    if layout.fsdp_engine and (dp > 1 or z > 0):  # one process at ZeRO-0 has no engine
        # FSDP2's price (parallel/data_parallel.py): stages 0-1 compute on a second, plain
        # copy of the parameters held from forward to backward; stage 2 keeps its resident
        # shard besides the gathered whole (counted above); stage 3 gathers one block at a time
        if z <= 1:
            out["parameter_workspace"] = n * layout.param_bytes
        elif z == 2:
            out["parameter_workspace"] = n * layout.param_bytes / dp
        else:
            out["parameter_workspace"] = layout.block_parameters() / layout.tp * layout.param_bytes
    return out


def activation_bytes_per_layer(layout: Layout, recompute: str | None = None) -> float:
    """Bytes one block stores for backward for one micro-batch (Korthikanti et al. 2022).

    Their items, per element of [s, b, h] with e = ``activation_bytes``, r =
    ``residual_bytes`` and d = 1 with dropout: the two LayerNorm inputs 2r; QKV and MLP
    input e each (not split by tp without sp); q, k, v, the output projection's input 4e and
    the MLP's 4h-wide GeLU input and output 8e (split by tp); the two dropout masks 2d (one
    byte each). Per attention score (a [b, a, s, s] tensor, split by tp): the softmax output
    e, with dropout its mask (1) and output (e). With e = r = 2 and dropout:
    ``sbh(34 + 5as/h)``, ``sbh(10 + 24/t + 5as/(ht))`` with tp, ``sbh(34/t + 5as/(ht))`` with
    tp and sp."""
    s, b, h, a, t = layout.seq, layout.micro_batch, layout.hidden, layout.heads, layout.tp
    e, r, d = layout.activation_bytes, layout.residual_bytes, int(layout.dropout)
    recompute = layout.recompute if recompute is None else recompute
    sbh = s * b * h
    if recompute == "full":
        return r * sbh / (t if layout.sequence_parallel else 1)  # the block's input
    kept_scores = recompute != "selective" and layout.stores_attention_scores
    scores = (e + d * (1 + e)) * a * s / (h * t) if kept_scores else 0.0
    unsplit, split = 2 * r + 2 * e + 2 * d, 12 * e
    if layout.sequence_parallel:
        return sbh * ((unsplit + split) / t + scores)
    return sbh * (unsplit + split / t + scores)


def micro_batches_in_flight(layout: Layout, stage: int) -> int:
    """Micro-batches whose activations stage ``stage`` holds at once: p - stage for 1F1B
    (never more than the step has), all of them for GPipe."""
    m = layout.micro_batches
    return m if layout.schedule == "gpipe" else min(m, layout.pp - stage)


def activation_memory(layout: Layout, stage: int, layers: int | None = None
                      ) -> dict[str, float]:
    """Activation bytes at the peak of a rank of pipeline stage ``stage`` holding ``layers``
    blocks (default: the uniform split's), by kind:

    - ``activations``: what the micro-batches in flight store, each the blocks' (above) plus
      the tensors around them: the embedding LayerNorm's input on the first stage, the final
      LayerNorm's and the head's inputs on the last.
    - ``recompute_workspace``: one block's full activations while full recomputation
      rebuilds it.
    - ``logits`` on the last stage. Without tp and pp the fused head + loss (model/loss.py)
      holds one [tokens, vocab] buffer in the compute dtype and the two gradients it computes
      in its forward ([vocab, h] and [tokens, h]); with tp or pp the loss takes materialized
      [tokens, vocab / t] logits (losses.py): the logits, their fp32 upcast and the fp32
      log-softmax kept for backward, e + 4 + 4 bytes per logit.
    """
    s, b, h, t = layout.seq, layout.micro_batch, layout.hidden, layout.tp
    e, r = layout.activation_bytes, layout.residual_bytes
    first, last = stage == 0, stage == layout.pp - 1
    layers = layers_on_stage(layout, stage) if layers is None else layers
    in_flight = micro_batches_in_flight(layout, stage)
    outer = (r if first else 0) + (r + e if last else 0)
    sbh = s * b * h / (t if layout.sequence_parallel else 1)
    out = {"activations": in_flight * (layers * activation_bytes_per_layer(layout)
                                       + outer * sbh),
           "recompute_workspace": (activation_bytes_per_layer(layout, "none")
                                   if layout.recompute == "full" else 0.0),
           "logits": 0.0}
    if last:
        tokens, vocab = s * b, layout.vocab
        if t == layout.pp == 1:
            out["logits"] = e * (tokens * vocab + vocab * h + tokens * h)
        else:
            out["logits"] = (e + 8) * tokens * vocab / t
    return out


def peak_total(memory: dict[str, float]) -> float:
    """The peak of a breakdown by kind: every kind at once, except that the logits (the end
    of the forward) and the recompute workspace (inside the backward) never coexist, so the
    larger of the two counts."""
    exclusive = ("logits", "recompute_workspace")
    rest = math.fsum(v for k, v in memory.items() if k not in exclusive and k != "total")
    return rest + max(memory.get(k, 0.0) for k in exclusive)


def rank_memory(layout: Layout, stage: int = 0) -> dict[str, float]:
    """Peak bytes on one rank of pipeline stage ``stage``, by kind, and ``total``
    (``peak_total``): the model states (``model_state_bytes``) and the activations
    (``activation_memory``)."""
    out = model_state_bytes(layout, stage)
    out.update(activation_memory(layout, stage))
    out["total"] = peak_total(out)
    return out
