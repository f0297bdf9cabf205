"""The forward of a token batch to its loss and each sample's loss: one definition for the
training step, validation, ``trainer evaluate``, the pipeline's last stage and the planner.

Contract: every loss is the fp32 mean next-token cross-entropy of ``tokens[:, 1:]`` given
``tokens[:, :-1]`` ([b, L + 1] int64 batches), with the run's document masking
(``document_masks.py``: attention within documents, no loss on EOD inputs); per-sample losses
are each sample's mean over its counted tokens ([b] fp32, detached). Without tensor
parallelism the model fuses its head with the loss (no fp32 logits, ``model/loss.py``); the
vocabulary-sharded logits go through ``loss_parallel`` (``loss_functions``' context) and
``losses.py``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence

import torch

from bloomline.trainer.losses import lm_loss, per_sample_means, token_cross_entropy
from bloomline.trainer.step.document_masks import DocumentMasks, labels_of, model_inputs

__all__ = ["batched_sample_losses", "forward_loss", "logits_loss", "loss_functions"]


def loss_functions(compile_loss: bool, tensor_parallel: int):
    """The loss over logits (``lm_loss``, compiled with ``train.compile``) and the context
    it runs in: ``loss_parallel`` under tensor parallelism (vocabulary-sharded logits,
    cross-entropy without gathering them), else a no-op."""
    loss_fn = torch.compile(lm_loss) if compile_loss else lm_loss
    if tensor_parallel > 1:
        from torch.distributed.tensor.parallel import loss_parallel

        return loss_fn, loss_parallel
    return loss_fn, contextlib.nullcontext


def logits_loss(loss_fn, logits: torch.Tensor, labels: torch.Tensor, per_sample: bool = False
                ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """The mean loss of ``logits`` [b, L, V] against ``labels`` [b, L] and, with
    ``per_sample``, each sample's mean loss [b] from the same log-softmax."""
    if not per_sample:
        return loss_fn(logits, labels)
    loss, token_losses = token_cross_entropy(logits, labels)
    return loss, per_sample_means(token_losses, labels)


def forward_loss(model, tokens: torch.Tensor, autocast, tensor_parallel: int, loss_fn,
                 per_sample: bool = False, documents: DocumentMasks | None = None
                 ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """The mean loss of a [mbs, L + 1] token batch through ``model`` (a whole GPT, inside the
    loss context of ``loss_functions``), and with ``per_sample`` each sample's mean loss [mbs]
    (detached) from the same forward. ``autocast``: the precision's context factory;
    ``documents``: the run's document masking (None: off)."""
    inputs, labels = tokens[:, :-1], labels_of(documents, tokens)
    extra = model_inputs(documents, inputs)
    if tensor_parallel == 1:
        with autocast():
            out = model(inputs, labels=labels, token_losses=per_sample, **extra)
        return (out[0], per_sample_means(out[1], labels)) if per_sample else out
    with autocast():
        logits = model(inputs, **extra)
    return logits_loss(loss_fn, logits, labels, per_sample)


def batched_sample_losses(forward: Callable[[torch.Tensor], torch.Tensor],
                          samples: Sequence[torch.Tensor], micro_batch_size: int
                          ) -> torch.Tensor:
    """Each sample's loss ([len(samples)], fp32, CPU): ``forward(tokens [b, L + 1]) -> [b]``
    over micro-batches of ``micro_batch_size`` (the last one smaller)."""
    out = []
    for first in range(0, len(samples), micro_batch_size):
        ids = range(first, min(first + micro_batch_size, len(samples)))
        out.append(forward(torch.stack([samples[i] for i in ids])).float().cpu())
    return torch.cat(out) if out else torch.zeros(0)
