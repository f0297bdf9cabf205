"""Text continuation from a checkpoint, for a sanity check: greedy, top-k and top-p sampling.

No KV cache: every new token re-runs the whole context. That is O(n^2) in the output length
and fine for the few dozen tokens of a sanity check; ALiBi needs no position limit.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from bloomline.common.errors import UserError

__all__ = ["check_sampling_options", "continuation_text", "generate_ids", "sample_next"]


def check_sampling_options(max_new_tokens: int, temperature: float, top_k: int,
                           top_p: float) -> None:
    """``trainer generate``'s sampling options within the ranges ``sample_next`` means them
    for; else a one-line UserError naming the option. Out of range they were taken as
    something else: a NaN temperature made every probability NaN (multinomial fails), a
    negative one or a top-p of 0 or above 1 silently meant greedy or all tokens, and a
    negative count generated nothing."""
    if max_new_tokens < 1:
        raise UserError(f"--max-new-tokens {max_new_tokens}: must be >= 1")
    if not (math.isfinite(temperature) and temperature >= 0):
        raise UserError(f"--temperature {temperature}: must be a finite number >= 0 "
                        "(0: greedy)")
    if top_k < 0:
        raise UserError(f"--top-k {top_k}: must be >= 0 (0: all tokens)")
    if not 0 < top_p <= 1:  # also false for NaN
        raise UserError(f"--top-p {top_p}: must be in (0, 1] (1: all tokens)")


def sample_next(logits: torch.Tensor, temperature: float, top_k: int, top_p: float,
                generator: torch.Generator | None) -> int:
    """Next id from the last position's logits: greedy when temperature is 0."""
    logits = logits.float()
    if temperature <= 0:
        return int(logits.argmax())
    logits = logits / temperature
    if top_k > 0:
        kth = torch.topk(logits, min(top_k, logits.numel())).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if 0.0 < top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True)
        cumulative = torch.softmax(sorted_logits, dim=-1).cumsum(-1)
        # drop a token when the tokens before it already reach top_p (the first always stays)
        drop = cumulative - torch.softmax(sorted_logits, dim=-1) >= top_p
        logits = logits.scatter(0, order[drop], float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    return int(torch.multinomial(probs, 1, generator=generator))


@torch.no_grad()
def generate_ids(model, prompt_ids: list[int], max_new_tokens: int, temperature: float = 0.0,
                 top_k: int = 0, top_p: float = 1.0, eod_id: int | None = None,
                 seed: int = 0, vocab_size: int | None = None,
                 unassigned_ids: Sequence[int] = ()) -> list[int]:
    """Continue ``prompt_ids``. ``vocab_size``: the tokenizer's (its largest id + 1); ids at
    or above it (the model's vocabulary is padded to a multiple of 128) and
    ``unassigned_ids`` (the tokenizer's gaps below it) are never produced: no token has them.
    """
    model.eval()
    device = next(model.parameters()).device
    generator = torch.Generator(device="cpu").manual_seed(seed)
    unassigned = torch.tensor(list(unassigned_ids), dtype=torch.long)
    ids = list(prompt_ids)
    for _ in range(max_new_tokens):
        logits = model(torch.tensor([ids], device=device))[0, -1].cpu()
        if vocab_size is not None:
            logits = logits[:vocab_size]
        if len(unassigned):
            logits = logits.index_fill(0, unassigned, float("-inf"))
        token = sample_next(logits, temperature, top_k, top_p, generator)
        ids.append(token)
        if token == eod_id:
            break
    return ids[len(prompt_ids):]


def continuation_text(tokenizer, prompt_ids: list[int], new_ids: list[int]) -> str:
    """The text ``new_ids`` add after the prompt. SentencePiece drops the leading space of a
    text's first piece, so decoding the new ids alone glues their first word to the prompt
    ("The history of" + "the" = "The history ofthe"): decode them after the prompt's ids and
    keep what comes past the prompt's own text."""
    head = tokenizer.decode(prompt_ids)
    whole = tokenizer.decode(list(prompt_ids) + list(new_ids))
    return whole[len(head):] if whole.startswith(head) else tokenizer.decode(new_ids)
