"""The model: architecture only (no parallelism, no precision policy, no kernels).

``gpt.py`` (the GPT and its blocks), ``attention.py``, ``position.py`` (the position-encoding
seam) and ``alibi.py`` (the encoding BLOOM uses), ``documents.py`` (attention within each
document of a packed sample), ``layers.py``, ``loss.py`` (the fused LM head + cross-entropy),
``config.py``. Faster kernels for its ops live in
``bloomline.trainer.kernels`` and are imported by their entry points.
"""

import importlib

from bloomline.trainer.model.config import ModelConfig, padded_vocab_size

__all__ = ["GPT", "ModelConfig", "PositionEncoding", "alibi_bias", "alibi_slopes",
           "build_model", "padded_vocab_size", "position_encoding"]

# The torch modules load on first use of one of their names (PEP 562): the config schema
# imports ModelConfig (``config.py``), and reading or checking a config needs no torch.
_LAZY = {"GPT": "gpt", "build_model": "gpt", "alibi_bias": "alibi", "alibi_slopes": "alibi",
         "PositionEncoding": "position", "position_encoding": "position"}


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
