"""The fused LM head + cross-entropy (model/loss.py) against F.cross_entropy over materialized
logits: the loss, both gradients, ignored labels, chunk boundaries, eval without gradients,
and the model's two forward paths."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from bloomline.trainer.model import ModelConfig, build_model
from bloomline.trainer.model import loss as loss_module
from bloomline.trainer.model.loss import linear_cross_entropy


def _reference(hidden, weight, labels, dtype):
    with torch.autocast("cpu", dtype, enabled=dtype != torch.float32):
        logits = F.linear(hidden, weight)
    return F.cross_entropy(logits.float(), labels)


def _loss_and_grads(fn, hidden, weight, labels, dtype, grad_scale=3.0):
    hidden = hidden.clone().requires_grad_()
    weight = weight.clone().requires_grad_()
    loss = fn(hidden, weight, labels, dtype)
    (loss * grad_scale).backward()
    return loss.detach(), hidden.grad, weight.grad


def _ours(hidden, weight, labels, dtype):
    with torch.autocast("cpu", dtype, enabled=dtype != torch.float32):
        return linear_cross_entropy(hidden, weight, labels)


@pytest.mark.parametrize("dtype, rtol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
def test_matches_cross_entropy_over_materialized_logits(monkeypatch, dtype, rtol):
    """Bugs caught: a wrong softmax gradient (missing the -1 at the target, the 1/n, or the
    incoming gradient's scale), a target logit read after the chunk was overwritten in place
    (fp32, where the upcast is the chunk itself), a chunk boundary that drops or repeats rows,
    ignored labels (-100) counted in the loss or the mean. Tolerances: fp32 agrees to rounding;
    bf16 gradients are rounded to bf16 on both sides, from softmaxes computed in a different
    order, so a few elements differ by one bf16 ulp (2^-8 relative)."""
    monkeypatch.setattr(loss_module, "_CHUNK_BYTES", 4 * 97 * 5)  # 5 rows a chunk: 61 = 12*5+1
    generator = torch.Generator().manual_seed(0)
    hidden = torch.randn(61, 24, generator=generator)
    weight = torch.randn(97, 24, generator=generator) * 0.5
    labels = torch.randint(0, 97, (61,), generator=generator)
    labels[[0, 7, 60]] = -100
    expected = _loss_and_grads(_reference, hidden, weight, labels, dtype)
    got = _loss_and_grads(_ours, hidden, weight, labels, dtype)
    assert got[0].dtype == torch.float32
    torch.testing.assert_close(got[0], expected[0], rtol=1e-5 if dtype == torch.float32 else 1e-3,
                               atol=0)
    for ours, ref in zip(got[1:], expected[1:], strict=True):
        torch.testing.assert_close(ours, ref, rtol=rtol, atol=rtol * ref.abs().max().item())
    # the head is per token: an ignored row's hidden state gets no gradient at all
    assert torch.equal(got[1][[0, 7, 60]], torch.zeros(3, 24, dtype=got[1].dtype))


def test_fp16_keeps_the_unfused_path():
    """Bug caught: fp16 rounding the unscaled gradient (p / n underflows fp16 long before the
    loss scale lifts it): in fp16 the gradient must come from autocast's own cast of the
    scaled fp32 gradient, exactly as over materialized logits."""
    generator = torch.Generator().manual_seed(3)
    hidden = torch.randn(40, 16, generator=generator)
    weight = torch.randn(50, 16, generator=generator)
    labels = torch.randint(0, 50, (40,), generator=generator)
    expected = _loss_and_grads(_reference, hidden, weight, labels, torch.float16, 2.0 ** 16)
    got = _loss_and_grads(_ours, hidden, weight, labels, torch.float16, 2.0 ** 16)
    for ours, ref in zip(got, expected, strict=True):
        assert torch.equal(ours, ref)


def test_without_gradients_it_returns_the_same_loss():
    """Bug caught: the eval path (no_grad) computing or keeping the gradients, or taking a
    different branch that changes the loss."""
    generator = torch.Generator().manual_seed(1)
    hidden = torch.randn(10, 8, generator=generator)
    weight = torch.randn(33, 8, generator=generator)
    labels = torch.randint(0, 33, (10,), generator=generator)
    with torch.no_grad():
        loss = linear_cross_entropy(hidden, weight, labels)
    assert loss.grad_fn is None
    torch.testing.assert_close(loss, F.cross_entropy(hidden @ weight.t(), labels))
    assert torch.isnan(linear_cross_entropy(hidden, weight, torch.full((10,), -100)))


def test_model_loss_path_equals_cross_entropy_of_its_logits():
    """Bug caught: ``GPT.forward(ids, labels)`` skipping the final LayerNorm, using another
    weight than the tied embedding, or shifting the labels a second time; the gradients
    reach every parameter as through the logits path (fp32, to rounding)."""
    cfg = ModelConfig(vocab_size=256, hidden_size=32, num_layers=2, num_heads=4)
    model = build_model(cfg, seed=0)
    generator = torch.Generator().manual_seed(2)
    ids = torch.randint(0, 256, (2, 17), generator=generator)
    fused = model(ids[:, :-1], labels=ids[:, 1:])
    fused.backward()
    fused_grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    plain = F.cross_entropy(model(ids[:, :-1]).flatten(0, 1), ids[:, 1:].flatten())
    plain.backward()
    torch.testing.assert_close(fused, plain, rtol=1e-6, atol=0)
    for name, param in model.named_parameters():
        torch.testing.assert_close(fused_grads[name], param.grad, rtol=1e-5, atol=1e-7,
                                   msg=lambda m, name=name: f"{name}: {m}")
