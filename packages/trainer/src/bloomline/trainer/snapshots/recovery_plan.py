"""Which snapshot a restarted job goes on from, and where each rank's shard comes from: a
pure function of what every node holds, so that every rank, given the same reports,
computes the same plan without another round of messages.

The rules:

- only the newest timeline counts (a timeline is the run between rollbacks: a snapshot from
  before a rollback is of a discarded history);
- the step is the newest at which *every* shard has a copy somewhere (its own node's, or its
  peer's); a newer step that misses a shard is useless (the ranks must all restart from the
  same step);
- a snapshot older than the newest persistent checkpoint is not used: the checkpoint is
  newer (and is the fallback anyway);
- each rank reads its shard from its own node when the node holds it; otherwise the first
  rank of a node that holds it sends it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["RecoveryPlan", "plan_recovery"]


@dataclass
class RecoveryPlan:
    """The snapshot to restore (``timeline``, ``step``) and, per shard (= the rank that
    restores it), the rank that reads it: itself (its node holds it) or a sender."""

    timeline: int
    step: int
    senders: dict[int, int] = field(default_factory=dict)

    def local(self, shard: int) -> bool:
        return self.senders[shard] == shard

    @property
    def transfers(self) -> list[tuple[int, int]]:
        """(sender, shard) of every shard that travels, in shard order."""
        return [(sender, shard) for shard, sender in sorted(self.senders.items())
                if sender != shard]


def plan_recovery(hosts: list[str], held: list[list[tuple[int, int, int]]],
                  newest_checkpoint: int | None) -> tuple[RecoveryPlan | None, str]:
    """The plan, or None and why not.

    Args:
        hosts: Each rank's node (ranks with the same node see the same files).
        held: Each rank's complete snapshots as (timeline, step, shard) (its node's files;
            ranks of one node report the same).
        newest_checkpoint: The step of the run's newest persistent checkpoint (None: none).
    """
    world = len(hosts)
    where: dict[tuple[int, int, int], set[int]] = {}  # (timeline, step, shard) -> ranks
    for rank, items in enumerate(held):
        for timeline, step, shard in items:
            if 0 <= shard < world:
                where.setdefault((timeline, step, shard), set()).add(rank)
    if not where:
        return None, "no snapshot survived"
    timeline = max(t for t, _, _ in where)
    steps = sorted({s for t, s, _ in where if t == timeline}, reverse=True)
    complete = [s for s in steps if all((timeline, s, shard) in where for shard in range(world))]
    if not complete:
        newest = steps[0]
        missing = [shard for shard in range(world) if (timeline, newest, shard) not in where]
        return None, (f"no step has a copy of every rank's snapshot (step {newest} lacks "
                      f"rank{'s' if len(missing) > 1 else ''} "
                      f"{', '.join(map(str, missing))}: both nodes that held "
                      f"{'them' if len(missing) > 1 else 'it'} were lost)")
    step = complete[0]
    if newest_checkpoint is not None and step < newest_checkpoint:
        return None, (f"the newest complete snapshot (step {step}) is older than the newest "
                      f"checkpoint (step {newest_checkpoint})")
    plan = RecoveryPlan(timeline, step)
    for shard in range(world):
        holders = where[(timeline, step, shard)]
        node_holds = any(hosts[rank] == hosts[shard] for rank in holders)
        plan.senders[shard] = shard if node_holds else min(holders)
    return plan, ""
