"""The run's blend phases: ``data.weights`` from sample 0, ``data.phases`` from their starts,
and what a resume with other weights makes of them.

The phase list ``[[start, {name: weight}], ...]`` is what the train index is built from
(dataprep's ``blend_phases``: one blend index holds every phase, so the sampler walks them
without a relaunch) and what every checkpoint records (``TrainState.data_phases``).

On resume at ``consumed`` samples the past is the checkpoint's list and the future the
config's: the phases of the checkpoint that start before ``consumed``, then the config's
phase in force at ``consumed`` (starting there) and its later ones. Where the config says
what the checkpoint's list already says from ``consumed`` on, the list is kept as it is, so a
resume without a change reproduces it; changed weights become a new phase at ``consumed``.
Positions before a phase start do not depend on later phases, so the samples already trained
stay the same and each dataset goes on with its own order: its index keeps the sample count
the checkpoint recorded (``TrainState.data_index_samples``) while that holds what the new
phases draw from it (``dataprep.kept_indices``); one they need more of is built anew, and
reshuffled, with a warning (``reordered_datasets``).
"""

from __future__ import annotations

from bloomline.common.errors import SettingError, UserError
from bloomline.dataprep.blend_phases import BlendPhase
from bloomline.dataprep.blending import blended_datasets
from bloomline.trainer.config import DataConfig

__all__ = ["configured_phases", "phase_requests", "phases_begun", "reordered_datasets",
           "resume_phases"]

Phases = list[list]  # [[start, {name: weight}], ...], the first start 0


def configured_phases(data: DataConfig, train_samples: int) -> Phases:
    """The config's phase list (empty without ``data.weights``).

    Raises:
        UserError: ``data.phases`` without ``data.weights``, or a key that is not a sample
            count within the run; one line naming ``data.phases.KEY``.
    """
    if data.phases and not data.weights:
        raise UserError("data.phases: phases change the blend weights; give the first "
                        "phase's as data.weights too")
    if not data.weights:
        return []
    phases = [[0, dict(data.weights)]]
    starts = {}
    for key, weights in data.phases.items():
        try:
            start = int(key.replace("_", ""))
        except ValueError:
            raise UserError(f"data.phases.{key}: a phase is keyed by the train sample it "
                            "starts at, e.g. data.phases.5000 = {code = 0.1, web = 0.9}"
                            ) from None
        if not 0 < start < train_samples:
            raise UserError(f"data.phases.{key}: the start must be above 0 and below "
                            f"train.train_samples ({train_samples})")
        if start in starts:
            raise UserError(f"data.phases.{key}: the same start as data.phases.{starts[start]}")
        try:  # the blend's rule, said of this phase
            blended_datasets(weights)
        except SettingError as err:
            raise UserError(f"data.phases.{key}: {str(err).split(': ', 1)[-1]}") from None
        starts[start] = key
    for start in sorted(starts):
        phases.append([start, dict(data.phases[starts[start]])])
    return phases


def resume_phases(recorded: Phases, configured: Phases, consumed: int
                  ) -> tuple[Phases, str | None]:
    """The run's phase list on resume at ``consumed`` samples (see the module docstring), and
    a line saying what changed (None: nothing did).

    Raises:
        UserError: the checkpoint's run blends by weights and the config gives none.
    """
    if not recorded or consumed == 0:
        return configured, None
    if not configured:
        raise UserError(f"data.weights: empty, but the run resumed (at sample {consumed:,}) "
                        f"blends by weights ({_describe(recorded[-1][1])}); give its weights")
    past = [phase for phase in recorded if phase[0] < consumed]
    now = [phase for phase in configured if phase[0] <= consumed][-1][1]
    future = [phase for phase in configured if phase[0] > consumed]
    if past[-1][1] == now:  # the phase in force goes on
        phases = past + future
    else:
        phases = [*past, [consumed, dict(now)], *future]
    if _same(phases, recorded):
        return recorded, None
    note = (f"data: resumed at sample {consumed:,} with other blend weights than the "
            f"checkpoint's; blend phases now {describe_phases(phases)} (the samples before "
            f"{consumed:,} unchanged)")
    return phases, note


def phase_requests(phases: Phases) -> tuple[dict[str, float] | None, tuple[BlendPhase, ...]]:
    """``(weights, phases)`` of dataprep's ``IndexRequest``: the first phase's weights, the
    later phases."""
    if not phases:
        return None, ()
    return dict(phases[0][1]), tuple(BlendPhase(int(start), dict(weights))
                                     for start, weights in phases[1:])


def phases_begun(phases: Phases, before: int, after: int) -> list[str]:
    """A line for each phase (after the first) whose start a step that trained positions
    ``[before, after)`` reached."""
    return [f"blend phase {number} begins at sample {start:,}: {_describe(weights)}"
            for number, (start, weights) in enumerate(phases)
            if number and before <= start < after]


def describe_phases(phases: Phases) -> str:
    """``0: code=0.3 docs=0.7; 5,000: code=0.1 docs=0.9``."""
    return "; ".join(f"{start:,}: {_describe(weights)}" for start, weights in phases)


def _describe(weights: dict) -> str:
    return " ".join(f"{name}={weight:g}" for name, weight in weights.items())


def _same(a: Phases, b: Phases) -> bool:
    return [[int(s), dict(w)] for s, w in a] == [[int(s), dict(w)] for s, w in b]


def reordered_datasets(before, after, consumed: int) -> list[str]:
    """A warning line for each dataset whose train sample order differs between the index
    of the checkpoint's phases (``before``) and of the new ones (``after``). A resume keeps
    each dataset's index while it holds what the new phases draw (``dataprep.kept_indices``),
    so this is a dataset they need more of: its index is built anew, and megatron-core's
    order of a dataset is a function of its number of epochs (it shuffles the documents of
    all epochs together), so another number of them reshuffles it from its first sample.
    Both are a train split's samples (a blend: ``.names``, ``.datasets`` with their
    ``.index``)."""
    if not hasattr(before, "names") or not hasattr(after, "names"):
        return []
    old = dict(zip(before.names, before.datasets, strict=True))
    lines = []
    for name, component in zip(after.names, after.datasets, strict=True):
        index, previous = component.index, old.get(name)
        if previous is None or (index.num_epochs, index.separate_last_epoch) == (
                previous.index.num_epochs, previous.index.separate_last_epoch):
            continue
        lines.append(f"warning: data: the new blend phases draw more of {name!r} than its "
                     f"index holds ({len(previous):,} samples, {previous.index.num_epochs} "
                     f"epoch(s)); built anew for {index.num_epochs} epoch(s), its sample "
                     f"order is reshuffled, so after sample {consumed:,} some of its samples "
                     "may come again and others never (keep its total draw within what its "
                     "index holds to keep its order)")
    return lines
