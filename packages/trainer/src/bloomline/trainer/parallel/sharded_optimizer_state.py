"""An optimizer seen under the model's parameters while it steps other tensors: the shared
shell of ZeRO-1's ``ShardedOptimizer`` (FSDP2 engine, ``data_parallel.py``) and the
``DistributedOptimizer`` (buffers engine, ``distributed_optimizer.py``).

Both step an inner optimizer over per-rank pieces of the parameters (DTensors sharded over
dp), yet the trainer sets ``lr`` on ``param_groups`` and DCP's state-dict code maps the
optimizer's entries to names through them: so ``param_groups`` hold the model's parameters,
``state`` shows the inner state under them, and ``state_dict`` / ``load_state_dict`` are the
inner optimizer's, numbered in the same order (the inner groups are built one to one).
"""

from __future__ import annotations

import torch

__all__ = ["ModelParameterView", "dp_rows_placement"]


def dp_rows_placement(split: int):
    """The dp axis's placement of a parameter whose rows dp splits (``torch.chunk``'s way)
    after other axes split dim 0 into ``split`` pieces (tp's column-parallel weights):
    ``_StridedShard`` then, FSDP2's layout for tp + dp, else ``Shard(0)``."""
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.placement_types import _StridedShard

    return _StridedShard(0, split_factor=split) if split > 1 else Shard(0)


class ModelParameterView(torch.optim.Optimizer):
    """``inner`` stepping ``pieces`` (model parameter -> the tensor ``inner`` steps for it),
    whose groups correspond one to one, in order, to ``groups`` (over model parameters)."""

    def __init__(self, inner: torch.optim.Optimizer, groups: list[dict],
                 pieces: dict[torch.Tensor, torch.Tensor]) -> None:
        self.inner = inner
        self._stepped = pieces
        super().__init__(groups, inner.defaults)

    @property
    def state(self):
        """The inner state under the model's parameters (read by DCP's state-dict code)."""
        return {param: self.inner.state[piece] for param, piece in self._stepped.items()
                if piece in self.inner.state}

    @state.setter
    def state(self, value) -> None:  # Optimizer.__init__ assigns an empty one; ours is derived
        pass

    def _push_hyperparameters(self) -> None:
        for outer, inner in zip(self.param_groups, self.inner.param_groups, strict=True):
            inner.update({k: v for k, v in outer.items() if k != "params"})

    def state_dict(self) -> dict:
        """The inner optimizer's: entries numbered in the order of ``param_groups`` (the
        model's parameters), values dp-sharded DTensors."""
        self._push_hyperparameters()
        return self.inner.state_dict()

    def load_state_dict(self, state_dict: dict) -> None:
        self.inner.load_state_dict(state_dict)
        for outer, inner in zip(self.param_groups, self.inner.param_groups, strict=True):
            outer.update({k: v for k, v in inner.items() if k != "params"})
