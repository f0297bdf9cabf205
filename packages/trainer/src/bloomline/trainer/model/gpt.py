"""The BLOOM-recipe GPT: embedding -> embedding LayerNorm -> pre-LN blocks -> final LayerNorm ->
LM head tied to the embedding. Architecture only: parallelism, precision policy and
compilation are applied from outside (bloomline.trainer.parallel, .precision).

Module names follow Hugging Face's BloomForCausalLM (``word_embeddings``, ``h.N.input_layernorm``,
``self_attention.query_key_value``, ``mlp.dense_h_to_4h``, ``ln_f``...) so that checkpoints map
name for name. Build it on the meta device, apply parallelism, then ``to_empty`` and
``init_weights``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from bloomline.trainer.kernels.cpu.gelu import bloom_gelu
from bloomline.trainer.kernels.cpu.linear import Linear, linear
from bloomline.trainer.model.attention import Attention
from bloomline.trainer.model.config import ModelConfig
from bloomline.trainer.model.layers import LayerNorm, compute_dtype
from bloomline.trainer.model.loss import linear_cross_entropy

__all__ = ["GPT", "MLP", "Block", "build_model"]


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.dense_h_to_4h = Linear(cfg.hidden_size, cfg.ffn_size)
        self.dense_4h_to_h = Linear(cfg.ffn_size, cfg.hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dense_4h_to_h(bloom_gelu(self.dense_h_to_4h(x)))


class Block(nn.Module):
    """Pre-LN block: x + attn(LN(x)), then x + mlp(LN(x)). The residual add happens in the
    residual stream's dtype (fp32 with ``residual_fp32``)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.input_layernorm = LayerNorm(cfg.hidden_size, cfg.layernorm_epsilon,
                                         cfg.layernorm_fp32)
        self.self_attention = Attention(cfg)
        self.post_attention_layernorm = LayerNorm(cfg.hidden_size, cfg.layernorm_epsilon,
                                                  cfg.layernorm_fp32)
        self.mlp = MLP(cfg)
        self.dropout = cfg.hidden_dropout
        # activation stats: when set, forward keeps max |MLP output| and max |residual stream|
        self.track_activations = False
        self.max_mlp_output: torch.Tensor | None = None
        self.max_residual: torch.Tensor | None = None

    def forward(self, x: torch.Tensor, bias=None) -> torch.Tensor:
        """``bias``: the position encoding's attention bias, or flex's BlockMask
        (``Attention.bias_for``; built when None)."""
        attn = self.self_attention(self.input_layernorm(x), bias)
        x = x + F.dropout(attn, self.dropout, self.training).to(x.dtype)
        mlp = self.mlp(self.post_attention_layernorm(x))
        x = x + F.dropout(mlp, self.dropout, self.training).to(x.dtype)
        if self.track_activations:
            with torch.no_grad():
                self.max_mlp_output = mlp.detach().abs().amax().float()
                self.max_residual = x.detach().abs().amax().float()
        return x


class GPT(nn.Module):
    """``forward(input_ids [b, L]) -> logits [b, L, vocab]``; ``forward(input_ids, labels)``
    -> the mean cross-entropy, head and loss fused (``model/loss.py``)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        if cfg.hidden_size % cfg.num_heads:
            raise ValueError(f"model.hidden_size {cfg.hidden_size} is not divisible by "
                             f"model.num_heads {cfg.num_heads}")
        self.config = cfg
        self.word_embeddings = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.word_embeddings_layernorm = LayerNorm(cfg.hidden_size, cfg.layernorm_epsilon,
                                                   cfg.layernorm_fp32)
        # a dict keyed "0".."N-1" (the same names as a list): a pipeline stage deletes the
        # blocks it does not hold and the rest keep their names, so checkpoints reshard
        self.h = nn.ModuleDict({str(i): Block(cfg) for i in range(cfg.num_layers)})
        self.ln_f = LayerNorm(cfg.hidden_size, cfg.layernorm_epsilon, cfg.layernorm_fp32)
        # False on pipeline stages after the first: they take hidden states (the last stage
        # keeps word_embeddings only as the tied head's weight)
        self.embeds_tokens = True

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor | None = None,
                token_losses: bool = False, document_ids: torch.Tensor | None = None
                ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """``input_ids`` [b, L] -> logits [b, L, vocab], or with ``labels`` [b, L] the mean
        fp32 cross-entropy (labels < 0 ignored) without materializing fp32 logits; with
        ``token_losses`` too, (mean, each token's fp32 loss [b, L], detached). A pipeline
        stage without the embedding (``word_embeddings`` None or ``embeds_tokens`` False) takes
        hidden states [b, L, h] instead, and one without the head (``ln_f`` None) returns
        hidden states. Vocabulary-sharded (tensor-parallel) heads take the logits path.
        ``document_ids`` [b, L] (``model/documents.py``): attention stays within each document
        of a packed sample (every pipeline stage takes them beside its input)."""
        embeds = self.embeds_tokens and self.word_embeddings is not None
        x = self.embed(input_ids) if embeds else input_ids
        bias = self.attention_bias(x.shape[1], x.device, document_ids)
        for block in self.h.values():
            x = block(x, bias)
        if self.ln_f is None:
            return x
        if labels is not None:
            return linear_cross_entropy(self.ln_f(x), self.word_embeddings.weight, labels,
                                        token_losses)
        return self.head(x)

    def attention_bias(self, seq_length: int, device: torch.device,
                       document_ids: torch.Tensor | None = None):
        """The position encoding's causal bias every block shares (all layers hold the same
        heads, model/position.py), made outside the blocks so that compiled (and recomputed)
        blocks take it as an input; with ``document_ids`` masked across documents
        (``Attention.bias_for``)."""
        for block in self.h.values():
            return block.self_attention.bias_for(seq_length, device, document_ids)
        return None

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Token embedding and its LayerNorm, in the residual stream's dtype."""
        x = self.word_embeddings_layernorm(self.word_embeddings(input_ids))
        stream = torch.float32 if self.config.residual_fp32 else compute_dtype(
            self.word_embeddings.weight)
        return x.to(stream)

    def head(self, x: torch.Tensor) -> torch.Tensor:
        """Final LayerNorm and the LM head tied to the embedding."""
        return linear(self.ln_f(x), self.word_embeddings.weight)

    @torch.no_grad()
    def init_weights(self, seed: int | None = None) -> None:
        """BLOOM's init on materialized (``to_empty``) parameters: normal(0, std) for the
        embedding and every Linear weight, std / sqrt(2 * layers) for the two projections that
        write into the residual stream, zero biases, LayerNorms at identity."""
        generator = None
        if seed is not None:
            generator = torch.Generator(device=self.word_embeddings.weight.device)
            generator.manual_seed(seed)
        std = self.config.std
        out_std = std / math.sqrt(2.0 * self.config.num_layers)
        for name, module in self.named_modules():
            if isinstance(module, nn.Embedding):
                module.weight.normal_(0.0, std, generator=generator)
            elif isinstance(module, nn.Linear):
                scaled = name.endswith(("self_attention.dense", "mlp.dense_4h_to_h"))
                module.weight.normal_(0.0, out_std if scaled else std, generator=generator)
                module.bias.zero_()
            elif isinstance(module, nn.LayerNorm):
                module.weight.fill_(1.0)
                module.bias.zero_()

    def set_activation_stats(self, enabled: bool) -> None:
        """Record per-layer max |attention logit|, max |MLP output| and max |residual| on the
        next forward passes (a few extra reductions and one score matmul per layer)."""
        for block in self.h.values():
            block.track_activations = enabled
            block.self_attention.track_max_logit = enabled


def build_model(cfg: ModelConfig, device: torch.device | str = "cpu",
                seed: int | None = 0) -> GPT:
    """A GPT built on the meta device, materialized on ``device`` and initialized."""
    with torch.device("meta"):
        model = GPT(cfg)
    model.to_empty(device=device)
    model.init_weights(seed)
    return model
