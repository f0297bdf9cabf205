"""How the transformer blocks are split into pipeline stages (``parallel.partition``).

Every stage holds a contiguous run of blocks; the first stage also holds the embedding and its
LayerNorm, the last the final LayerNorm and the LM head (with its copy of the tied embedding).

- ``uniform``: the same number of blocks per stage; the remainder goes to the middle stages
  (the outer ones carry the embedding and the head), ties toward the first stage (the head's
  vocabulary matmul makes the last stage the heavier end).
- ``parameters``: balance parameter counts, the embedding counted on the first stage and the
  tied head's copy on the last (the memory view: with a large vocabulary the outer stages get
  fewer blocks).
- ``profile``: balance time. Rank 0 measures each block's forward+backward time, and the
  embedding's and the head's, on this device with the run's micro-batch shape and precision,
  and broadcasts the figures so that every rank cuts the same stages.

``parameters`` and ``profile`` cut by dynamic programming over contiguous splits, minimizing
the slowest (largest) stage, as PipeDream's partitioner does (Narayanan et al., 2019): the
pipeline's step time is set by its slowest stage.
"""

from __future__ import annotations

import statistics
import time

import torch

__all__ = ["balanced_split", "layer_costs", "partition_layers", "stage_cost", "uniform_split"]


def uniform_split(num_layers: int, num_stages: int) -> list[range]:
    """``num_layers`` blocks in ``num_stages`` contiguous runs of equal size, the remainder one
    block each to the stages nearest the middle (ties toward the first stage)."""
    if not 1 <= num_stages <= num_layers:
        raise ValueError(f"cannot split {num_layers} layers into {num_stages} stages")
    base, extra = divmod(num_layers, num_stages)
    middle = (num_stages - 1) / 2
    by_centrality = sorted(range(num_stages), key=lambda s: (abs(s - middle), s))
    sizes = [base + (s in by_centrality[:extra]) for s in range(num_stages)]
    return _ranges(sizes)


def _ranges(sizes: list[int]) -> list[range]:
    out, start = [], 0
    for size in sizes:
        out.append(range(start, start + size))
        start += size
    return out


def stage_cost(costs: list[float], stages: list[range], first_extra: float = 0.0,
               last_extra: float = 0.0) -> list[float]:
    """Each stage's cost: its blocks' costs, plus the embedding's on the first stage and the
    head's on the last."""
    out = [sum(costs[i] for i in stage) for stage in stages]
    out[0] += first_extra
    out[-1] += last_extra
    return out


def balanced_split(costs: list[float], num_stages: int, first_extra: float = 0.0,
                   last_extra: float = 0.0) -> list[range]:
    """Contiguous, non-empty runs of blocks (``costs[i]`` each) for ``num_stages`` stages that
    minimize the largest stage cost, the first stage also paying ``first_extra`` and the last
    ``last_extra``. Dynamic programming, O(stages x layers^2)."""
    n = len(costs)
    if not 1 <= num_stages <= n:
        raise ValueError(f"cannot split {n} layers into {num_stages} stages")
    prefix = [0.0]
    for cost in costs:
        prefix.append(prefix[-1] + cost)

    def run(a: int, b: int, stage: int) -> float:  # blocks [a, b) as stage ``stage``
        extra = (first_extra if stage == 0 else 0.0) + (
            last_extra if stage == num_stages - 1 else 0.0)
        return prefix[b] - prefix[a] + extra

    inf = float("inf")
    # best[j][i]: the smallest possible largest cost of stages 0..j-1 holding blocks [0, i);
    # cut[j][i]: where stage j-1 starts in that optimum
    best = [[inf] * (n + 1) for _ in range(num_stages + 1)]
    cut = [[0] * (n + 1) for _ in range(num_stages + 1)]
    best[0][0] = 0.0
    for j in range(1, num_stages + 1):
        # stage j-1 ends at i; the later stages need at least one block each
        for i in range(j, n - (num_stages - j) + 1):
            for a in range(j - 1, i):
                value = max(best[j - 1][a], run(a, i, j - 1))
                if value < best[j][i]:
                    best[j][i], cut[j][i] = value, a
    sizes, end = [], n
    for j in range(num_stages, 0, -1):
        start = cut[j][end]
        sizes.append(end - start)
        end = start
    return _ranges(sizes[::-1])


def layer_costs(model, mode: str, micro_batch_size: int = 1, seq_length: int = 1,
                dtype: torch.dtype = torch.float32, repeats: int = 3
                ) -> tuple[float, list[float], float]:
    """(embedding, per-block, head) costs of ``model`` (a whole GPT): parameter counts for
    ``parameters``, measured forward+backward seconds for ``profile``."""
    if mode == "parameters":
        embed = sum(p.numel() for p in model.word_embeddings.parameters()) + sum(
            p.numel() for p in model.word_embeddings_layernorm.parameters())
        blocks = [float(sum(p.numel() for p in block.parameters()))
                  for block in model.h.values()]
        # the last stage holds its own copy of the tied embedding for the head
        head = (sum(p.numel() for p in model.ln_f.parameters())
                + model.word_embeddings.weight.numel())
        return float(embed), blocks, float(head)
    if mode == "profile":
        return _measure(model, micro_batch_size, seq_length, dtype, repeats)
    raise ValueError(f"no costs for partition {mode!r}")


def _measure(model, micro_batch_size: int, seq_length: int, dtype: torch.dtype,
             repeats: int) -> tuple[float, list[float], float]:
    """Median forward+backward seconds of the embedding, each block and the head on one
    micro-batch of random tokens (a private generator: the run's RNG stream is untouched)."""
    import torch.nn.functional as F

    device = model.word_embeddings.weight.device
    generator = torch.Generator(device=device).manual_seed(0)
    vocab = model.word_embeddings.num_embeddings
    tokens = torch.randint(0, vocab, (micro_batch_size, seq_length + 1), device=device,
                           generator=generator)
    autocast = torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32)
    was_training = model.training
    model.train()

    def timed(fn) -> float:
        fn()  # warm-up: allocator, kernels, caches
        seconds = []
        for _ in range(repeats):
            _sync(device)
            start = time.perf_counter()
            fn()
            _sync(device)
            seconds.append(time.perf_counter() - start)
        return statistics.median(seconds)

    with autocast:
        hidden = model.embed(tokens[:, :-1]).detach()
        bias = model.attention_bias(seq_length, device)

    def embed():
        with autocast:
            out = model.embed(tokens[:, :-1])
        out.backward(torch.ones_like(out))

    def block_fn(block):
        def run():
            x = hidden.clone().requires_grad_(True)
            with autocast:
                out = block(x, bias)
            out.backward(torch.ones_like(out))
        return run

    def head():
        x = hidden.clone().requires_grad_(True)
        with autocast:
            logits = model.head(x)
        F.cross_entropy(logits.float().flatten(0, 1), tokens[:, 1:].flatten()).backward()

    try:
        costs = (timed(embed), [timed(block_fn(block)) for block in model.h.values()],
                 timed(head))
    finally:
        model.zero_grad(set_to_none=True)  # the measurement's gradients are not the run's
        model.train(was_training)
    return costs


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def partition_layers(model, cfg, num_stages: int, micro_batch_size: int | None = None,
                     dtype: torch.dtype = torch.float32) -> list[range]:
    """The blocks of each of the ``num_stages`` stages of ``model`` (a whole GPT) by
    ``cfg.parallel.partition``. With ``profile``, rank 0 measures and broadcasts: every rank
    must cut the same stages, and timings differ between processes."""
    mode = cfg.parallel.partition
    num_layers = len(model.h)
    if mode == "uniform" or num_stages == 1:
        return uniform_split(num_layers, num_stages)
    if mode == "profile":
        import torch.distributed as dist

        costs = [None]
        if not dist.is_initialized() or dist.get_rank() == 0:
            costs = [layer_costs(model, mode, micro_batch_size or cfg.train.micro_batch_size,
                                 cfg.data.seq_length, dtype)]
        if dist.is_initialized():
            dist.broadcast_object_list(costs, src=0)
        embed, blocks, head = costs[0]
    else:
        embed, blocks, head = layer_costs(model, mode)
    return balanced_split(blocks, num_stages, embed, head)
