"""The recompute of a suspect step (Megatron-core's rerun idea): a step whose loss or gradient
norm the spike detector rejects (a spike, or a value that is not finite) is computed a second
time, in place, on the same micro-batches, before the optimizer steps.

Two outcomes tell a fault of the data from one of the hardware:

- the same result, bitwise: the batch makes it (the data): the step goes on as before, and
  the run guard rolls back and skips the data as it always did;
- another result: a transient fault (a flipped bit, a miscomputing unit). The rank whose own
  results differ between the two attempts is the suspect (``survival/silent_errors.py``
  names it), and the step goes on with the recomputed result.

A rank's own results are what it computed before any data-parallel reduction mixed them with
the others': its loss before the dp mean (``StepRunner.local_loss``) and its gradient: on the
buffers engine a digest (``survival/bit_digest.py``) of each bucket right before its
reduce-scatter, taken at every step (the one cost a step without a finding pays at dp > 1:
one read of the rank's fp32 gradient buffer per reduction); without data parallelism the
gradient itself, digested on a suspect step only. The FSDP2 engine reduces gradients inside
its backward, where nothing can read them: there only the loss is compared per rank.

Why the same samples give the same bits: the recompute starts from the same parameters (the
optimizer has not stepped), without gradients (``StepRunner.drop_gradients``), with the random
generators as they were before the first attempt (dropout), and runs the same kernels in the
same order; the runs this repository tests are bitwise deterministic on CPU, and a GPU run is
deterministic step to step where its kernels are (``torch.use_deterministic_algorithms``).
A nondeterministic kernel makes every recompute look like a transient fault on every rank:
the recompute then names every rank, which says so.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable

import torch
import torch.distributed as dist

from bloomline.trainer.survival.bit_digest import bits_sum, digest_of
from bloomline.trainer.survival.bit_flips import bitflip_due, flip_bit
from bloomline.trainer.survival.spikes import SpikeFinding

__all__ = ["StepRecompute"]


def _float_bits(value: float) -> int:
    """The float64 bits of ``value`` (so that NaN equals NaN and -0.0 differs from 0.0)."""
    return struct.unpack("<q", struct.pack("<d", value))[0]


class StepRecompute:
    """The recompute of ``runner``'s suspect steps. ``judge`` decides and counts: its
    ``suspect(loss, grad_norm)`` returns why a step is suspect (None: it is not), its ``step``
    is the step being computed (the ``bitflip@grad`` fault's condition)."""

    def __init__(self, runner, judge) -> None:
        self.runner, self.judge = runner, judge
        self.attempt = 0
        self._rng: tuple = ()
        self._grad_flip: int | None = None
        buffers = runner.distributed.buffers if runner.distributed is not None else None
        self._digest: torch.Tensor | None = None
        if buffers is not None:  # the gradient read before each reduction
            self._digest = torch.zeros((), dtype=torch.int64, device=runner.device)
            buffers.on_reduce = self._before_reduce
        # without dp the gradient after backward is this rank's own
        self._local_grads = buffers is None and runner.dp_group is None

    def begin(self) -> None:
        """Before the step's first forward: the random generators' state, the gradient
        digest at zero, the ``bitflip@grad`` fault armed when it holds."""
        self.attempt = 0
        device = self.runner.device
        self._rng = (torch.random.get_rng_state(),
                     torch.cuda.get_rng_state(device) if device.type == "cuda" else None)
        if self._digest is not None:
            self._digest.zero_()
        self._grad_flip = bitflip_due("grad", self.judge.step)

    def after_backward(self) -> None:
        """The ``bitflip@grad`` fault where the gradient is still this rank's own after
        backward (no data parallelism)."""
        if self._grad_flip is None or self._digest is not None:
            return  # none armed, or the buffers engine flips before its reductions
        if not self._local_grads:
            raise RuntimeError("bitflip@grad: the FSDP2 engine reduces gradients inside "
                               "backward, there is no point to flip one rank's own: use the "
                               "buffers engine (parallel.zero_stage 1 or 2 in bf16 or fp32)")
        grads = [p.grad for p in self.runner.model.parameters() if p.grad is not None]
        flip_bit(grads[0], self._grad_flip, high_exponent=True)
        self._grad_flip = None

    def _before_reduce(self, buffer: torch.Tensor) -> None:
        # the buffers engine's hook: a bucket's [dp, S] buffer about to be reduce-scattered
        if self._grad_flip is not None and self.attempt == 0:
            flip_bit(buffer, self._grad_flip, high_exponent=True)
            self._grad_flip = None
        self._digest.add_(bits_sum(buffer))

    def _agreed(self, finding: SpikeFinding | None, loss: float) -> SpikeFinding | None:
        """Every rank's decision made one (a max over the world: one float per step). The
        loss is the same on every rank, but a gradient norm computed from each rank's copy
        of replicated gradients (the FSDP2 engine at ZeRO-0/1) is not when one copy was
        damaged after the reduction: a rank that recomputed alone would run its collectives
        against the others' optimizer step and hang the run."""
        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
            return finding
        flag = torch.tensor([float(finding is not None)], device=self.runner.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        if flag.item() and finding is None:
            return SpikeFinding("suspect on another rank", loss, math.nan, math.nan)
        return finding

    def _local_results(self) -> dict:
        """This rank's own results of the attempt just computed (bits, compared exactly)."""
        results = {}
        local_loss = self.runner.local_loss
        if local_loss is not None:
            results["loss"] = _float_bits(float(local_loss))
        if self._digest is not None:
            results["gradient"] = int(self._digest)
        elif self._local_grads:
            results["gradient"] = int(digest_of(
                p.grad for p in self.runner.model.parameters() if p.grad is not None))
        return results

    def check(self, loss: torch.Tensor, grad_norm: torch.Tensor,
              again: Callable[[], tuple]) -> tuple[tuple, dict] | None:
        """After the first attempt (its global ``loss`` and ``grad_norm``, the same on every
        rank): None when the step is not suspect; else the step computed again by ``again``
        (its ``(loss, totals, grad_norm)``) and what the two attempts gave, for
        ``survival/silent_errors.py`` to name and report:
        ``{"finding", "first", "second", "recurred", "differs"}``."""
        first_global = {"loss": float(loss), "grad_norm": float(grad_norm)}
        finding = self._agreed(self.judge.suspect(first_global["loss"],
                                                  first_global["grad_norm"]),
                               first_global["loss"])
        if finding is None:
            return None
        first = self._local_results()
        self.runner.drop_gradients()
        torch.random.set_rng_state(self._rng[0])
        if self._rng[1] is not None:
            torch.cuda.set_rng_state(self._rng[1], self.runner.device)
        if self._digest is not None:
            self._digest.zero_()
        self.attempt = 1
        redone = again()
        second = self._local_results()
        second_global = {"loss": float(redone[0]), "grad_norm": float(redone[2])}
        recurred = all(_float_bits(first_global[k]) == _float_bits(second_global[k])
                       for k in first_global)
        differs = [name for name in first if first[name] != second.get(name)]
        return redone, {"finding": finding, "first": first_global, "second": second_global,
                        "recurred": recurred, "differs": differs}
