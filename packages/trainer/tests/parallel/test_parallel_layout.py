"""The mesh layout: validation errors name the fields; rank coordinates follow Megatron's
order (tp fastest, then dp, then pp); dp ranks read disjoint slices of each global batch."""

from __future__ import annotations

import pytest

from bloomline.common.errors import UserError
from bloomline.trainer.config import Config
from bloomline.trainer.config_rules import resolve_layout
from bloomline.trainer.data import MegatronSampler


def _cfg(**parallel) -> Config:
    cfg = Config()
    cfg.model.vocab_size, cfg.model.hidden_size = 256, 64
    cfg.model.num_layers, cfg.model.num_heads = 4, 4
    cfg.train.micro_batch_size, cfg.train.global_batch_size = 2, 8
    for key, value in parallel.items():
        setattr(cfg.parallel, key, value)
    return cfg


def test_rank_coordinates_put_tp_fastest_then_dp_then_pp():
    """Bug: a transposed mesh puts tensor-parallel partners on different nodes."""
    coords = [resolve_layout(_cfg(tensor_parallel=2, pipeline_parallel=2), 8, rank).coords
              for rank in range(8)]
    assert coords == [(0, 0, 0), (0, 0, 1), (0, 1, 0), (0, 1, 1),
                      (1, 0, 0), (1, 0, 1), (1, 1, 0), (1, 1, 1)]
    assert resolve_layout(_cfg(tensor_parallel=2), 8).dp == 4


@pytest.mark.parametrize("parallel, world, message", [
    ({"tensor_parallel": 3}, 3, "model.num_heads 4 is not divisible by parallel.tensor_parallel 3"),
    ({"tensor_parallel": 2}, 3, "world size 3 is not divisible"),
    ({"data_parallel": 3}, 4, "pp 1 x dp 3 x tp 1 = 3 processes, but the world size is 4"),
    ({"pipeline_parallel": 8}, 8, "model.num_layers 4 is fewer than the 8 pipeline stages"),
    ({"pipeline_parallel": 2, "pipeline_schedule": "interleaved", "virtual_stages": 4}, 2,
     "fewer than the 8 pipeline stages"),
    ({}, 3, "train.global_batch_size 8 is not a multiple of train.micro_batch_size 2 x "
            "data-parallel size 3"),
    ({"sequence_parallel": True}, 2, "sequence_parallel needs parallel.tensor_parallel > 1"),
    ({"offload": True, "zero_stage": 2}, 2, "offload needs parallel.zero_stage = 3"),
])
def test_bad_layouts_name_the_field(parallel, world, message):
    """Bug: a layout that cannot work starts anyway and fails deep inside a collective."""
    with pytest.raises(UserError, match=message.replace("(", r"\(").replace(")", r"\)")):
        resolve_layout(_cfg(**parallel), world)


def test_data_parallel_ranks_split_each_global_batch_like_megatron():
    """Bug: dp ranks read overlapping samples, or a different set than one process would."""
    single = [i for batch in MegatronSampler(40, 8, 2) for i in batch]
    ranks = [list(MegatronSampler(40, 8, 2, dp_rank=r, dp_size=2)) for r in range(2)]
    merged = [i for pair in zip(*ranks, strict=True) for batch in pair for i in batch]
    assert merged == single  # rank 0 takes the first micro-batch of each block of 2 x mbs
    assert set(map(tuple, ranks[0])).isdisjoint(map(tuple, ranks[1]))
