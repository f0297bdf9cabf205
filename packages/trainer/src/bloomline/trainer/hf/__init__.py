"""Hugging Face interchange: our GPT <-> a ``BloomForCausalLM`` folder (config.json +
safetensors).

The model already follows BLOOM name for name and layout for layout (fused QKV per head as
[heads, 3, head_dim], GELU tanh, ALiBi, embedding LayerNorm, tied head), so conversion is a
rename (``transformer.`` prefix) plus a config translation; no tensor is reshaped. Our ALiBi
bias is relative (``slope * (j - i)``) where HF's is absolute (``slope * j``): they differ by
a constant per query row, which the softmax cancels.

- ``bloom_config.py``: config.json <-> ``ModelConfig``; ``HFInteropError``;
- ``bloom_names.py``: tensor names both ways, and the shape check of a state dict;
- ``export.py``: ``export_hf`` (``trainer export-hf``), with the run's tokenizer files
  (every kind as a ``tokenizer.json``; see :mod:`bloomline.dataprep.tokenizer.hf_export`);
- ``load.py``: ``import_hf``, a BLOOM folder as config and state dict (``init_from``).
"""

from bloomline.trainer.hf.bloom_config import (
    HFInteropError,
    bloom_config,
    model_config_from_bloom,
    read_model_config,
)
from bloomline.trainer.hf.bloom_names import from_hf_state_dict, to_hf_state_dict
from bloomline.trainer.hf.export import export_hf
from bloomline.trainer.hf.load import import_hf

__all__ = ["HFInteropError", "bloom_config", "export_hf", "from_hf_state_dict", "import_hf",
           "model_config_from_bloom", "read_model_config", "to_hf_state_dict"]
