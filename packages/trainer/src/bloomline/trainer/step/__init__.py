"""One training step, the same for every layout.

- ``runner.py``: ``StepRunner``, the interface (train step, per-sample losses, full model
  state) and the one step sequence (learning rate -> forward/backward -> reductions ->
  unscale -> clip -> finish);
- ``plain.py``: ``PlainRunner``, one whole model (tp, sp, dp and ZeRO live in its parameters);
- ``pipelined.py``: ``PipelinedRunner``, this rank's pipeline stages under torch's schedule;
- ``sample_forward.py``: a batch's loss and per-sample losses, the one forward that training,
  validation, ``trainer evaluate`` and the planner share;
- ``tail.py``: the data-parallel reductions, clipping and the finish/skip decision;
- ``recompute.py``: a suspect step computed again on the same micro-batches before the
  optimizer step (silent data corruption named, ``survival/silent_errors.py``).
"""

from bloomline.trainer.step.plain import PlainRunner
from bloomline.trainer.step.runner import StepRunner

__all__ = ["PlainRunner", "StepRunner"]
