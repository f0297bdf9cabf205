"""``trainer plan`` and ``trainer pretrain`` build a rank with the same code (``build.build_run``
from ``run_spec.settle``): a rank built by the planner on meta tensors under a fake process
group holds what the trainer's rank holds in a real gloo run, and the planner replays the
compute actions the trainer's pipeline schedule runs."""

from __future__ import annotations

import pytest
from equivalence import GBS, MBS, SEQ, equivalence_config
from pipeline_workers import built_layout, parameter_layout

from bloomline.trainer.parallel.local_processes import run_distributed
from bloomline.trainer.plan.rank_build import built_rank

pytestmark = pytest.mark.slow

LAYOUTS = {
    "pp2_tp2_1f1b": (4, {"parallel": {"pipeline_parallel": 2, "tensor_parallel": 2}}),
    "dp2_zero2": (2, {"parallel": {"zero_stage": 2}}),
}


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_the_planner_builds_what_the_trainer_builds(name):
    """Bug: the planner building its own rank (a re-implemented ``Trainer.__init__``, a schedule
    of its own) and drifting from what ``pretrain`` runs: another stage split, parameters
    sharded another way (tp or ZeRO placements, shapes), a parameter the trainer does not
    keep, or pipeline actions in another order than torch's schedule runs them."""
    world, sections = LAYOUTS[name]
    real = run_distributed(world, built_layout, sections)
    count = GBS // (MBS * (world // _model_parallel(sections)))
    for rank in range(world):
        with built_rank(equivalence_config(**sections), world, rank, target="cpu") as built:
            planned = parameter_layout(built.model)
            actions = ([(a.kind, a.stage, a.micro_batch)
                        for a in built.runner.actions(count, (MBS, SEQ)) if a.kind in "FB"]
                       if built.spec.layout.pp > 1 else [])
        assert planned == real[rank]["parameters"], rank
        assert actions == real[rank]["actions"], rank


def _model_parallel(sections: dict) -> int:
    parallel = sections.get("parallel", {})
    return parallel.get("pipeline_parallel", 1) * parallel.get("tensor_parallel", 1)
