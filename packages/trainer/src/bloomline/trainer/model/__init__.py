"""The model: architecture only (no parallelism, no precision policy)."""

from bloomline.trainer.model.alibi import alibi_bias, alibi_slopes
from bloomline.trainer.model.config import ModelConfig, padded_vocab_size
from bloomline.trainer.model.gpt import GPT, build_model

__all__ = ["GPT", "ModelConfig", "alibi_bias", "alibi_slopes", "build_model",
           "padded_vocab_size"]
