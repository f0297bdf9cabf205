"""The trainer's data: dataprep's samples as micro-batches in Megatron's order, and the checks
around them.

Modules:

- ``loader.py``: ``TokenSamples``, ``MegatronSampler``, ``open_splits``, ``make_loader``,
  ``StepBatches`` and ``open_step_batches``: what is read, in which order;
- ``workers.py``: the loader's worker processes (tracked, closed by ``close_loader``, dead
  with the trainer);
- ``run_tokenizer.py``: ``load_run_tokenizer``, the run's tokenizer, loaded once per process;
- ``end_of_document.py``: ``run_eod_id``, the id ending documents (tokenizer or corpus), for
  ``data.reset_attention_mask`` / ``data.eod_mask_loss``;
- ``vocabulary.py``: ``check_vocabulary`` and ``check_token_ids``, the tokenizer, corpus and
  batches against the model's vocabulary;
- ``blend_sources.py``: ``blend_of`` and ``sample_sources``, which dataset of a blend each
  sample comes from (the per-source train loss, per-dataset validation).

This package re-exports the names callers use; tests that monkeypatch a name patch the
module that defines it.
"""

from bloomline.trainer.data.blend_sources import blend_of, sample_sources
from bloomline.trainer.data.loader import (
    MegatronSampler,
    StepBatches,
    TokenSamples,
    make_loader,
    open_splits,
    open_step_batches,
)
from bloomline.trainer.data.run_tokenizer import load_run_tokenizer
from bloomline.trainer.data.vocabulary import check_token_ids, check_vocabulary
from bloomline.trainer.data.workers import close_loader

__all__ = ["MegatronSampler", "StepBatches", "TokenSamples", "blend_of", "check_token_ids",
           "check_vocabulary", "close_loader", "load_run_tokenizer", "make_loader",
           "open_splits", "open_step_batches", "sample_sources"]
