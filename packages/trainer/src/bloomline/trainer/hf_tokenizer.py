"""The tokenizer files of a Hugging Face export: they live in dataprep, beside the kinds.

Kept so that ``hf.py`` imports what it did; the code is
:func:`bloomline.dataprep.tokenizer.hf_export.hf_tokenizer_files` (each kind writes its own
``tokenizer.json``, with no torch), which ``hf.py`` may import directly.
"""

from bloomline.dataprep.tokenizer.hf_export import hf_tokenizer_files, tokenizer_json

__all__ = ["hf_tokenizer_files", "tokenizer_json"]
