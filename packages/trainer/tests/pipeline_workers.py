"""Functions the pipeline tests run on every rank of ``run_distributed`` (and in one process
for the reference): they must live in an importable module, not in the test file."""

from __future__ import annotations

import torch
import torch.distributed.checkpoint as dcp
from equivalence import GBS, LR, MBS, SEQ, VOCAB, equivalence_config

from bloomline.trainer.loop import Trainer

__all__ = ["built_layout", "parameter_layout", "released_outputs", "resume_run",
           "traced_stage", "train_evaluate_inspect"]


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


def released_outputs(sections: dict, steps: int = 2) -> dict:
    """``steps`` training steps recording, on this rank's stages as they run, what happens to
    each forward's output: ``events``, the last step's forwards (F), backwards (B) and
    releases of a sent output (SENT, from the schedule's wait of its send), in order, each
    (kind, stage, micro-batch); ``at_backward``, for each backward of the last step, the
    stage's outputs then in ``fwd_cache`` as (micro-batch, bytes of their storage, whether the
    buffer the forward made is freed); ``planned``, the F/B/SENT actions
    ``PipelineStages.actions(..., sends=True)`` gives for the step; ``losses`` and
    ``grad_norms`` of each step."""
    from torch.multiprocessing.reductions import StorageWeakRef

    from bloomline.trainer.parallel.pipeline import _Stage

    trainer = Trainer(equivalence_config(**sections), log=lambda *_: None)
    events: list[tuple[str, int, int]] = []
    at_backward: list[list[tuple[int, int, bool]]] = []
    buffers: dict = {}  # (stage, micro-batch) -> weak reference to its output's first buffer
    forward, backward, release = (_Stage.forward_one_chunk, _Stage.backward_one_chunk,
                                  _Stage.release_sent)

    def record_forward(stage, chunk_id, *args, **kwargs):
        output = forward(stage, chunk_id, *args, **kwargs)
        events.append(("F", stage.stage_index, chunk_id))
        buffers[(stage.stage_index, chunk_id)] = StorageWeakRef(output.untyped_storage())
        return output

    def record_backward(stage, chunk_id, *args, **kwargs):
        events.append(("B", stage.stage_index, chunk_id))
        at_backward.append([
            (mb, outputs[0].untyped_storage().nbytes(),
             buffers[(stage.stage_index, mb)].expired())
            for mb, (outputs, _) in sorted(stage.fwd_cache.items())])
        return backward(stage, chunk_id, *args, **kwargs)

    def record_release(stage, chunk_id, ops):
        events.append(("SENT", stage.stage_index, chunk_id))
        return release(stage, chunk_id, ops)

    _Stage.forward_one_chunk, _Stage.backward_one_chunk = record_forward, record_backward
    _Stage.release_sent = record_release
    losses, norms = [], []
    try:
        for batch in _batches(steps):
            events.clear()
            at_backward.clear()
            result = trainer.train_step(_micro(trainer, batch), LR)
            losses.append(result["loss"])
            norms.append(result["grad_norm"])
    finally:
        _Stage.forward_one_chunk, _Stage.backward_one_chunk = forward, backward
        _Stage.release_sent = release
    runner = trainer.runner
    count = runner.microbatches or GBS // (MBS * trainer.layout.dp)
    planned = [tuple(a) for a in runner.stages.actions(count, (MBS, SEQ),
                                                       runner.micro_batch_loss, sends=True)
               if a.kind in ("F", "B", "SENT")]
    return {"events": events, "at_backward": at_backward, "planned": planned,
            "losses": losses, "grad_norms": norms}


def traced_stage(cfg, world_size: int, rank: int, release: bool):
    """``trace_step`` of ``rank`` (``cpu``), with the release of sent stage outputs switched
    off when not ``release`` (each output then kept until its backward, as the plan traced
    before it released them). Run in a process of its own, as ``trace_ranks`` runs each."""
    from bloomline.trainer.parallel import pipeline
    from bloomline.trainer.plan.traced_step import trace_step

    if not release:
        pipeline.release_output = lambda *args, **kwargs: False
    return trace_step(cfg, world_size, rank, "cpu")
