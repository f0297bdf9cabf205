"""``PlainRunner``: the step of one whole model (no pipelining; tensor, sequence and data
parallelism and every ZeRO stage are inside the model's parameters and hooks).

Invariants: gradients are synchronized across data-parallel ranks once, after the last
micro-batch; each micro-batch's loss is divided by the micro-batch count before backward, so
the gradients are those of the global batch's mean loss; every rank calls ``forward_backward``
with the same number of micro-batches (the reductions are collectives).
"""

from __future__ import annotations

import torch

from bloomline.trainer.parallel.data_parallel import set_gradient_sync
from bloomline.trainer.reporting.metrics import activation_stats as read_activation_stats
from bloomline.trainer.step.runner import StepRunner
from bloomline.trainer.step.sample_forward import batched_sample_losses, forward_loss
from bloomline.trainer.step.tail import clip_grad_norm, dp_mean, step_source_totals

__all__ = ["PlainRunner"]


class PlainRunner(StepRunner):
    """One model's step in the run's precision. ``tp_mesh``: the tensor-parallel axis (None
    without tp); ``loss_fn``/``loss_context``: from ``sample_forward.loss_functions``;
    ``dp_group``: the data-parallel group (None: one dp rank) over which the step's loss is
    averaged."""

    def __init__(self, model, optimizer, precision, device: torch.device, tp_mesh, loss_fn,
                 loss_context, dp_group, clip_grad: float, micro_batch_size: int) -> None:
        super().__init__(model, optimizer, precision, clip_grad, micro_batch_size)
        self.device, self.tp_mesh = device, tp_mesh
        self.tensor_parallel = tp_mesh.size() if tp_mesh is not None else 1
        self.loss_fn, self.loss_context, self.dp_group = loss_fn, loss_context, dp_group

    def forward_backward(self, micro_batches: list[torch.Tensor],
                         activation_stats: bool = False, sources: torch.Tensor | None = None,
                         num_sources: int = 0
                         ) -> tuple[torch.Tensor, torch.Tensor | None]:
        model, precision = self.model, self.precision
        model.train()
        count = len(micro_batches)
        total = torch.zeros((), device=self.device)
        per_sample = []
        for index, tokens in enumerate(micro_batches):
            self.sections.enter("forward")
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
                self.sections.enter("backward")
                precision.scale(loss / count).backward()
            total += loss.detach()
        model.set_activation_stats(False)
        self.sections.enter("reduce")
        self.local_loss = total / count
        loss = dp_mean(self.local_loss, self.dp_group)
        totals = None
        if sources is not None:
            totals = step_source_totals(torch.cat(per_sample), sources, num_sources,
                                        self.dp_group)
        return loss, totals

    def forward_loss(self, tokens: torch.Tensor, per_sample: bool = False):
        """``sample_forward.forward_loss`` of this model, in the run's precision (inside
        ``loss_context``)."""
        return forward_loss(self.model, tokens, self.precision.autocast, self.tensor_parallel,
                            self.loss_fn, per_sample, self.documents)

    def clip_grad_norm(self, max_norm: float) -> torch.Tensor:
        if self.distributed is not None:
            return self.distributed.clip_grad_norm(max_norm)
        return clip_grad_norm(self.model.parameters(), max_norm)

    @torch.no_grad()
    def sample_losses(self, samples) -> torch.Tensor:
        self.model.eval()

        def forward(tokens: torch.Tensor) -> torch.Tensor:
            with self.loss_context():
                return self.forward_loss(tokens.to(self.device), per_sample=True)[1]

        return batched_sample_losses(forward, samples, self.micro_batch_size)

    def full_model_state(self) -> dict[str, torch.Tensor]:
        return self.local_full_state()

    def activation_stats(self) -> dict[str, list[float]]:
        return read_activation_stats(self.model, self.tp_mesh, self.grad_reader())
