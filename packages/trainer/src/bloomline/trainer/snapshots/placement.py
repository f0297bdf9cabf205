"""Which rank keeps a copy of which rank's snapshot, and which node a rank is on.

torchrun numbers ranks node by node (``LOCAL_WORLD_SIZE`` per node), so rank ``r`` is on node
``r // per_node``. Each rank's snapshot is kept by itself, in its node's memory, and by its
*peer* ``(r + per_node) % world``: the same local rank on the next node. That peer is on
another node whenever there are two or more, so losing any one node loses no shard (each
shard's two copies are on two nodes); losing a node and the next one loses the shards of the
first. On one node there is no peer to pick (every copy would die with the machine): the
rank's own copy, which outlives the rank's process, is all there is.

``per_node`` can be set below the real one (``checkpoint.snapshot_ranks_per_node``) so that
one machine's processes act as several nodes: tests use it to lose a "node" (its folder of
snapshots) without a second machine.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from bloomline.common.errors import UserError

__all__ = ["Placement"]


@dataclass(frozen=True)
class Placement:
    """Ranks, nodes and peers of one run: ``rank`` of ``world_size``, ``per_node`` ranks on
    each node."""

    rank: int
    world_size: int
    per_node: int

    @classmethod
    def of_run(cls, rank: int, world_size: int, ranks_per_node: int = 0) -> Placement:
        """This process's placement: ``ranks_per_node`` (the setting; 0: torchrun's
        ``LOCAL_WORLD_SIZE``, else the whole world on one node).

        Raises:
            UserError: ``ranks_per_node`` does not divide the world.
        """
        per_node = ranks_per_node or int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
        if per_node <= 0 or world_size % per_node:
            raise UserError(f"checkpoint.snapshot_ranks_per_node {ranks_per_node}: "
                            f"{per_node} ranks per node do not divide the {world_size} ranks")
        return cls(rank, world_size, per_node)

    @property
    def nodes(self) -> int:
        return self.world_size // self.per_node

    def node_of(self, rank: int) -> int:
        return rank // self.per_node

    @property
    def node(self) -> int:
        return self.node_of(self.rank)

    def peer_of(self, rank: int) -> int | None:
        """The rank that keeps a copy of ``rank``'s snapshot (None: one node, no peer)."""
        return (rank + self.per_node) % self.world_size if self.nodes > 1 else None

    def source_of(self, rank: int) -> int | None:
        """The rank whose snapshot ``rank`` keeps a copy of (the inverse of ``peer_of``)."""
        return (rank - self.per_node) % self.world_size if self.nodes > 1 else None
