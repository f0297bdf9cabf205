"""``TrainState``: the counters of a run that a checkpoint carries besides the weights and the
optimizer (``trainer_state.json``), with the methods that change them.

Why typed: the loop, the run guard, rollbacks and the checkpoint glue all change the state; as
methods here each change has one definition (a step's advance, a skipped step, a rollback)
and a misspelt key is an AttributeError instead of a silent new entry.

``state_dict()`` is the JSON ``trainer_state.json`` holds, under the keys checkpoints have
always used; ``load_state_dict`` reads it, missing keys (older checkpoints) taking their
defaults.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

__all__ = ["TrainState"]


@dataclass
class TrainState:
    """Where the run is: ``step`` (optimizer steps taken, skipped ones included),
    ``consumed_samples`` / ``consumed_tokens`` (the train split's position and the tokens
    trained on), ``skipped_steps`` (non-finite or fp16-overflow steps) and ``bad_in_row``
    (the current streak of non-finite ones), ``rollbacks`` (loss-spike rollbacks so far),
    ``skip_samples`` (the ranges of train positions never trained on, in force),
    ``loss_scale`` (the fp16 scaler's state) and ``spike_history`` (the spike detector's
    baseline). ``stopped``: why this process stopped early (a signal, the wall clock), empty
    while it runs; not saved."""

    step: int = 0
    consumed_samples: int = 0
    consumed_tokens: int = 0
    skipped_steps: int = 0
    bad_in_row: int = 0
    rollbacks: int = 0
    skip_samples: list[list[int]] = field(default_factory=list)
    loss_scale: dict = field(default_factory=dict)
    spike_history: dict = field(default_factory=dict)
    stopped: str = ""

    _UNSAVED = ("stopped",)

    def state_dict(self) -> dict:
        """The JSON object a checkpoint's ``trainer_state.json`` holds."""
        return {f.name: _plain(getattr(self, f.name)) for f in dataclasses.fields(self)
                if f.name not in self._UNSAVED}

    def load_state_dict(self, state: dict) -> None:
        """Take a checkpoint's ``trainer_state.json`` (keys it lacks keep their defaults;
        unknown keys are ignored)."""
        fresh = TrainState()
        for f in dataclasses.fields(self):
            if f.name not in self._UNSAVED:
                setattr(self, f.name, state.get(f.name, getattr(fresh, f.name)))

    def advance(self, samples: int, length: int, position: int) -> None:
        """A step of ``samples`` samples of ``length`` tokens taken; the train split's next
        position is ``position`` (past the skips in force: ``SkipRanges.advance``)."""
        self.step += 1
        self.consumed_samples = position
        self.consumed_tokens += samples * length

    def count_skipped(self, bad: bool) -> int:
        """A skipped step; ``bad`` (non-finite, not an fp16 overflow) extends the streak.
        Returns the streak."""
        self.skipped_steps += 1
        if bad:
            self.bad_in_row += 1
        return self.bad_in_row

    def count_good(self) -> None:
        """A step that was taken ends a streak of bad ones."""
        self.bad_in_row = 0


def _plain(value):
    """JSON-ready copies (lists of lists, dicts) so that the saved state is not the live one."""
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value
