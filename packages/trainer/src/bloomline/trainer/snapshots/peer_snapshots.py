"""``PeerSnapshots``: every ``checkpoint.snapshot_interval`` steps, each rank's training state
copied into host memory on its own node and on its peer's (``placement.py``), so that a job
restarted after a rank's or a node's death goes on from a step a few seconds old, without
reading the shared filesystem.

A round, step S:

1. the training thread waits for the previous round, then copies its state's tensors
   (``local_state.flat_state``) into one staging buffer (pinned host memory on a GPU, the
   copies queued on the current stream) and hands the round to a background thread: the
   stall is this copy;
2. the background thread checksums the buffer, writes the rank's own file
   (``store.py``), sends the bytes to its peer while receiving its source's (gloo, on a
   process group of its own: the training thread owns the default group), writes that
   replica, then meets every rank at a barrier and only then deletes the round before: when
   any rank has deleted round S - I, every rank has finished round S, so the newest round
   every rank finished always exists in full.

A restart (``recover``): every rank reports the files its node holds, all compute the same
plan (``recovery_plan.py``), the shards a node lost travel from the nodes that kept a copy,
and each rank restores its own (``local_state.restore_state``). Only restarts of one launch
use snapshots: a first start (``TORCHELASTIC_RESTART_COUNT`` 0) deletes what an earlier job
left and resumes from checkpoints as before.

Snapshots are taken only where a restart can use them (torchrun with ``--max-restarts`` > 0);
persistent checkpoints are unchanged by all this.
"""

from __future__ import annotations

import os
import shutil
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from bloomline.common.errors import UserError
from bloomline.common.machine import available_memory, format_bytes, free_disk
from bloomline.trainer.checkpoint.rng_state import rng_state
from bloomline.trainer.parallel.peer_failure import peer_failure
from bloomline.trainer.snapshots.local_state import flat_state
from bloomline.trainer.snapshots.placement import Placement
from bloomline.trainer.snapshots.recovery_plan import RecoveryPlan, plan_recovery
from bloomline.trainer.snapshots.shard_file import (
    ShardHeader,
    crc32,
    decode_header,
    encode_header,
    plan_slots,
    tensor_views,
)
from bloomline.trainer.snapshots.store import HostStore
from bloomline.trainer.survival import faults

__all__ = ["PeerSnapshots", "Recovered"]

# host memory a snapshot round may take, as a share of what is available when the first is
# taken: the rest is the data loader's, the checkpoint staging's, the system's
_MEMORY_SHARE = 0.5
# seconds a failed run waits for a round in flight (torchrun SIGKILLs 30 s after its SIGTERM)
_FAILED_RUN_WAIT = 10.0


@dataclass
class Recovered:
    """A restored rank's snapshot: its header (trainer state, RNG, values), its tensors (by
    ``flat_state`` name), where it came from and how long the recovery took."""

    header: ShardHeader
    tensors: dict[str, torch.Tensor]
    path: Path
    from_peers: int
    seconds: float


def _restarts_allowed() -> int:
    return int(os.environ.get("TORCHELASTIC_MAX_RESTARTS", "0") or 0)


def _attempt() -> int:
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)


class PeerSnapshots:
    """One rank's in-memory snapshots and their recovery. Every rank makes one (the
    constructor creates a process group when snapshots are on: collective) and calls
    ``take``, ``recover``, ``discard`` and ``close`` at the same points."""

    def __init__(self, cfg, run_dir: Path, model, optimizer, rank: int, world_size: int,
                 layout: str, log) -> None:
        c = cfg.checkpoint
        self.interval, self.model, self.optimizer, self.log = c.snapshot_interval, model, \
            optimizer, log
        self.wait_mode, self._said_slow = c.snapshot_wait, False
        self.layout, self.rank = layout, rank
        # only a restart of this launch can use a snapshot: without restarts, none is taken
        self.enabled = self.interval > 0 and _restarts_allowed() > 0
        self.placement = Placement.of_run(rank, world_size, c.snapshot_ranks_per_node)
        host = socket.gethostname()
        if c.snapshot_ranks_per_node:  # simulated nodes: one folder each
            host = f"{host}-node{self.placement.node}"
        self.host = host
        self.store = HostStore(c.snapshot_dir, run_dir,
                               os.environ.get("TORCHELASTIC_RUN_ID", "local"), host)
        self._group = None
        if self.enabled and world_size > 1:
            self._group = dist.new_group(backend="gloo")
        self._staging: torch.Tensor | None = None
        self._slots = None
        self._round: threading.Thread | None = None
        self._failure: BaseException | None = None
        self.last_round_seconds = 0.0
        self.last_round_parts: dict[str, float] = {}

    # -- rounds -------------------------------------------------------------------------------
    def due(self, step: int) -> bool:
        return self.enabled and step % self.interval == 0

    def take(self, step: int, trainer_state: dict, timeline: int) -> None:
        """Snapshot the state after ``step`` (``trainer_state``: what a checkpoint's
        ``trainer_state.json`` would hold): copy it to the staging buffer here (the training
        thread's stall), the rest in the background. Raises the previous round's failure, if
        it failed."""
        self.wait()
        tensors, values, _ = flat_state(self.model, self.optimizer)
        if self._staging is None and not self._allocate(tensors):
            return
        views = tensor_views(self._staging, self._slots)
        cuda = any(t.is_cuda for t in tensors.values())
        with torch.no_grad():
            for name, tensor in tensors.items():
                views[name].copy_(tensor, non_blocking=cuda)
        copied = None
        if cuda:
            copied = torch.cuda.Event()
            copied.record()
        header = ShardHeader(self.rank, step, timeline, self.placement.world_size, self.layout,
                             time.time(), self._staging.numel(), 0, self._slots, values,
                             trainer_state, rng_state())
        self._round = threading.Thread(target=self._run_round, args=(header, copied),
                                       name="bloomline-snapshot", daemon=True)
        self._round.start()

    @property
    def in_flight(self) -> bool:
        return self._round is not None

    def settles_next_step(self, step_seconds: float) -> bool:
        """Whether the round in flight is waited for after the step that follows it
        (``checkpoint.snapshot_wait``): ``step`` always (a failure loses at most
        ``snapshot_interval`` steps; the step after a round waits for what of it outlasts
        the step), ``round`` never (the next round waits for it: no stall while a round
        takes less than ``snapshot_interval`` steps, up to ``2 x interval - 1`` steps lost),
        ``auto`` as ``step`` while the last round took less than a step (``step_seconds``,
        the median), else as ``round``, said once in a line."""
        if self.wait_mode != "auto":
            return self.wait_mode == "step"
        if self.last_round_seconds <= step_seconds or not step_seconds:
            return True
        if not self._said_slow:
            self._said_slow = True
            self.log(f"peer snapshots: a round takes {self.last_round_seconds:.2f} s, longer "
                     f"than a step ({step_seconds:.2f} s): the run waits for it before the "
                     "next round instead of after the next step (no stall; a failure during "
                     f"a round loses up to {2 * self.interval - 1} steps instead of "
                     f"{self.interval}); checkpoint.snapshot_wait = \"step\" keeps the "
                     "bound at the stall's cost")
        return False

    def wait(self) -> None:
        """Block until the round in flight is done; raise its failure as one line."""
        if self._round is not None:
            self._round.join()
            self._round = None
        if self._failure is not None:
            err, self._failure = self._failure, None
            if isinstance(err, OSError) and not peer_failure(err):  # the tmpfs: full, gone
                raise UserError(f"peer snapshot failed ({type(err).__name__}: {err}); the "
                                "run stops (its checkpoints are intact): free host memory "
                                f"under {self.store.runs.parent} or set "
                                "checkpoint.snapshot_interval=0") from err
            # anything else as it is: a peer that died mid-round is a failure a restart
            # gets past (a UserError would end the restarts: parallel/launch.py)
            raise err

    def _allocate(self, tensors: dict[str, torch.Tensor]) -> bool:
        """The staging buffer, once every rank agrees that its node has room for a round
        (one small all-reduce); a line and no snapshots when one has not."""
        self._slots, size = plan_slots(tensors)
        share = self.placement.per_node * size * (5 if self.placement.nodes > 1 else 3)
        # per rank: staging + own file + a round's partial file (+ a replica and its partial)
        free = [v for v in (available_memory(), free_disk(self.store.runs.parent)) if v]
        room = float(all(share <= _MEMORY_SHARE * v for v in free))
        if self._group is not None:
            box = torch.tensor([room])
            dist.all_reduce(box, op=dist.ReduceOp.MIN, group=self._group)
            room = box.item()
        if not room:
            self.enabled = False
            self.log(f"peer snapshots off: a round needs {format_bytes(share)} of host memory "
                     f"per node ({format_bytes(size)} per rank, kept twice with its peer's "
                     f"copy), more than half of what a node has free; lower "
                     "checkpoint.snapshot_interval's cost with more data parallelism, or set "
                     "it to 0")
            return False
        pinned = torch.cuda.is_available() and any(t.is_cuda for t in tensors.values())
        self._staging = torch.empty(size, dtype=torch.uint8, pin_memory=pinned)
        copies = "itself and its peer on the next node" if self.placement.nodes > 1 else \
            "itself only (one node: a snapshot outlives a process, not the machine)"
        self.log(f"peer snapshots every {self.interval} steps in {self.store.folder.parent}: "
                 f"{format_bytes(size)} per rank, kept by {copies}; host memory per rank at "
                 f"most {format_bytes(share / self.placement.per_node)}")
        return True

    def _run_round(self, header: ShardHeader, copied) -> None:
        try:
            started = time.perf_counter()
            parts, mark = {}, started

            def done(part: str) -> None:  # where a round's time goes (the benchmark's table)
                nonlocal mark
                parts[part] = time.perf_counter() - mark
                mark = time.perf_counter()

            faults.fire("snapshot", step=header.step)  # a death in the middle of a round
            if copied is not None:
                copied.synchronize()
            header.data_crc = crc32(self._staging)
            done("crc")
            self.store.write(header, self._staging, "own")
            done("own file")
            source = self.placement.source_of(self.rank)
            if source is not None:
                replica, data = self._exchange(header)
                done("exchange")
                self.store.write(replica, data, "copy")
                done("copy file")
            if self._group is not None:
                dist.barrier(group=self._group)
                done("barrier")
            # every rank has finished this round: the one before is no longer needed
            self.store.prune(self.rank, "own", keep=1)
            if source is not None:
                self.store.prune(source, "copy", keep=1)
            self.last_round_seconds = time.perf_counter() - started
            self.last_round_parts = parts
        except BaseException as err:  # noqa: BLE001 - raised in the training thread by wait
            self._failure = err

    def _exchange(self, header: ShardHeader) -> tuple[ShardHeader, torch.Tensor]:
        """Send this rank's snapshot to its peer, receive its source's (one message of
        lengths, then the header and the data)."""
        peer, source = self.placement.peer_of(self.rank), self.placement.source_of(self.rank)
        head = torch.frombuffer(bytearray(encode_header(header)), dtype=torch.uint8)
        lengths = torch.tensor([head.numel(), self._staging.numel()], dtype=torch.int64)
        incoming = torch.empty(2, dtype=torch.int64)
        self._p2p([(lengths, peer, True), (incoming, source, False)])
        their_head = torch.empty(int(incoming[0]), dtype=torch.uint8)
        their_data = torch.empty(int(incoming[1]), dtype=torch.uint8)
        self._p2p([(head, peer, True), (self._staging, peer, True),
                   (their_head, source, False), (their_data, source, False)])
        return self._checked(their_head, their_data, f"rank {source}'s snapshot")

    def _p2p(self, ops: list[tuple[torch.Tensor, int, bool]]) -> None:
        requests = dist.batch_isend_irecv([
            dist.P2POp(dist.isend if send else dist.irecv, tensor, rank, group=self._group)
            for tensor, rank, send in ops])
        for request in requests:
            request.wait()

    @staticmethod
    def _checked(head: torch.Tensor, data: torch.Tensor, what: str
                 ) -> tuple[ShardHeader, torch.Tensor]:
        header, _ = decode_header(bytes(head.numpy()))
        if header.data_bytes != data.numel() or crc32(data) != header.data_crc:
            raise ValueError(f"{what} arrived damaged (its CRC or size does not match)")
        return header, data

    # -- the end of a timeline or a run ------------------------------------------------------
    def discard(self) -> None:
        """Delete this rank's snapshots and the copies it keeps (a rollback makes them
        stale: they hold a history the run has left)."""
        self._round_done_quietly()
        self.store.prune(self.rank, "own", keep=0)
        source = self.placement.source_of(self.rank)
        if source is not None:
            self.store.prune(source, "copy", keep=0)

    def close(self, finished: bool) -> None:
        """At the end of the run: ``finished`` (it completed or stopped with a checkpoint)
        deletes the snapshots; a failed run keeps them for the restart, and gives a round in
        flight a few seconds to complete (its own file needs nothing of the other ranks; an
        exchange with a dead peer fails or is left behind: the thread is a daemon)."""
        if not finished:
            if self._round is not None:
                self._round.join(timeout=_FAILED_RUN_WAIT)
            return
        self.discard()
        for folder in (self.store.folder, self.store.folder.parent):
            try:
                folder.rmdir()
            except OSError:
                pass

    def _round_done_quietly(self) -> None:
        if self._round is not None:
            self._round.join()
            self._round = None
        self._failure = None

    # -- a restart ----------------------------------------------------------------------------
    def clear_stale(self) -> None:
        """A first start: delete what an earlier job of this run left on this node (its
        snapshots are of a launch that ended). Collective."""
        if not self.enabled:
            return
        if self.rank % self.placement.per_node == 0:
            self.store.remove_run()
        if self._group is not None:
            dist.barrier(group=self._group)

    def can_recover(self) -> bool:
        return self.enabled and _attempt() > 0

    def recover(self, newest_checkpoint: int | None) -> tuple[Recovered | None, str]:
        """This rank's shard of the newest snapshot every rank can restore (collective), or
        None and why (the caller resumes from the checkpoint then)."""
        started = time.perf_counter()
        if faults.lost("snapshots", node=self.placement.node) \
                and self.rank % self.placement.per_node == 0:
            shutil.rmtree(self.store.folder, ignore_errors=True)
        if self._group is not None:
            dist.barrier(group=self._group)  # a lost node's folder is gone for every rank
        mine = [(h.timeline, h.step, h.shard) for h in self.store.holdings()]
        reports = [(self.host, mine, newest_checkpoint)]
        if self._group is not None:
            reports = [None] * self.placement.world_size
            dist.all_gather_object(reports, (self.host, mine, newest_checkpoint),
                                   group=self._group)
        plan, reason = plan_recovery([r[0] for r in reports], [r[1] for r in reports],
                                     reports[0][2])
        if plan is None:
            return None, reason
        header, data, problem = self._fetch(plan)
        ok = torch.tensor([float(not problem)])
        if self._group is not None:
            dist.all_reduce(ok, op=dist.ReduceOp.MIN, group=self._group)
        if not ok.item():
            return None, problem or "another rank's snapshot did not check out"
        path = self.store.folder / self.store.name(self.rank, plan.step, plan.timeline, "own")
        if not plan.local(self.rank):  # keep it on this node too: the next failure may come
            path = self.store.write(header, data, "own")  # before the next round
        return Recovered(header, tensor_views(data, header.slots), path,
                         len(plan.transfers), time.perf_counter() - started), ""

    def _fetch(self, plan: RecoveryPlan) -> tuple[ShardHeader | None, torch.Tensor | None, str]:
        """This rank's shard of ``plan``: read from its node, or received from a peer (and
        sent to those this node's copies serve). A copy that cannot be read is announced to
        its receiver (lengths -1) rather than left unsent: the receiver must not wait for it."""
        mine, problem = None, ""
        for sender, shard in plan.transfers:
            if self.rank == sender:
                try:
                    header, data = self._read(plan, shard)
                    head = torch.frombuffer(bytearray(encode_header(header)), dtype=torch.uint8)
                except (OSError, ValueError) as err:
                    problem = problem or f"rank {self.rank}: {err}"
                    dist.send(torch.tensor([-1, -1]), shard, group=self._group)
                    continue
                dist.send(torch.tensor([head.numel(), data.numel()]), shard, group=self._group)
                dist.send(head, shard, group=self._group)
                dist.send(data, shard, group=self._group)
            elif self.rank == shard:
                lengths = torch.empty(2, dtype=torch.int64)
                dist.recv(lengths, sender, group=self._group)
                if lengths[0] < 0:
                    problem = problem or f"rank {sender} could not read its copy of rank {shard}'s"
                    continue
                head = torch.empty(int(lengths[0]), dtype=torch.uint8)
                data = torch.empty(int(lengths[1]), dtype=torch.uint8)
                dist.recv(head, sender, group=self._group)
                dist.recv(data, sender, group=self._group)
                try:
                    mine = self._checked(head, data, f"rank {sender}'s copy")
                except ValueError as err:
                    problem = problem or f"rank {self.rank}: {err}"
        if plan.local(self.rank):
            try:
                mine = self._read(plan, self.rank)
            except (OSError, ValueError) as err:
                problem = problem or f"rank {self.rank}: {err}"
        if problem or mine is None:
            return None, None, problem or f"rank {self.rank}: no snapshot arrived"
        header, data = mine
        if (header.shard, header.step, header.world_size, header.layout) != (
                self.rank, plan.step, self.placement.world_size, self.layout):
            return None, None, (f"rank {self.rank}: the snapshot is of rank {header.shard}, "
                                f"step {header.step}, {header.layout}")
        return header, data, ""

    def _read(self, plan: RecoveryPlan, shard: int) -> tuple[ShardHeader, torch.Tensor]:
        for holding in reversed(self.store.holdings()):
            if (holding.timeline, holding.step, holding.shard) == (plan.timeline, plan.step,
                                                                    shard):
                try:
                    return self.store.read(holding.path)
                except ValueError as err:
                    raise ValueError(f"{holding.path}: {err}") from None
        raise ValueError(f"shard {shard} of step {plan.step} vanished from {self.store.folder}")
