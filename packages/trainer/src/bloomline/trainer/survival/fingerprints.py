"""Parameter fingerprints across data-parallel replicas: every ``monitor.fingerprint_interval``
steps each rank digests (``bit_digest.py``) the parameters that every data-parallel replica
must hold bitwise alike, and the ranks compare the digests; a replica that differs has been
corrupted silently (a flipped bit in memory, a faulty copy or gather).

What is compared: the ranks of the same pipeline stage and tensor-parallel coordinate (the
same shard of the same layers) across data parallelism, each with its local tensors. Only
layouts whose replicas hold the parameters alike between steps have anything to compare
(``parallel.zero_engine.replicates_parameters``): DDP and ZeRO-1 on FSDP2 (the whole fp32
parameter on each replica), and the buffers engine's bf16 compute copies (gathered anew from
the dp-sharded fp32 masters at each optimizer step: the fingerprint sees a copy corrupted
since the last step, or a faulty gather; a corrupted master spreads to every replica, where no
comparison can see it). Under ZeRO-2/3 on FSDP2 every rank holds a different shard: nothing.

Who is named: within a group of replicas, the ranks outside a strict majority of equal
digests; with two replicas (or no majority) every rank of the group, saying that the
comparison cannot tell which one is wrong.

Cost: one pass over this rank's parameters (an integer sum) and one all-gather of three
integers per rank; on a mismatch also each tensor's digest and the host names.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import torch
import torch.distributed as dist

from bloomline.trainer.survival.bit_digest import bits_sum, digest_of
from bloomline.trainer.survival.suspect_hosts import gather_from_ranks, host_name

__all__ = ["Mismatch", "ReplicaFingerprints", "odd_replicas"]


def odd_replicas(digests: dict[int, int]) -> tuple[list[int], bool]:
    """The ranks of one group of replicas (``rank -> digest``) whose digest differs: those
    outside a strict majority (``majority`` True), or every rank when there is none. No rank
    when all agree."""
    counts = Counter(digests.values())
    if len(counts) <= 1:
        return [], True
    value, count = counts.most_common(1)[0]
    if count * 2 > len(digests):
        return sorted(rank for rank, digest in digests.items() if digest != value), True
    return sorted(digests), False


@dataclass
class Mismatch:
    """A group of replicas (``pp``, ``tp``) whose digests differ: ``ranks`` named (all of
    the group without a ``majority``), ``replicas`` how many compared, ``tensor`` the first
    parameter whose digests differ."""

    pp: int
    tp: int
    ranks: list[int]
    majority: bool
    replicas: int
    tensor: str = ""


class ReplicaFingerprints:
    """The fingerprint of ``named`` (``(name, tensor)`` pairs every dp replica holds alike;
    None: the layout has none) of this rank at ``(pp_rank, tp_rank)``."""

    def __init__(self, named: list[tuple[str, torch.Tensor]] | None, pp_rank: int,
                 tp_rank: int, device: torch.device) -> None:
        self.named, self.device = named, device
        self.coordinate = (pp_rank, tp_rank)

    @property
    def enabled(self) -> bool:
        return bool(self.named) and dist.is_initialized() and dist.get_world_size() > 1

    def tensors(self) -> list[torch.Tensor]:
        return [tensor for _, tensor in self.named or ()]

    def compare(self) -> tuple[list[Mismatch], list[str]]:
        """Collective (every rank, the same step): the groups of replicas that differ, and
        every rank's host (empty when none differ)."""
        with torch.no_grad():
            mine = torch.tensor([*self.coordinate, 0], dtype=torch.int64, device=self.device)
            mine[2] = digest_of(self.tensors()).to(self.device)
            everyone = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
            dist.all_gather(everyone, mine)
        groups: dict[tuple[int, int], dict[int, int]] = {}
        for rank, row in enumerate(everyone):
            pp, tp, digest = row.tolist()
            groups.setdefault((pp, tp), {})[rank] = digest
        mismatches = []
        for (pp, tp), digests in sorted(groups.items()):
            ranks, majority = odd_replicas(digests)
            if ranks:
                mismatches.append(Mismatch(pp, tp, ranks, majority, len(digests)))
        if not mismatches:
            return [], []
        # rare: which tensor, and where the ranks run (every rank takes this branch)
        per_tensor = {name: int(bits_sum(tensor)) for name, tensor in self.named}
        gathered = gather_from_ranks((self.coordinate, per_tensor, host_name()))
        for mismatch in mismatches:
            members = [row[1] for row in gathered if row[0] == (mismatch.pp, mismatch.tp)]
            for name in members[0]:  # a group's replicas hold the same names, in one order
                if len({digests.get(name) for digests in members}) > 1:
                    mismatch.tensor = name
                    break
        return mismatches, [row[2] for row in gathered]
