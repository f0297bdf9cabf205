"""Document masking under tensor and pipeline parallelism, with activation recomputation:
the same losses, gradient norms, parameters, attention readings and valid loss as one process
on packed batches (``data.reset_attention_mask`` and ``data.eod_mask_loss`` on). Two 2-process
gloo runs in all, ~40 s on 2 shared cores."""

from __future__ import annotations

import pytest
from document_workers import document_run
from equivalence import assert_same_training

from bloomline.trainer.parallel.local_processes import run_distributed

ADAM = {"optimizer": {"eps": 1e-6}}  # see test_parallel_tp.py's docstring


@pytest.fixture(scope="module")
def reference() -> dict:
    return document_run(ADAM)


def _assert_matches(reference: dict, results: list[dict]) -> None:
    for result in results:
        assert_same_training(reference, result)
        assert result["grad_norms"] == pytest.approx(reference["grad_norms"], rel=1e-5)
        assert result["valid_loss"] == pytest.approx(reference["valid_loss"], rel=1e-5)
        got = result["activation_stats"]["max_attention_logit"]
        want = reference["activation_stats"]["max_attention_logit"]
        assert got == pytest.approx(want, rel=1e-5)


@pytest.mark.slow
def test_tp2_sp_with_selective_recompute_masks_documents_like_one_process(reference):
    """Bug: a tensor-parallel rank masks its heads' bias with another sample's document ids
    or drops them (the bias is per head range), sequence parallelism sizes the bias by a
    rank's sequence shard instead of the whole sample, the selective recomputation of the attention
    core replays it without the per-sample bias, the max attention logit reads across
    documents on a rank, or the vocabulary-parallel loss counts the EOD inputs
    eod_mask_loss leaves out."""
    parallel = {"tensor_parallel": 2, "sequence_parallel": True,
                "activation_checkpoint": "selective"}
    _assert_matches(reference, run_distributed(2, document_run, {**ADAM,
                                                                 "parallel": parallel}))


@pytest.mark.slow
def test_pp2_with_full_recompute_masks_documents_like_one_process(reference):
    """Bug: the second pipeline stage never gets its micro-batch's document ids (it receives
    hidden states, not tokens) or gets another micro-batch's, the full recomputation of a
    block replays it without the mask, the last stage's loss keeps the EOD inputs, or the
    evaluation's schedule runs without the masks."""
    parallel = {"pipeline_parallel": 2, "pipeline_schedule": "1f1b",
                "activation_checkpoint": "full"}
    _assert_matches(reference, run_distributed(2, document_run, {**ADAM,
                                                                 "parallel": parallel}))
