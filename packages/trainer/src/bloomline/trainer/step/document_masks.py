"""Document masking in the step: what a micro-batch's forward takes beside its tokens when
``data.reset_attention_mask`` / ``data.eod_mask_loss`` are on (Megatron's
``--reset-attention-mask``, ``--eod-mask-loss``).

Contract: for a token batch [b, L + 1] (inputs ``[:, :-1]``, labels ``[:, 1:]``),

- ``model_inputs(inputs)``: the model's keyword inputs: ``document_ids`` [b, L] (one cumsum
  on the batch's device, ``model/documents.py``) with ``reset_attention_mask``, else none;
- ``labels(tokens)``: the labels, -100 (ignored by every loss) where the *input* token is the
  EOD with ``eod_mask_loss``: megatron-core's ``loss_mask[data == eod] = 0``. The loss stays
  the mean over the counted tokens.

One object for every forward (training, validation, ``trainer evaluate``, the pipeline's
stages, the planner): the runner holds it (``StepRunner.documents``, set by ``build.py``).
Computed in the step rather than by the loader's workers: it is one pass over b x L ids on the
device, and the batches the loader hands over stay Megatron's plain token samples.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from bloomline.trainer.model.documents import document_ids

__all__ = ["IGNORED_LABEL", "DocumentMasks", "labels_of", "model_inputs"]

IGNORED_LABEL = -100


@dataclass(frozen=True)
class DocumentMasks:
    """``eod``: the run's end-of-document id; the two settings as the run has them."""

    eod: int
    reset_attention_mask: bool = False
    eod_mask_loss: bool = False

    def model_inputs(self, inputs: torch.Tensor) -> dict[str, torch.Tensor]:
        """The model's keyword inputs for ``inputs`` [b, L] (``GPT.forward``)."""
        if not self.reset_attention_mask:
            return {}
        return {"document_ids": document_ids(inputs, self.eod)}

    def labels(self, tokens: torch.Tensor) -> torch.Tensor:
        """The labels of ``tokens`` [b, L + 1], EOD inputs' masked with ``eod_mask_loss``."""
        labels = tokens[:, 1:]
        if not self.eod_mask_loss:
            return labels
        return labels.masked_fill(tokens[:, :-1] == self.eod, IGNORED_LABEL)


def model_inputs(documents: DocumentMasks | None, inputs: torch.Tensor) -> dict:
    """``documents.model_inputs(inputs)``, nothing when the run masks no documents."""
    return {} if documents is None else documents.model_inputs(inputs)


def labels_of(documents: DocumentMasks | None, tokens: torch.Tensor) -> torch.Tensor:
    """``documents.labels(tokens)``, the plain next tokens when the run masks none."""
    return tokens[:, 1:] if documents is None else documents.labels(tokens)
