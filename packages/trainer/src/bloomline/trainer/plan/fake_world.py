"""A pretend torch.distributed world of any size in this one process.

``fake_world(world_size, rank)`` initializes the default process group with torch's ``fake``
backend (``torch.testing._internal.distributed.fake_pg``): every collective returns at once
without touching its data, so code that builds meshes, sub-groups, DTensors and FSDP2 wrappers
runs for rank ``rank`` of ``world_size`` with no peer. It is only good for *building*: values
that cross a collective are garbage, which the planner never reads (its tensors are meta).
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator

import torch.distributed as dist

__all__ = ["fake_world"]

# what torchrun would set: world_info() and init_distributed() read them
_ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE")


@contextlib.contextmanager
def fake_world(world_size: int, rank: int = 0, local_world_size: int = 8) -> Iterator[None]:
    """Inside: torch.distributed initialized as rank ``rank`` of ``world_size`` on the fake
    backend, and torchrun's RANK / LOCAL_RANK / WORLD_SIZE set to match (LOCAL_RANK as on
    nodes of ``local_world_size``). On exit the process group is destroyed and the environment
    restored, also when the body raises. Refuses to nest inside a live process group (it
    would replace the caller's)."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is outside a world of {world_size}")
    if dist.is_initialized():
        raise RuntimeError("fake_world: torch.distributed is already initialized")
    # importing the module registers the "fake" backend with torch.distributed
    from torch.testing._internal.distributed.fake_pg import FakeStore

    _forget_meshes()
    saved = {name: os.environ.get(name) for name in _ENV}
    # init_process_group prefixes "[rankN]:" to every later traceback through sys.excepthook;
    # put the caller's hook back so a planned rank leaves no trace on the process
    hook = sys.excepthook
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank % local_world_size),
                      WORLD_SIZE=str(world_size))
    try:
        dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world_size)
        yield
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
        _forget_meshes()
        sys.excepthook = hook
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _forget_meshes() -> None:
    """Drop DTensor's cached sharding and redistribution plans. They are keyed by device
    mesh, and meshes compare equal by shape and ranks, not by process group: a later world
    would be handed the earlier world's mesh, whose groups are gone."""
    from torch.distributed.tensor import DTensor, _redistribute
    from torch.distributed.tensor._collective_utils import MeshTopoInfo

    propagator = DTensor._op_dispatcher.sharding_propagator
    propagator.propagate_op_sharding.cache_clear()
    propagator._propagate_tensor_meta_cached.cache_clear()
    _redistribute._gen_transform_infos.cache_clear()  # its plans name the mesh to use
    _redistribute.clear_redistribute_planner_cache()
    MeshTopoInfo.build_from_mesh.cache_clear()
