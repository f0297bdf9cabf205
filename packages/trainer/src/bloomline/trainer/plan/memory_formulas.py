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

__all__ = ["Layout", "activation_bytes_per_layer", "layers_on_stage", "micro_batches_in_flight",
           "model_state_bytes", "rank_memory"]


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


def model_state_bytes(layout: Layout, stage: int = 0) -> dict[str, float]:
    """Parameters, gradients and optimizer state held by one rank of ``stage`` at the peak of
    a step, sharded over tp (and pp by stage) and by ZeRO over dp."""
    n = layers_on_stage(layout, stage) * layout.block_parameters()
    if stage == 0 or stage == layout.pp - 1:
        # the first stage has the embedding, the last the tied head's copy of it
        n += layout.vocab * layout.hidden + 2 * layout.hidden
    n /= layout.tp
    dp, z = layout.dp, layout.zero_stage
    out = {
        "parameters": n * layout.param_bytes / (dp if z >= 3 else 1),
        "gradients": n * layout.grad_bytes / (dp if z >= 2 else 1),
        "optimizer": n * layout.optimizer_bytes / (dp if z >= 1 else 1),
        "parameter_workspace": 0.0,
    }
    if layout.fsdp_engine:
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
    """Bytes one block stores for backward for one micro-batch (Korthikanti et al. 2022)."""
    s, b, h, a, t = layout.seq, layout.micro_batch, layout.hidden, layout.heads, layout.tp
    recompute = layout.recompute if recompute is None else recompute
    sbh = s * b * h
    if recompute == "full":
        return 2 * sbh / (t if layout.sequence_parallel else 1)
    kept_scores = recompute != "selective" and layout.stores_attention_scores
    scores = 5 * a * s / (h * t) if kept_scores else 0.0
    if layout.sequence_parallel:
        return sbh * (34 / t + scores)
    return sbh * (10 + 24 / t + scores)


def micro_batches_in_flight(layout: Layout, stage: int) -> int:
    """Micro-batches whose activations stage ``stage`` holds at once: p - stage for 1F1B
    (never more than the step has), all of them for GPipe."""
    m = layout.micro_batches
    return m if layout.schedule == "gpipe" else min(m, layout.pp - stage)


def rank_memory(layout: Layout, stage: int = 0) -> dict[str, float]:
    """Peak bytes on one rank of pipeline stage ``stage``, by kind, and ``total``.

    Kinds: model states (above); ``activations``, the stored activations of the micro-batches
    in flight; ``recompute_workspace``, one block's full activations while full recomputation
    rebuilds it; ``logits`` on the last stage, the fused head + loss's one [tokens, vocab / t]
    buffer in bf16 without tp and pp (model/loss.py: no fp32 logits); with tp or pp the loss
    takes materialized logits (losses.py): the bf16 [tokens, vocab / t] logits, their fp32
    upcast and the fp32 log-softmax kept for backward, 2 + 4 + 4 bytes per logit at the peak.
    """
    out = model_state_bytes(layout, stage)
    layers = layers_on_stage(layout, stage)
    in_flight = micro_batches_in_flight(layout, stage)
    out["activations"] = in_flight * layers * activation_bytes_per_layer(layout)
    out["recompute_workspace"] = (activation_bytes_per_layer(layout, "none")
                                  if layout.recompute == "full" else 0.0)
    per_logit = 2.0 if layout.tp == layout.pp == 1 else 10.0
    out["logits"] = (per_logit * layout.seq * layout.micro_batch * layout.vocab / layout.tp
                     if stage == layout.pp - 1 else 0.0)
    out["total"] = math.fsum(out.values())
    return out
