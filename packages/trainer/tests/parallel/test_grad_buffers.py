"""The buffers engine's layout (``parallel/grad_buffers.py``) in one process: where each
rank's rows of a parameter sit in a bucket's rank-major buffer, for parameters whose rows
divide by dp (one strided op) and for those that do not (row blocks, the short ranks padded).
The multi-process runs (test_parallel_zero.py) use the tiny model, whose rows all divide."""

from __future__ import annotations

import pytest
import torch

from bloomline.trainer.parallel.grad_buffers import Bucket


@pytest.mark.parametrize("shape", [(6, 3), (5, 3), (1, 4), (7,)], ids=str)
@pytest.mark.parametrize("dp", [2, 3, 4])
def test_every_rank_row_holds_the_rows_torch_chunk_gives_it(shape, dp):
    """Bug: an uneven parameter's rows land at the wrong offset or rank (torch.chunk gives the
    first ranks ceil(rows / dp) rows, the last fewer or none), so a rank reduces and steps
    another rank's rows; or a gather writes them back elsewhere. Each rank's row of the
    buffer must hold exactly its torch.chunk rows, and gathering every rank's rows must
    rebuild the parameter."""
    other = torch.zeros(4, 2)  # a second parameter after it: offsets must not overlap
    param = torch.arange(torch.Size(shape).numel(), dtype=torch.float32).reshape(shape) + 1
    bucket = Bucket([param, other], dp, rank=0, sharded_grads=False, device=torch.device("cpu"))
    region, second = bucket.regions
    bucket.add(region, param)
    bucket.add(second, torch.full_like(other, -1.0))
    chunks = torch.chunk(param, dp)
    for rank in range(dp):
        rows = region.piece(bucket.buffer[rank], rank)
        want = chunks[rank] if rank < len(chunks) else param[:0]
        assert torch.equal(rows, want), (rank, rows, want)
        assert torch.equal(second.piece(bucket.buffer[rank], rank),
                           torch.chunk(torch.full_like(other, -1.0), dp)[rank]
                           if rank < len(torch.chunk(other, dp)) else other[:0])
    rebuilt = torch.zeros_like(param)
    region.gather_copy(bucket.buffer, rebuilt)
    assert torch.equal(rebuilt, param)


def test_a_zero2_bucket_frees_its_buffer_after_the_reduction():
    """Bug: ZeRO-2's bucket keeps its [dp, S] buffer after reducing it into the shard (the
    gradient held twice, 4 bytes per parameter more than ZeRO-2 promises), or loses the
    micro-batch it reduced. One process (no group): the shard accumulates each micro-batch."""
    param = torch.ones(4, 2)
    bucket = Bucket([param], 2, rank=1, sharded_grads=True, device=torch.device("cpu"))
    for _ in range(3):
        bucket.add(bucket.regions[0], torch.ones(4, 2))
        bucket.start_reduce(None)
        bucket.finish_reduce()
        assert bucket.buffer is None
    assert torch.equal(bucket.shard, torch.full((4,), 3.0))  # rank 1's rows: 2 x 2 elements
