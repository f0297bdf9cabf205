"""The model's shape and numerics: all the model code needs, nothing about parallelism."""

from __future__ import annotations

import math
from dataclasses import dataclass

from bloomline.common.config_loader import ranged

__all__ = ["ModelConfig", "padded_vocab_size"]


def padded_vocab_size(vocab_size: int, multiple: int = 128, tensor_parallel: int = 1) -> int:
    """Megatron's padding: the embedding rows rounded up to a multiple of 128 x TP, so every
    tensor-parallel shard has the same size and the GEMMs stay aligned."""
    step = multiple * tensor_parallel
    return -(-vocab_size // step) * step


@dataclass
class ModelConfig:
    """GPT with the BLOOM recipe: ALiBi, LayerNorm after the embedding, pre-LN, tied head."""

    vocab_size: int = ranged(50304, ge=0, le=2**31 - 1)
    """Embedding rows, already padded (see padded_vocab_size); the data's ids must be below it.
    0 (trainer): the tokenizer's vocabulary (its largest id + 1), padded to a multiple of
    128 x tensor_parallel. Divisible by parallel.tensor_parallel."""
    hidden_size: int = ranged(768, ge=1)
    """Width of the residual stream (h)."""
    num_layers: int = ranged(12, ge=1)
    """Transformer blocks; at least the pipeline stages."""
    num_heads: int = ranged(12, ge=1)
    """Attention heads; hidden_size must be divisible by it, and it by
    parallel.tensor_parallel. Any count (ALiBi handles non-powers of two)."""
    ffn_hidden_size: int = ranged(0, ge=0)
    """MLP width; 0 means 4 * hidden_size. Divisible by parallel.tensor_parallel."""
    hidden_dropout: float = ranged(0.0, ge=0, lt=1)
    """Dropout on the attention and MLP outputs before the residual add."""
    attention_dropout: float = ranged(0.0, ge=0, lt=1)
    """Dropout on the attention probabilities."""
    layernorm_epsilon: float = ranged(1e-5, gt=0)
    """LayerNorm epsilon."""
    layernorm_fp32: bool = True
    """Compute every LayerNorm in fp32 whatever the compute dtype."""
    softmax_fp32: bool = True
    """Attention softmax in fp32 (the eager path upcasts; sdpa and flex accumulate the
    softmax in fp32 for bf16/fp16 inputs by construction)."""
    residual_fp32: bool = True
    """Keep the residual stream in fp32 between blocks (BLOOM's fp32 residual connection)."""
    position_encoding: str = ranged("alibi", choices=("alibi",))
    """How attention learns token positions (model/position.py): alibi, a per-head linear
    penalty on query-key distance (BLOOM's). The only one today."""
    attention: str = ranged("auto", choices=("auto", "sdpa", "flex", "eager"))
    """Attention kernel: sdpa (scaled_dot_product_attention with an additive ALiBi bias), flex
    (FlexAttention with an ALiBi score_mod and a causal block mask; compiled; the GPU path),
    eager (explicit matmul-softmax-matmul), or auto: eager on CPU, flex on CUDA (why:
    docs/decisions/cpu-kernels.md)."""
    init_std: float = ranged(0.0, ge=0)
    """Std of the normal init; 0 means BLOOM's small init sqrt(2 / (5 h)). Output projections
    (attention dense, MLP fc2) get std / sqrt(2 * num_layers)."""

    @property
    def ffn_size(self) -> int:
        """The MLP width in effect (ffn_hidden_size, or 4h when it is 0)."""
        return self.ffn_hidden_size or 4 * self.hidden_size

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def std(self) -> float:
        return self.init_std or math.sqrt(2.0 / (5.0 * self.hidden_size))

    def num_parameters(self) -> int:
        """Parameter count (the tied head counted once)."""
        h, f, v = self.hidden_size, self.ffn_size, self.vocab_size
        per_layer = (2 * 2 * h  # two LayerNorms
                     + 3 * h * h + 3 * h  # fused QKV
                     + h * h + h  # attention output
                     + h * f + f + f * h + h)  # MLP
        return v * h + 2 * h + self.num_layers * per_layer + 2 * h

    def flops_per_token(self, seq_length: int) -> float:
        """Model FLOPs of forward + backward per token (3x the forward's 2 per MAC), with the
        attention score and value matmuls over the full L x L square as Megatron counts them."""
        h, f, v = self.hidden_size, self.ffn_size, self.vocab_size
        matmul_params = self.num_layers * (4 * h * h + 2 * h * f) + v * h
        attention = self.num_layers * 2 * seq_length * h  # QK^T and PV, per token
        return 6.0 * (matmul_params + attention)
