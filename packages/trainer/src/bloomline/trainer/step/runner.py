"""``StepRunner``: what the trainer, validation, ``trainer evaluate`` and the planner ask of a
rank's model, whatever its layout: one training step, each sample's loss, the whole model's
state. Two implementations: ``PlainRunner`` (one model: no pipelining, any tp/dp/ZeRO) and
``PipelinedRunner`` (this rank's pipeline stages under torch's schedule).

Why one sequence here: a step is the same everywhere (learning rate -> forward/backward over
the micro-batches -> gradient reductions the layout needs -> unscale (fp16) -> clip -> finish
or skip); the runners differ only in how they run forward/backward, reduce and measure the
gradient norm, so those are the methods they implement and nothing else forks.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

import torch

from bloomline.trainer.reporting.step_sections import Sections
from bloomline.trainer.step.document_masks import DocumentMasks
from bloomline.trainer.step.recompute import StepRecompute
from bloomline.trainer.step.tail import finish_step, max_norm, set_learning_rate

__all__ = ["StepRunner"]


class StepRunner(ABC):
    """One rank's step over its model (``model``: a GPT, or the stages a pipeline rank holds
    under the single-process names), with ``optimizer`` and ``precision``.

    Invariant: every rank calls each method at the same point with the same micro-batch count
    (they contain collectives)."""

    # where the step marks its sections (reporting/step_sections.py); the trainer sets its
    # clock, the default does nothing (a step outside a training loop)
    sections: Sections = Sections()
    # the run's document masking (document_masks.py), set by build.py; None: off
    documents: DocumentMasks | None = None

    def __init__(self, model, optimizer, precision, clip_grad: float,
                 micro_batch_size: int) -> None:
        self.model, self.optimizer, self.precision = model, optimizer, precision
        self.clip_grad, self.micro_batch_size = clip_grad, micro_batch_size
        # the buffers engine's optimizer (parallel/distributed_optimizer.py): it holds the
        # gradients (reduced, clipped and stepped as this rank's owned rows); None: the
        # gradients are the parameters' ``.grad``
        self.distributed = optimizer if hasattr(optimizer, "reduce_gradients") else None
        # this rank's loss before the data-parallel mean, set by ``forward_backward``
        self.local_loss: torch.Tensor | None = None
        # the recompute of suspect steps (``recompute.py``), set by the trainer; None: off
        self.recompute: StepRecompute | None = None

    def train_step(self, micro_batches: list[torch.Tensor], lr: float,
                   activation_stats: bool = False, sources: torch.Tensor | None = None,
                   num_sources: int = 0) -> dict:
        """Forward/backward over the micro-batches of one global batch ([mbs, L + 1] token
        tensors), clip, and step (or skip the step when the loss or a gradient is not
        finite). Returns loss, grad_norm, skipped and, with ``activation_stats``, the
        per-layer readings (``tail.finish_step``). With ``sources`` (the dataset number of
        each of this rank's samples, in micro-batch order; ``data.sample_sources``)
        also ``source_totals``: per dataset of ``num_sources``, the sum of its samples' losses
        and their count over the global batch (every dp rank's), from this step's forward.
        With ``recompute``, a suspect step is computed again before the optimizer steps, and
        the result also holds ``recompute`` (what the two attempts gave)."""
        set_learning_rate(self.optimizer, lr)
        recompute = self.recompute
        if recompute is not None:
            recompute.begin()
        loss, totals, grad_norm = self._attempt(micro_batches, activation_stats, sources,
                                                num_sources)
        outcome = None
        if recompute is not None:
            redone = recompute.check(loss, grad_norm, lambda: self._attempt(
                micro_batches, activation_stats, sources, num_sources))
            if redone is not None:
                (loss, totals, grad_norm), outcome = redone
        self.sections.enter("optimizer")
        result = finish_step(self.optimizer, self.precision.scaler, loss, grad_norm, totals,
                             self.activation_stats if activation_stats else None)
        if outcome is not None:
            result["recompute"] = outcome
        return result

    def _attempt(self, micro_batches, activation_stats, sources, num_sources):
        """The step up to its optimizer step: forward/backward, reductions, unscale, clip;
        returns (loss, source totals, gradient norm)."""
        loss, totals = self.forward_backward(micro_batches, activation_stats, sources,
                                             num_sources)
        if self.recompute is not None:
            self.recompute.after_backward()
        self.sections.enter("reduce")
        if self.distributed is not None:
            self.distributed.reduce_gradients()  # data parallelism's, on the buffers engine
        self.reduce_gradients()
        if self.precision.scaler is not None:
            self.unscale()
        return loss, totals, self.clip_grad_norm(max_norm(self.clip_grad))

    def drop_gradients(self) -> None:
        """Forget this step's gradients before it is computed again: every engine's
        ``zero_grad`` (the buffers engine zeroes its buckets); an fp16 scaler forgets that it
        unscaled them (its per-optimizer record, which ``update`` would reset)."""
        self.optimizer.zero_grad(set_to_none=True)
        if self.precision.scaler is not None:
            self.precision.scaler._per_optimizer_states.pop(id(self.optimizer), None)

    @abstractmethod
    def forward_backward(self, micro_batches: list[torch.Tensor],
                         activation_stats: bool = False, sources: torch.Tensor | None = None,
                         num_sources: int = 0
                         ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Forward and backward over the micro-batches, leaving the (scaled) gradients in the
        model: the global batch's mean loss (the same on every rank) and, with ``sources``,
        its per-source totals (``tail.step_source_totals``)."""

    def reduce_gradients(self) -> None:  # noqa: B027 - a hook: most layouts need none
        """Gradient reductions the layout needs beyond data parallelism's (none by default)."""

    def unscale(self) -> None:
        """fp16: divide the gradients by the loss scale, recording inf/NaN for the scaler."""
        self.precision.scaler.unscale_(self.optimizer)

    @abstractmethod
    def clip_grad_norm(self, max_norm: float) -> torch.Tensor:
        """Clip every gradient by the whole model's gradient norm; returns the norm."""

    @abstractmethod
    def sample_losses(self, samples: Sequence[torch.Tensor]) -> torch.Tensor:
        """Each sample's mean loss ([len(samples)] fp32 on CPU, on every rank), forward only
        in micro-batches of ``train.micro_batch_size``. Collective: every rank evaluates every
        sample (FSDP's gathers need all dp ranks in each forward)."""

    def grad_reader(self):
        """Where a parameter's gradient is read (per-layer norms): the buffers engine's
        dp-sharded one, or None for its ``.grad``."""
        return self.distributed.grad_of if self.distributed is not None else None

    def local_full_state(self) -> dict[str, torch.Tensor]:
        """This rank's modules' parameters whole (gathered over tp/dp), plain CPU tensors
        under the single-process names: the fp32 masters on the buffers engine."""
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_model_state_dict,
        )

        state = get_model_state_dict(self.model, options=StateDictOptions(full_state_dict=True))
        state = {name: value.detach().cpu() for name, value in state.items()}
        if self.distributed is not None:
            names = {param: name for name, param in self.model.named_parameters()}
            state.update(self.distributed.full_master(names))
        return state

    @abstractmethod
    def full_model_state(self) -> dict[str, torch.Tensor]:
        """The whole model's parameters as plain CPU tensors under the single-process names,
        on every rank (gathers shards: for tests, export and small models)."""

    @abstractmethod
    def activation_stats(self) -> dict[str, list[float]]:
        """The per-layer readings the model recorded in this step's first micro-batch."""
