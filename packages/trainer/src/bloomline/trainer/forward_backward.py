"""Forward and backward of one global batch on a single (unpipelined) model, and the
forward-only per-sample losses that evaluation uses.

``Trainer.train_step`` (loop.py) calls ``ForwardBackward.run`` and then clips and finishes the
step (``step.py``); with pipeline parallelism ``parallel/pipeline.py`` does this part under
its schedule instead. Why a module of its own: the micro-batch loop, the precision (autocast,
loss scaling) and the choice of loss (fused head or vocabulary-sharded logits) are one
concern, separate from the loop that decides when to step.

Invariants: gradients are synchronized across data-parallel ranks once, after the last
micro-batch; each micro-batch's loss is divided by the micro-batch count before backward, so
the gradients are those of the global batch's mean loss; every rank calls ``run`` with the
same number of micro-batches (the reductions are collectives).
"""

from __future__ import annotations

import contextlib

import torch
from torch.distributed.tensor.parallel import loss_parallel

from bloomline.trainer.evaluation import batched_sample_losses
from bloomline.trainer.losses import lm_loss, per_sample_means, token_cross_entropy
from bloomline.trainer.parallel import set_gradient_sync
from bloomline.trainer.step import dp_mean, step_source_totals

__all__ = ["ForwardBackward", "loss_functions"]


def loss_functions(compile_loss: bool, tensor_parallel: int):
    """The loss over logits (``lm_loss``, compiled with ``train.compile``) and the context
    it runs in: ``loss_parallel`` under tensor parallelism (vocabulary-sharded logits,
    cross-entropy without gathering them), else a no-op."""
    loss_fn = torch.compile(lm_loss) if compile_loss else lm_loss
    loss_context = loss_parallel if tensor_parallel > 1 else contextlib.nullcontext
    return loss_fn, loss_context


class ForwardBackward:
    """One model's forward/backward over micro-batches, in the run's precision."""

    def __init__(self, model, precision, device: torch.device, tensor_parallel: int,
                 loss_fn, loss_context, dp_group) -> None:
        self.model, self.precision, self.device = model, precision, device
        self.tensor_parallel = tensor_parallel
        self.loss_fn, self.loss_context, self.dp_group = loss_fn, loss_context, dp_group

    def run(self, micro_batches: list[torch.Tensor], activation_stats: bool = False,
            sources: torch.Tensor | None = None, num_sources: int = 0
            ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Forward/backward over the micro-batches ([mbs, L + 1] token tensors) of one global
        batch, leaving the (scaled) gradients in the model. Returns the global batch's mean
        loss (over every dp rank) and, with ``sources``, its per-source totals
        (``step.step_source_totals``). ``activation_stats``: the model records its per-layer
        readings during the first micro-batch."""
        model, precision = self.model, self.precision
        model.train()
        count = len(micro_batches)
        total = torch.zeros((), device=self.device)
        per_sample = []
        for index, tokens in enumerate(micro_batches):
            tokens = tokens.to(self.device, non_blocking=True)
            model.set_activation_stats(activation_stats and index == 0)
            # data parallelism reduces gradients once, after the last micro-batch
            set_gradient_sync(model, index == count - 1)
            with self.loss_context():
                if sources is None:
                    loss = self.forward_loss(tokens)
                else:
                    loss, samples_loss = self.forward_loss(tokens, per_sample=True)
                    per_sample.append(samples_loss)
                precision.scale(loss / count).backward()
            total += loss.detach()
        model.set_activation_stats(False)
        loss = dp_mean(total / count, self.dp_group)
        totals = None
        if sources is not None:
            totals = step_source_totals(torch.cat(per_sample), sources, num_sources,
                                        self.dp_group)
        return loss, totals

    def forward_loss(self, tokens: torch.Tensor, per_sample: bool = False
                     ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """The mean loss of a [mbs, L + 1] token batch (inside ``loss_context``), and with
        ``per_sample`` each sample's mean loss [mbs] (detached) from the same forward. Without
        tensor parallelism the model fuses its head with the loss (no fp32 logits,
        ``model/loss.py``); vocabulary-sharded logits go through ``loss_parallel``."""
        labels = tokens[:, 1:]
        if self.tensor_parallel == 1:
            with self.precision.autocast():
                out = self.model(tokens[:, :-1], labels=labels, token_losses=per_sample)
            return (out[0], per_sample_means(out[1], labels)) if per_sample else out
        with self.precision.autocast():
            logits = self.model(tokens[:, :-1])
        if not per_sample:
            return self.loss_fn(logits, labels)
        loss, token_losses = token_cross_entropy(logits, labels)
        return loss, per_sample_means(token_losses, labels)

    @torch.no_grad()
    def sample_losses(self, samples, micro_batch_size: int) -> torch.Tensor:
        """Each sample's mean loss ([len(samples)] fp32 on CPU), forward only in micro-batches
        of ``micro_batch_size``. Collective: every rank evaluates every sample (FSDP's gathers
        need all dp ranks in each forward)."""
        self.model.eval()

        def forward(tokens: torch.Tensor) -> torch.Tensor:
            with self.loss_context():
                return self.forward_loss(tokens.to(self.device), per_sample=True)[1]

        return batched_sample_losses(forward, samples, micro_batch_size)
