"""Contiguous fp32 gradient buffers over data parallelism, in buckets, as Megatron-Core's
``DistributedDataParallel`` keeps them: the layout, the per-parameter accumulation hooks, the
bucketed reduce-scatter of the gradients and the all-gather of the updated parameters. The
optimizer on top (fp32 master shards, Adam) is ``distributed_optimizer.py``.

Which rank owns what. Each parameter's local tensor (its tp shard, or the whole tensor) is
split over dp by rows of dim 0 as ``torch.chunk`` splits it: rank r owns rows
[r*c, (r+1)*c) with c = ceil(rows / dp) (the last ranks may own fewer, or none). This is the
split FSDP2 and the previous ZeRO-1 used, so an owned piece is a ``Shard(0)`` (or
``_StridedShard`` under tp) DTensor that DCP saves and reshards like any other, and
checkpoints of either implementation load into the other. (Megatron cuts one flat range per
rank across parameter boundaries; DCP cannot describe such a piece.)

A bucket's buffer is fp32 ``[dp, S]``, rank-major: row r holds, for every parameter of the
bucket at the same offset, the gradient rows rank r owns (c * cols elements each, the short
last ranks padded). So ``reduce_scatter_tensor`` of the whole buffer into row r (in place,
Megatron's way) leaves rank r the dp-summed gradient of exactly its pieces, and one
``all_gather_into_tensor`` of a ``[dp, S]`` staging buffer in the parameters' dtype
distributes every rank's updated pieces. A parameter with rows divisible by dp is added and
copied back with one strided op; an uneven one row-block by row-block.

Accumulation. A post-accumulate-grad hook per parameter adds its micro-batch gradient (in
the compute dtype: bf16 for a bf16 model) into the fp32 buffer and drops ``.grad``, so the
gradient is held once, in fp32, across all micro-batches (the tied embedding's two uses are
summed by autograd before the hook). ZeRO-1 keeps the full buffer and reduces once per step;
with ``set_sync(True)`` for the last micro-batch (``data_parallel.set_gradient_sync``), a
bucket is reduced as soon as its last parameter's gradient arrives, overlapping the rest of
the backward. ZeRO-2 reduces every micro-batch, bucket by bucket, into a persistent fp32
shard (S per bucket) and frees the bucket's buffer: gradients at rest are 4/dp bytes per
parameter plus the buckets in flight.

Invariant: every dp rank builds the same buckets (the same parameters in the same order and
shapes) and reduces them in the same order (the collectives pair up by call order).
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable, Iterable

import torch
import torch.distributed as dist

__all__ = ["Bucket", "GradBuffers", "Region", "buffers_of", "set_sync"]

# torch 2.13 renamed the single-tensor collectives (the old names warn); older ones lack them
_REDUCE_SCATTER = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
_ALL_GATHER = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor

# model -> its GradBuffers: ``set_sync`` and the checkpoint code find the engine from the model
_BUFFERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def buffers_of(model) -> GradBuffers | None:
    """The gradient buffers installed on ``model`` (None: not on the buffers engine)."""
    return _BUFFERS.get(model)


def set_sync(model, enabled: bool) -> bool:
    """Tell ``model``'s buffers whether this is the step's last micro-batch (reduce buckets as
    they complete). False if ``model`` has no buffers."""
    buffers = buffers_of(model)
    if buffers is None:
        return False
    buffers.sync = enabled
    return True


def _local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


class Region:
    """One parameter's place in its bucket: ``rows`` x ``cols`` local elements (a 1-D or 0-D
    tensor counts as rows of one element), ``per_rank`` rows per rank (the chunk size),
    ``offset`` in each rank's row of the buffer; ``owned`` = (first row, row count) of each
    rank."""

    def __init__(self, param: torch.Tensor, dp: int, offset: int) -> None:
        local = _local(param)
        self.param = param
        self.shape = tuple(local.shape)
        self.rows = self.shape[0] if local.ndim else 1
        self.cols = local.numel() // self.rows if self.rows else 0
        self.per_rank = math.ceil(self.rows / dp)
        self.offset = offset
        self.owned = [(min(r * self.per_rank, self.rows),
                       max(0, min((r + 1) * self.per_rank, self.rows) - r * self.per_rank))
                      for r in range(dp)]
        self.even = self.rows == self.per_rank * dp

    @property
    def width(self) -> int:
        """Elements this parameter takes in each rank's row of the buffer."""
        return self.per_rank * self.cols

    def piece(self, row: torch.Tensor, rank: int) -> torch.Tensor:
        """Rank ``rank``'s rows of this parameter inside ``row`` (a rank's row of a buffer),
        shaped as those rows of the local tensor."""
        _, count = self.owned[rank]
        return row.narrow(0, self.offset, count * self.cols).view(count, *self.shape[1:])

    def owned_rows(self, local: torch.Tensor, rank: int) -> torch.Tensor:
        """Rank ``rank``'s rows of ``local`` (laid out as the parameter's local tensor), a
        view of it."""
        first, count = self.owned[rank]
        return local.reshape(self.rows, -1).narrow(0, first, count).view(count,
                                                                         *self.shape[1:])

    def scatter_add(self, buffer: torch.Tensor, value: torch.Tensor) -> None:
        """Add the local tensor ``value`` into every rank's row of ``buffer`` ([dp, S])."""
        flat = value.reshape(-1)
        if self.even:
            buffer[:, self.offset:self.offset + self.width].add_(flat.view(len(self.owned),
                                                                           self.width))
            return
        for rank, (first, count) in enumerate(self.owned):
            if count:
                buffer[rank, self.offset:self.offset + count * self.cols].add_(
                    flat[first * self.cols:(first + count) * self.cols])

    def gather_copy(self, staging: torch.Tensor, target: torch.Tensor) -> None:
        """Copy every rank's rows of this parameter from ``staging`` ([dp, S]) into the local
        tensor ``target``."""
        flat = target.view(-1)
        if self.even:
            flat.view(len(self.owned), self.width).copy_(
                staging[:, self.offset:self.offset + self.width])
            return
        for rank, (first, count) in enumerate(self.owned):
            if count:
                flat[first * self.cols:(first + count) * self.cols].copy_(
                    staging[rank, self.offset:self.offset + count * self.cols])


class Bucket:
    """Parameters reduced by one reduce-scatter and gathered by one all-gather."""

    def __init__(self, params: list[torch.Tensor], dp: int, rank: int, sharded_grads: bool,
                 device: torch.device) -> None:
        self.dp, self.rank, self.sharded_grads, self.device = dp, rank, sharded_grads, device
        self.regions: list[Region] = []
        offset = 0
        for param in params:
            region = Region(param, dp, offset)
            self.regions.append(region)
            offset += region.width
        self.size = offset  # S: elements per rank
        self.buffer: torch.Tensor | None = None  # [dp, S] fp32
        # ZeRO-1: this rank's row of the buffer; ZeRO-2: a persistent fp32 accumulator
        self.shard = (torch.zeros(self.size, dtype=torch.float32, device=device)
                      if sharded_grads else None)
        if not sharded_grads:
            self.buffer = self._new_buffer()
            self.shard = self.buffer[rank]
        self.pending = len(params)  # gradients still to come in this backward
        self.work = None  # an in-flight reduce-scatter

    @property
    def dtype(self) -> torch.dtype:
        """The parameters' dtype (read when gathering: the model is cast after the buckets
        are laid out)."""
        return _local(self.regions[0].param).dtype

    def _new_buffer(self) -> torch.Tensor:
        return torch.zeros(self.dp, self.size, dtype=torch.float32, device=self.device)

    def add(self, region: Region, grad: torch.Tensor) -> None:
        if self.work is not None:  # never add into a buffer being reduced
            self.finish_reduce()
        if self.buffer is None:  # ZeRO-2: a bucket's buffer lives for one micro-batch
            self.buffer = self._new_buffer()
        region.scatter_add(self.buffer, grad)

    def start_reduce(self, group) -> None:
        """Launch the reduce-scatter of the buffer into this rank's row (in place)."""
        if self.work is not None or self.buffer is None:
            return
        out = self.buffer[self.rank]
        if group is None or self.dp == 1:
            self.work = _Done()
        else:
            self.work = _REDUCE_SCATTER(out, self.buffer.view(-1), group=group, async_op=True)

    def finish_reduce(self) -> None:
        """Wait for the reduce-scatter; ZeRO-2 adds the result to its shard and frees the
        buffer."""
        if self.work is None:
            return
        self.work.wait()
        self.work = None
        if self.sharded_grads:
            self.shard.add_(self.buffer[self.rank])
            self.buffer = None

    def zero(self) -> None:
        if self.sharded_grads:
            self.shard.zero_()
            self.buffer = None
        else:
            self.buffer.zero_()
        self.pending = len(self.regions)
        self.work = None


class _Done:
    def wait(self) -> None:
        pass


class GradBuffers:
    """The fp32 gradient buckets of ``chunks`` (the modules a rank runs: the model, or its
    pipeline stages; a bucket never spans two, as a stage's backward is one micro-batch's)
    over ``dp_group``. ``sharded_grads``: ZeRO-2 (reduce every micro-batch into 4/dp shards);
    else ZeRO-1 (one full buffer, reduced once per step). ``bucket_size``: elements per
    bucket, filled in backward order (the last parameters first), so the first buckets
    complete first."""

    def __init__(self, model, chunks: Iterable, dp_group, dp: int, rank: int,
                 bucket_size: int, sharded_grads: bool, device: torch.device) -> None:
        self.group, self.dp, self.rank = dp_group, dp, rank
        self.sharded_grads = sharded_grads
        # whether the running backward is the step's last micro-batch (``set_sync``); when
        # nobody says (a pipeline schedule), ZeRO-1 reduces at ``reduce()``
        self.sync = False
        self.started_in_backward = 0  # reductions launched by the hooks (overlapped), a count
        # called with a bucket's [dp, S] buffer right before its reduction: this rank's own
        # gradient, which the step's recompute digests (step/recompute.py); None: nothing
        self.on_reduce: Callable[[torch.Tensor], None] | None = None
        self.buckets: list[Bucket] = []
        self._where: dict[torch.Tensor, tuple[Bucket, Region]] = {}
        seen: set[int] = set()
        chunks = list(chunks)
        for chunk in chunks:
            params = [p for p in chunk.parameters() if p.requires_grad and id(p) not in seen]
            seen.update(id(p) for p in params)
            current: list[torch.Tensor] = []
            elements = 0
            for param in reversed(params):
                current.append(param)
                elements += _local(param).numel()
                if elements >= bucket_size:
                    self._add_bucket(current, device)
                    current, elements = [], 0
            if current:
                self._add_bucket(current, device)
        for bucket in self.buckets:
            for region in bucket.regions:
                self._where[region.param] = (bucket, region)
        self._hooks: list = []
        for module in (model, *chunks):  # a pipeline stage's schedule sets the sync per chunk
            _BUFFERS[module] = self

    def install_hooks(self) -> None:
        """Start accumulating: a post-accumulate-grad hook on every parameter (installed
        after the model is cast to its compute dtype: ``swap_tensors`` refuses a tensor with
        hooks)."""
        self._hooks = [param.register_post_accumulate_grad_hook(self._accumulate)
                       for param in self._where]

    def _add_bucket(self, params: list, device: torch.device) -> None:
        # the parameters' device where they have one (a planner's meta build: meta buffers)
        local = _local(params[0])
        device = local.device if local.device.type == "meta" else device
        self.buckets.append(Bucket(params, self.dp, self.rank, self.sharded_grads, device))

    def region(self, param: torch.Tensor) -> tuple[Bucket, Region]:
        return self._where[param]

    def shard_grad(self, param: torch.Tensor) -> torch.Tensor:
        """This rank's rows of ``param``'s reduced gradient (a view: writing scales it)."""
        bucket, region = self._where[param]
        return region.piece(bucket.shard, self.rank)

    def _accumulate(self, param: torch.Tensor) -> None:
        grad = param.grad
        placements = getattr(param, "placements", None)
        if placements is not None and grad.placements != placements:
            # sequence parallelism leaves a replicated norm's gradient partial over tp
            grad = grad.redistribute(param.device_mesh, placements)
        bucket, region = self._where[param]
        bucket.add(region, _local(grad))
        param.grad = None
        bucket.pending -= 1
        if bucket.pending == 0:
            bucket.pending = len(bucket.regions)
            if self.sharded_grads or self.sync:
                self._start_reduce(bucket)
                self.started_in_backward += 1
                if self.sharded_grads and not self.sync:
                    # a micro-batch before the last: its buffer is freed now, not at step end
                    bucket.finish_reduce()

    def reduce(self) -> None:
        """After the step's last backward: every bucket reduced (those not started yet are
        started, all are waited), then averaged over dp."""
        for bucket in self.buckets:
            self._start_reduce(bucket)
        for bucket in self.buckets:
            bucket.finish_reduce()
            bucket.pending = len(bucket.regions)
            if self.dp > 1:
                bucket.shard.div_(self.dp)

    def _start_reduce(self, bucket: Bucket) -> None:
        if self.on_reduce is not None and bucket.work is None and bucket.buffer is not None:
            self.on_reduce(bucket.buffer)
        bucket.start_reduce(self.group)

    def zero(self) -> None:
        for bucket in self.buckets:
            bucket.zero()

    def gather(self, fill: Callable[[Region, torch.Tensor], None]) -> None:
        """All-gather the parameters, bucket by bucket: ``fill(region, rows)`` writes this
        rank's updated rows of a parameter into ``rows`` (in the parameters' dtype); every
        rank's rows are then copied into each parameter's local tensor."""
        for bucket in self.buckets:
            # its padding (short ranks' rows) is gathered but never copied back: no zeros
            mine = torch.empty(bucket.size, dtype=bucket.dtype, device=bucket.device)
            for region in bucket.regions:
                fill(region, region.piece(mine, self.rank))
            staging = torch.empty(self.dp, bucket.size, dtype=bucket.dtype,
                                  device=bucket.device)
            if self.group is None or self.dp == 1:
                staging[0].copy_(mine)
            else:
                _ALL_GATHER(staging.view(-1), mine, group=self.group)
            del mine
            for region in bucket.regions:
                region.gather_copy(staging, _local(region.param))
