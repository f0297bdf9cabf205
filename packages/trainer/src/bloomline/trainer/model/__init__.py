"""The model: architecture only (no parallelism, no precision policy, no kernels).

``gpt.py`` (the GPT and its blocks), ``attention.py``, ``position.py`` (the position-encoding
seam) and ``alibi.py`` (the encoding BLOOM uses), ``layers.py``, ``loss.py`` (the fused LM
head + cross-entropy), ``config.py``. Faster kernels for its ops live in
``bloomline.trainer.kernels`` and are imported by their entry points.
"""

from bloomline.trainer.model.alibi import alibi_bias, alibi_slopes
from bloomline.trainer.model.config import ModelConfig, padded_vocab_size
from bloomline.trainer.model.gpt import GPT, build_model
from bloomline.trainer.model.position import PositionEncoding, position_encoding

__all__ = ["GPT", "ModelConfig", "PositionEncoding", "alibi_bias", "alibi_slopes",
           "build_model", "padded_vocab_size", "position_encoding"]
