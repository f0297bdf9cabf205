"""Check a: the FlexAttention ALiBi kernel against the eager one, forward and backward.

CPU tests cover flex's forward only (FlexAttention has no CPU backward), and the compiled GPU
kernel is what every CUDA run trains with (``model.attention = "auto"``), so this is where its
gradients and its tensor-parallel head offsets (a shard's slopes are a slice of the whole
model's, not its own head count's) are first checked.

Contract: :func:`check_flex_attention` returns one :class:`Row` per (heads case, sequence
length, precision). The reference is always the eager kernel in fp32 with the same weights
(``load_state_dict``). Errors are :func:`relative_error` of the output and of each gradient
(the input's and every weight's) under one fixed random cotangent; the row reports the worst.
:data:`DOCUMENT_CASES` run again with packed documents (``data.reset_attention_mask``): flex
with its per-sample ``BlockMask`` against eager with the per-sample bias (CPU tests check this
forward only, and check that each document's logits equal the document run alone).
Tolerances: fp32 flex within :data:`FP32_TOL` (fp32 roundoff in another summation order);
bf16-autocast flex within :data:`BF16_TOL` or twice the eager kernel's own bf16 error,
whichever is larger (a bf16 kernel cannot be held closer to fp32 than bf16 eager gets).
"""

from __future__ import annotations

import time

import torch

from benchmarks.gpu_checks.results import FAIL, PASS, SKIPPED, Row, relative_error

__all__ = ["BF16_TOL", "CASES", "DOCUMENT_CASES", "FP32_TOL", "check_flex_attention"]

FP32_TOL = 1e-4
BF16_TOL = 2e-2
HEAD_DIM = 64
# (model heads, first head of the shard, heads in the shard): the whole range; the second
# half of 8 (tp2's rank 1); 12, whose slopes interleave two power-of-two sequences; its last
# third (tp3's rank 2), which lies in the interleaved part
CASES = ((8, 0, 8), (8, 4, 4), (12, 0, 12), (12, 8, 4))
# the cases also run with packed documents: a tensor-parallel shard of the interleaved slopes
DOCUMENT_CASES = ((12, 8, 4),)
# where each sample's documents end (EOD positions, as fractions of L): a partial first
# document, short and long ones, an end at the last position; sample 1 two documents
DOCUMENT_ENDS = ((0.1, 0.15, 0.6, 1.0), (0.5,))


def _layer(kernel: str, heads: int, start: int, count: int, device: str):
    from bloomline.trainer.model import ModelConfig
    from bloomline.trainer.model.attention import Attention

    cfg = ModelConfig(hidden_size=heads * HEAD_DIM, num_heads=heads, attention=kernel)
    return Attention(cfg, head_start=start, num_heads=count).to(device)


def document_ids(batch: int, length: int, device: str) -> torch.Tensor:
    """[batch, length] document ids of packed samples ending documents at
    :data:`DOCUMENT_ENDS` (sample i takes row i modulo their count), by the trainer's rule."""
    from bloomline.trainer.model.documents import document_ids as ids_of

    eod = 1
    tokens = torch.zeros(batch, length, dtype=torch.long, device=device)
    for sample in range(batch):
        for end in DOCUMENT_ENDS[sample % len(DOCUMENT_ENDS)]:
            tokens[sample, min(length - 1, int(end * length))] = eod
    return ids_of(tokens, eod)


def _run(layer, x: torch.Tensor, cotangent: torch.Tensor, bf16: bool, backward: bool,
         documents: torch.Tensor | None = None):
    """The layer's output and (with ``backward``) the gradients of <output, cotangent> with
    respect to x and each parameter, by name; ``documents``: the samples' document ids
    (attention within each document)."""
    x = x.detach().requires_grad_(backward)
    # without backward no tensor may require grad (flex has no CPU backward and refuses one)
    with torch.set_grad_enabled(backward), \
            torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=bf16):
        mask = (None if documents is None
                else layer.bias_for(x.shape[1], x.device, documents))
        out = layer(x, mask)
    tensors = {"output": out.float()}
    if backward:
        names, params = zip(*layer.named_parameters(), strict=True)
        grads = torch.autograd.grad(out.float(), [x, *params], cotangent)
        tensors.update(zip(("input", *names), grads, strict=True))
    return {name: t.detach() for name, t in tensors.items()}


def _worst(got: dict, want: dict) -> tuple[float, str]:
    return max((relative_error(got[name], want[name]), name) for name in want)


def check_flex_attention(device: str = "cuda", seq_lengths=(256, 1024), cases=CASES,
                         backward: bool = True, bf16: bool = True, batch: int = 2,
                         budget_s: float | None = None,
                         document_cases=DOCUMENT_CASES) -> list[Row]:
    """Flex against eager for every case and length, in fp32 and (``bf16``) bf16 autocast.
    ``device="cpu"`` with ``backward=False, bf16=False`` is the CPU-testable subset.

    Every case at the first length, then every case at the next: with ``budget_s``, the
    cases not started within it (each compiles afresh) are skipped rows that say so; the
    first case always runs."""
    rows = []
    began = time.monotonic()
    runs = [(case, False) for case in cases] + [(case, True) for case in document_cases]
    for length in seq_lengths:
        for (heads, start, count), documents in runs:
            kind = "flex-alibi-documents" if documents else "flex-alibi"
            label = f"{kind} h{heads}[{start}:{start + count}] L{length}"
            spent = time.monotonic() - began
            if budget_s is not None and rows and spent > budget_s:
                rows.append(Row(label, SKIPPED, detail=f"not started: {spent:.0f} s of the "
                                                       f"check's {budget_s:.0f} s budget spent"))
                continue
            rows.extend(_compare(device, heads, start, count, length, backward, bf16, batch,
                                 label, documents))
    return rows


def _compare(device: str, heads: int, start: int, count: int, length: int, backward: bool,
             bf16: bool, batch: int, label: str, documents: bool = False) -> list[Row]:
    """The fp32 row and (``bf16``) the bf16 row of one case at one length (``documents``:
    packed documents, attention within each)."""
    # a fresh compilation per case: the compiled kernel would otherwise be reused through
    # guards, and past dynamo's recompile limit fall back to the uncompiled path this check
    # is not about
    torch.compiler.reset()
    torch.manual_seed(0)
    eager = _layer("eager", heads, start, count, device)
    flex = _layer("flex", heads, start, count, device)
    flex.load_state_dict(eager.state_dict())
    x = torch.randn(batch, length, heads * HEAD_DIM, device=device)
    cotangent = torch.randn_like(x)
    ids = document_ids(batch, length, device) if documents else None
    reference = _run(eager, x, cotangent, False, backward, ids)
    began = time.perf_counter()
    error, where = _worst(_run(flex, x, cotangent, False, backward, ids), reference)
    seconds = time.perf_counter() - began
    rows = [Row(f"{label} fp32", PASS if error <= FP32_TOL else FAIL,
                f"worst {error:.1e} ({where}); {seconds:.0f} s, compilation included",
                f"{FP32_TOL:.0e} of max|eager fp32|")]
    if bf16:
        error, where = _worst(_run(flex, x, cotangent, True, backward, ids), reference)
        own, own_where = _worst(_run(eager, x, cotangent, True, backward, ids), reference)
        tol = max(BF16_TOL, 2 * own)
        rows.append(Row(f"{label} bf16", PASS if error <= tol else FAIL,
                        f"worst {error:.1e} ({where}); eager bf16 {own:.1e} ({own_where})",
                        f"max({BF16_TOL:.0e}, 2x eager bf16)"))
    return rows
