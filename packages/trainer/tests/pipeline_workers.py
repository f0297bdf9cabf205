"""Functions the pipeline tests run on every rank of ``run_distributed`` (and in one process
for the reference): they must live in an importable module, not in the test file."""

from __future__ import annotations

import torch
import torch.distributed.checkpoint as dcp
from equivalence import GBS, LR, MBS, SEQ, VOCAB, equivalence_config

from bloomline.trainer.loop import Trainer

__all__ = ["built_layout", "parameter_layout", "resume_run", "train_evaluate_inspect"]


def _batches(steps: int, seed: int = 0) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(0, VOCAB, (GBS, SEQ + 1), generator=generator) for _ in range(steps)]


def _micro(trainer, batch) -> list[torch.Tensor]:
    dp, rank = trainer.layout.dp, trainer.layout.dp_rank
    return [batch[k * MBS * dp + rank * MBS: k * MBS * dp + (rank + 1) * MBS]
            for k in range(GBS // (MBS * dp))]


def train_evaluate_inspect(sections: dict) -> dict:
    """Two steps (activation stats on the second), an evaluation over 7 samples (not a multiple
    of the micro-batch), and this rank's copy of the tied weight."""
    trainer = Trainer(equivalence_config(**sections), log=lambda *_: None)
    readings = None
    for step, batch in enumerate(_batches(2)):
        readings = trainer.train_step(_micro(trainer, batch), LR, activation_stats=step == 1)
    samples = list(_batches(1, seed=1)[0][:7])
    valid = trainer.evaluate(samples, 7)
    embedding = getattr(trainer.model, "word_embeddings", None)
    return {"valid": valid["valid_loss"], "activation_stats": readings["activation_stats"],
            "tied": None if embedding is None else embedding.weight.detach().clone()}


def resume_run(sections: dict, run_dir: str) -> dict:
    """2 steps, save, a new trainer resumes from the checkpoint, 3 more steps."""
    batches = _batches(5)
    first = Trainer(equivalence_config(run_dir, **sections), log=lambda *_: None)
    for batch in batches[:2]:
        first.train_step(_micro(first, batch), LR)
    first.state.step = 2
    path = first.save()
    second = Trainer(equivalence_config(run_dir, **sections), log=lambda *_: None)
    assert second.resume() == path
    losses = [second.train_step(_micro(second, batch), LR)["loss"] for batch in batches[2:]]
    keys = set(dcp.FileSystemReader(str(path)).read_metadata().state_dict_metadata)
    return {"losses": losses, "params": second.full_model_state(), "keys": keys}


def built_layout(sections: dict) -> dict:
    """This rank as ``Trainer`` builds it: each parameter's local shape and placements, and
    the compute actions its pipeline schedule runs in one training step, in order (recorded
    from torch's stages as they run)."""
    from bloomline.trainer.parallel.pipeline import _Stage

    trainer = Trainer(equivalence_config(**sections), log=lambda *_: None)
    ran: list[tuple[str, int, int]] = []
    forward, backward = _Stage.forward_one_chunk, _Stage.backward_one_chunk

    def record_forward(stage, chunk_id, *args, **kwargs):
        ran.append(("F", stage.stage_index, chunk_id))
        return forward(stage, chunk_id, *args, **kwargs)

    def record_backward(stage, chunk_id, *args, **kwargs):
        ran.append(("B", stage.stage_index, chunk_id))
        return backward(stage, chunk_id, *args, **kwargs)

    _Stage.forward_one_chunk, _Stage.backward_one_chunk = record_forward, record_backward
    try:
        trainer.train_step(_micro(trainer, _batches(1)[0]), LR)
    finally:
        _Stage.forward_one_chunk, _Stage.backward_one_chunk = forward, backward
    return {"parameters": parameter_layout(trainer.model), "actions": ran}


def parameter_layout(model) -> dict:
    """{name: (local shape, placements)} of a model's parameters (placements "" when plain)."""
    out = {}
    for name, param in model.named_parameters():
        local = param.to_local() if hasattr(param, "to_local") else param
        out[name] = (tuple(local.shape), str(getattr(param, "placements", "")))
    return out
