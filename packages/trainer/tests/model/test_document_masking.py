"""Document masking in packed samples (``data.reset_attention_mask``, ``data.eod_mask_loss``):
each document of a packed sample computes exactly what it computes alone, for every attention
kernel; the masks are megatron-core's; the loss skips EOD inputs."""

from __future__ import annotations

import contextlib

import pytest
import torch

from bloomline.trainer.losses import lm_loss
from bloomline.trainer.model import ModelConfig, alibi_bias, alibi_slopes, build_model
from bloomline.trainer.model.documents import document_bias, document_ids, visible_keys
from bloomline.trainer.step.document_masks import DocumentMasks
from bloomline.trainer.step.sample_forward import forward_loss

EOD, VOCAB = 63, 64
# a packed sample of L + 1 = 17 tokens: the end of a document begun in an earlier sample (5
# tokens, its EOD last), a whole document (7, EOD last), the start of one that goes on (5)
LENGTHS = (5, 7, 5)


def _packed(seed: int = 0) -> tuple[torch.Tensor, list[tuple[int, int]]]:
    """[1, 17] tokens and each document's [start, end) among the 16 input positions."""
    generator = torch.Generator().manual_seed(seed)
    parts = [torch.randint(0, EOD, (n,), generator=generator) for n in LENGTHS]
    parts[0][-1] = parts[1][-1] = EOD
    tokens = torch.cat(parts)[None]
    bounds = [(0, 5), (5, 12), (12, 16)]
    return tokens, bounds


def _model(kernel: str):
    # init_std 0.02: logits of about 1, where fp32's spacing leaves 1e-6 several ulps of room
    cfg = ModelConfig(vocab_size=VOCAB, hidden_size=32, num_layers=2, num_heads=4,
                      attention=kernel, init_std=0.02)
    return build_model(cfg, seed=0).eval()


# flex compiles for seconds on first use
@pytest.mark.parametrize("kernel", ["eager", "sdpa", pytest.param("flex", marks=pytest.mark.slow)])
def test_each_document_computes_what_it_computes_alone(kernel):
    """Bug: a kernel lets a query see keys of an earlier document of the packed sample (the
    mask not applied, applied to the wrong sample of the batch, or with flex a BlockMask
    without the document rule), or the ALiBi distances inside a later document are off (the
    bias counted from the sample's start). fp32, atol 1e-6 against each document alone; two
    samples with different boundaries in one batch."""
    model = _model(kernel)
    tokens, bounds = _packed()
    other = tokens.flip(1)  # the same documents in reverse order: other boundaries
    inputs = torch.cat([tokens, other])[:, :-1]
    with torch.no_grad():
        packed = model(inputs, document_ids=document_ids(inputs, EOD))
        for start, end in bounds:
            alone = model(inputs[:1, start:end])
            torch.testing.assert_close(packed[:1, start:end], alone, atol=1e-6, rtol=0)
        plain = model(inputs)
    # the second sample: documents split at its own EODs
    ends = [0] + [int(i) + 1 for i in torch.nonzero(inputs[1] == EOD)] + [inputs.shape[1]]
    with torch.no_grad():
        for start, end in zip(ends[:-1], ends[1:], strict=True):
            alone = model(inputs[1:, start:end])
            torch.testing.assert_close(packed[1:, start:end], alone, atol=1e-6, rtol=0)
    # and without the ids, later documents do see the earlier ones
    assert (plain[:, 5:] - packed[:, 5:]).abs().max() > 1e-3


def test_alibi_distances_within_a_document_are_the_reset_positions():
    """Bug: the masked ALiBi bias of a later document differs from the bias of the document
    alone (what Megatron's reset position ids give a position encoding): the claim the
    exactness above rests on, on the bias itself."""
    tokens, bounds = _packed()
    inputs = tokens[:, :-1]
    slopes = alibi_slopes(4)
    masked = document_bias(alibi_bias(slopes, 16), document_ids(inputs, EOD))[0]
    for start, end in bounds:
        torch.testing.assert_close(masked[:, start:end, start:end],
                                   alibi_bias(slopes, end - start), atol=0, rtol=0)
        assert torch.isinf(masked[:, start:end, :start]).all()


@pytest.mark.parametrize("tensor_parallel", [1, 2])
def test_eod_mask_loss_is_the_token_mean_of_the_documents_losses(tensor_parallel):
    """Bug: eod_mask_loss masks the label instead of the EOD input (Megatron masks where the
    input is EOD: the prediction across the boundary), the loss is the mean of per-document
    means, or the masked positions still count in the divisor. Checked on the fused head +
    loss (tensor_parallel 1) and on the logits path (tp > 1 takes it)."""
    model = _model("eager")
    tokens, bounds = _packed()
    documents = DocumentMasks(EOD, reset_attention_mask=True, eod_mask_loss=True)
    with torch.no_grad():
        loss = forward_loss(model, tokens, contextlib.nullcontext, tensor_parallel, lm_loss,
                            documents=documents)
        total, count = 0.0, 0
        for start, end in bounds:
            labels = tokens[:, start + 1:end + 1].clone()
            labels[tokens[:, start:end] == EOD] = -100
            _, token_losses = model(tokens[:, start:end], labels=labels, token_losses=True)
            total += float(token_losses.sum())
            count += int((labels >= 0).sum())
    assert count == 16 - 2  # the two EOD inputs
    assert float(loss) == pytest.approx(total / count, rel=1e-6, abs=0)


def _megatron_tokens() -> torch.Tensor:
    """Random tokens with EODs at position 0, at the last position, two in a row, and a few
    more."""
    generator = torch.Generator().manual_seed(3)
    inputs = torch.randint(0, 8, (3, 24), generator=generator)
    inputs[inputs == 7] = EOD  # about one in eight
    inputs[0, 0] = inputs[0, -1] = EOD
    inputs[1, 9] = inputs[1, 10] = EOD
    inputs[2, 0] = inputs[2, 1] = EOD
    return inputs


def test_masks_equal_megatron_core():
    """Bug: our document rule differs from megatron-core's ``--reset-attention-mask`` /
    ``--eod-mask-loss`` at an edge (an EOD at position 0 or last, consecutive EODs: an empty
    document, an EOD attending back into its own document) or the loss mask marks the label
    rather than the input EOD. Also: the ALiBi distance of every visible pair equals the
    difference of Megatron's reset position ids."""
    gpt_dataset = pytest.importorskip("megatron.core.datasets.gpt_dataset")
    inputs = _megatron_tokens()
    next_tokens = torch.randint(0, 8, (3, 1))
    tokens = torch.cat([inputs, next_tokens], dim=1)
    documents = DocumentMasks(EOD, reset_attention_mask=True, eod_mask_loss=True)
    length = inputs.shape[1]
    bias = document_bias(alibi_bias(torch.ones(1), length), documents.model_inputs(inputs)[
        "document_ids"])
    labels = documents.labels(tokens)
    for sample in range(inputs.shape[0]):
        masked, loss_mask, positions = gpt_dataset._get_ltor_masks_and_position_ids(
            inputs[sample], EOD, True, True, True, True)
        visible = visible_keys(bias, sample, length, inputs.device)
        assert torch.equal(visible, ~masked[0]), sample
        assert torch.equal((labels[sample] >= 0).float(), loss_mask), sample
        distance = positions[None, :] - positions[:, None]  # reset j - i
        torch.testing.assert_close(bias[sample, 0][visible], distance[visible].float())


def test_flex_block_mask_sees_the_same_keys_as_the_bias():
    """Bug: the flex BlockMask's mask_mod indexes the document ids by the wrong sample or
    axis (flex on CPU runs forward only, so this checks its rule on every pair directly)."""
    from bloomline.trainer.model.documents import document_block_mask

    inputs = _megatron_tokens()
    ids = document_ids(inputs, EOD)
    bias = document_bias(alibi_bias(torch.ones(1), inputs.shape[1]), ids)
    mask = document_block_mask(ids)
    for sample in range(inputs.shape[0]):
        assert torch.equal(visible_keys(mask, sample, inputs.shape[1], inputs.device),
                           visible_keys(bias, sample, inputs.shape[1], inputs.device))


@pytest.mark.parametrize("kernel", ["eager", "flex"])
def test_max_logit_reads_only_keys_of_the_same_document(kernel):
    """Bug: the activation stats' max |logit| reads scores across documents that attention
    never used (the shared causal bias instead of the forward's per-sample bias or
    BlockMask)."""
    model = _model(kernel)
    inputs = torch.zeros(1, 16, dtype=torch.long)
    inputs[0, 0] = EOD  # key 0 is a document of its own: no later query sees it
    attention = model.h["0"].self_attention
    q, k = torch.ones(1, 4, 16, 8), torch.zeros(1, 4, 16, 8)
    q[:, :, 0] = 0.0
    k[:, :, 0] = 100.0  # a huge score for every query but 0 on key 0
    masked = model.attention_bias(16, inputs.device, document_ids(inputs, EOD))
    assert attention._max_logit(q, k) > 100
    assert attention._max_logit(q, k, masked) < 50  # the ALiBi penalties alone
