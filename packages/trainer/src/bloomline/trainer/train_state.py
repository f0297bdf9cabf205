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
import math
from dataclasses import dataclass, field

from bloomline.common.errors import UserError

__all__ = ["TrainState", "range_problems"]

# the counters of trainer_state.json: ints >= 0
_COUNTERS = ("step", "consumed_samples", "consumed_tokens", "skipped_steps", "bad_in_row",
             "rollbacks")


# skip ranges' schema here, not in survival/sample_skips.py: checkpoint/ checks them and
# survival/ imports checkpoint/
def _count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def range_problems(value, field: str) -> list[str]:
    """Why ``value`` (read from a file: a checkpoint's trainer state, ``RUN/rollbacks.json``)
    is not a list of ``[start, end]`` sample positions with ``0 <= start < end``; empty when
    it is. ``field`` names it in the lines. A negative start would skip from before the
    data's first sample (a run once jumped past its end having trained nothing), an
    inverted one nothing at all."""
    if not isinstance(value, list):
        return [f"{field}: {value!r} is not a list of [start, end] ranges"]
    problems = []
    for i, pair in enumerate(value):
        if not (isinstance(pair, list) and len(pair) == 2 and all(map(_count, pair))
                and pair[0] < pair[1]):
            problems.append(f"{field}[{i}]: {pair!r} is not a range [start, end] of sample "
                            "positions with 0 <= start < end")
    return problems


@dataclass
class TrainState:
    """Where the run is: ``step`` (optimizer steps taken, skipped ones included),
    ``consumed_samples`` / ``consumed_tokens`` (the train split's position and the tokens
    trained on), ``skipped_steps`` (non-finite or fp16-overflow steps) and ``bad_in_row``
    (the current streak of non-finite ones), ``rollbacks`` (loss-spike rollbacks so far),
    ``skip_samples`` (the ranges of train positions never trained on, in force),
    ``loss_scale`` (the fp16 scaler's state) and ``spike_history`` (the spike detector's
    baseline), ``data_phases`` (the blend phases the run trains with, ``[[start,
    {name: weight}], ...]``, empty without weights: ``blend_phases.py``),
    ``data_index_samples`` (with phases: the sample count each dataset's train index was built
    for, by name, which a resume with other weights keeps while it suffices:
    ``dataprep.kept_indices``).
    ``stopped``: why this process stopped early (a signal, the wall clock), empty
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
    data_phases: list = field(default_factory=list)
    data_index_samples: dict[str, int] = field(default_factory=dict)
    stopped: str = ""

    _UNSAVED = ("stopped",)

    def state_dict(self) -> dict:
        """The JSON object a checkpoint's ``trainer_state.json`` holds."""
        return {f.name: _plain(getattr(self, f.name)) for f in dataclasses.fields(self)
                if f.name not in self._UNSAVED}

    @staticmethod
    def problems(state) -> list[str]:
        """Why ``state`` (a ``trainer_state.json``'s object) cannot be loaded, one line per
        field (empty: it can): counters that are not ints >= 0, skip ranges that are not
        ``[start, end]`` with ``0 <= start < end``, a loss scale or spike history that is
        not an object. Keys it lacks take their defaults; a negative ``consumed_samples``
        once trained at positions -100..-68."""
        if not isinstance(state, dict):
            return [f"holds {type(state).__name__}, not a JSON object"]
        problems = []
        for name in _COUNTERS:
            value = state.get(name, 0)
            if not (isinstance(value, int) and not isinstance(value, bool) and value >= 0):
                problems.append(f"{name} {value!r}: must be an int >= 0")
        problems += range_problems(state.get("skip_samples", []), "skip_samples")
        for name in ("loss_scale", "spike_history"):
            if not isinstance(state.get(name, {}), dict):
                problems.append(f"{name} {state[name]!r}: must be a JSON object")
        problems += _phase_problems(state.get("data_phases", []))
        problems += _index_size_problems(state.get("data_index_samples", {}))
        for key, value in state.get("loss_scale", {}).items() if not problems else ():
            if not _finite(value) or (key == "scale" and value <= 0):
                problems.append(f"loss_scale.{key} {value!r}: must be a finite number"
                                + (" > 0" if key == "scale" else ""))
        for key in ("losses", "grad_norms") if not problems else ():
            values = state.get("spike_history", {}).get(key, [])
            if not (isinstance(values, list) and all(map(_finite, values))):
                problems.append(f"spike_history.{key}: must be a list of finite numbers")
        # (the counters are not checked against each other: states set by hand, as tests
        # and tools do, hold steps without the samples they read or skipped steps beyond
        # the step; each one's type and range is what a run reads them by)
        return problems

    def load_state_dict(self, state: dict, where: str = "trainer_state.json") -> None:
        """Take a checkpoint's ``trainer_state.json`` (keys it lacks keep their defaults;
        unknown keys are ignored).

        Raises:
            UserError: A field of it is not what a save writes (``problems``); ``where``
                names the file in the one line.
        """
        problems = TrainState.problems(state)
        if problems:
            more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
            raise UserError(f"{where}: {problems[0]}{more}; the checkpoint's trainer state "
                            "is not one a run saved: resume from another checkpoint")
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


def _phase_problems(phases) -> list[str]:
    """Why ``phases`` is not a list of ``[start, {name: weight}]`` with starts increasing
    from 0 and finite weights >= 0 (empty when it is)."""
    shape = ("data_phases: must be a list of [start, {name: weight}] with starts increasing "
             "from 0")
    if not isinstance(phases, list):
        return [shape]
    previous = -1
    for phase in phases:
        if not (isinstance(phase, list) and len(phase) == 2 and _count(phase[0])
                and phase[0] > previous and (phase[0] == 0) == (previous == -1)
                and isinstance(phase[1], dict)
                and all(_finite(w) and w >= 0 for w in phase[1].values())):
            return [shape]
        previous = phase[0]
    return []


def _index_size_problems(sizes) -> list[str]:
    """Why ``sizes`` is not an object of sample counts >= 1 by dataset name (empty when it
    is)."""
    if not (isinstance(sizes, dict) and all(_count(n) and n >= 1 for n in sizes.values())):
        return ["data_index_samples: must be an object of sample counts >= 1 by dataset name"]
    return []


def _finite(value) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value))


def _plain(value):
    """JSON-ready copies (lists of lists, dicts) so that the saved state is not the live one."""
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value
