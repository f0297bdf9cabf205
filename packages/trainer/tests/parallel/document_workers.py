"""The run the document-masking layout tests compare (on every rank of ``run_distributed``,
and in one process for the reference): a module of its own so that the ranks can import it."""

from __future__ import annotations

import dataclasses

import torch
from equivalence import GBS, LR, MBS, SEQ, VOCAB, equivalence_config

from bloomline.trainer.loop import Trainer
from bloomline.trainer.parallel.mesh import world_info
from bloomline.trainer.run_spec import settle

__all__ = ["EOD", "document_batches", "document_run"]

EOD = VOCAB - 1
DOCUMENTS = {"reset_attention_mask": True, "eod_mask_loss": True}


def document_batches(steps: int, seed: int = 0) -> list[torch.Tensor]:
    """[GBS, SEQ + 1] batches with several documents per sample (about one token in five an
    EOD, and one at the first and at the last input position of sample 0)."""
    generator = torch.Generator().manual_seed(seed)
    batches = []
    for _ in range(steps):
        batch = torch.randint(0, VOCAB - 1, (GBS, SEQ + 1), generator=generator)
        batch[torch.rand(batch.shape, generator=generator) < 0.2] = EOD
        batch[0, 0] = batch[0, SEQ - 1] = EOD
        batches.append(batch)
    return batches


def document_run(sections: dict, steps: int = 3) -> dict:
    """``steps`` training steps and one with activation stats on packed batches with
    ``data.reset_attention_mask`` and ``data.eod_mask_loss`` on, then the valid loss of 6
    samples: losses, gradient norms, readings, the valid loss and the full parameters. The
    EOD id is given to the spec (the equivalence runs have no corpus or tokenizer)."""
    sections = {**sections, "data": {**sections.get("data", {}), **DOCUMENTS}}
    rank, _, world_size = world_info()
    spec = settle(equivalence_config(**sections), world_size, rank, check_tokenizer=False)
    trainer = Trainer(dataclasses.replace(spec, eod_id=EOD), log=lambda *_: None)
    dp, dp_rank = trainer.layout.dp, trainer.layout.dp_rank
    losses, norms, readings = [], [], None
    for step, batch in enumerate(document_batches(steps + 1)):
        micro = [batch[k * MBS * dp + dp_rank * MBS: k * MBS * dp + (dp_rank + 1) * MBS]
                 for k in range(GBS // (MBS * dp))]
        result = trainer.train_step(micro, LR, activation_stats=step == steps)
        losses.append(result["loss"])
        norms.append(result["grad_norm"])
        readings = result.get("activation_stats")
    valid = trainer.evaluate(list(document_batches(1, seed=1)[0][:6]), 6)["valid_loss"]
    return {"losses": losses, "grad_norms": norms, "activation_stats": readings,
            "valid_loss": valid, "params": trainer.full_model_state()}
