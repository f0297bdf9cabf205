"""A whole `trainer pretrain` run against an independent implementation of the same recipe.

The reference is written from the documented recipe with none of bloomline's training code:
transformers' ``BloomForCausalLM`` started from the same random weights, ``torch.optim.AdamW``
with biases and norms undecayed, the warmup + cosine schedule over consumed samples,
global-norm clipping, and the samples in megatron-core's ``GPTDataset`` order (consecutive
global batches, split into consecutive micro-batches whose mean losses are averaged). The
trainer starts from the transformers folder through ``checkpoint.init_from``.

Runs when transformers and megatron-core are installed (``requirements-compat.txt``, which
``make test`` installs): both are oracles, never product dependencies.
"""

from __future__ import annotations

import json
import math
import socket
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from bloomline.dataprep import IndexedDatasetWriter

pytestmark = pytest.mark.slow

BIN = Path(sys.executable).parent
STEPS = 40
MICRO, GLOBAL, SEQ = 4, 8, 32
LR, MIN_LR, WARMUP, BETAS, EPS, DECAY, CLIP = 2e-3, 2e-4, 64, (0.9, 0.95), 1e-8, 0.1, 1.0
VOCAB = 256  # the embedding rows: a multiple of 128 x tp, as the trainer pads
# per-step loss of a run against the reference: fp32 throughout, different kernels
# (fused vs foreach AdamW, oneDNN vs MKL products, the fused head + loss) and summation orders
TOLERANCE = 1e-5

RECIPE = ["data.seq_length=32", "data.split=98,2,0", "data.num_workers=0", "data.seed=1234",
          f"train.micro_batch_size={MICRO}", f"train.global_batch_size={GLOBAL}",
          f"train.train_samples={STEPS * GLOBAL}", "train.log_interval=1",
          "train.eval_interval=0", "train.device=cpu", "precision.dtype=fp32",
          f"optimizer.lr={LR}", f"optimizer.min_lr={MIN_LR}", f"optimizer.beta1={BETAS[0]}",
          f"optimizer.beta2={BETAS[1]}", f"optimizer.eps={EPS}",
          f"optimizer.weight_decay={DECAY}", f"optimizer.clip_grad={CLIP}",
          f"schedule.warmup={WARMUP}", "schedule.style=cosine", "checkpoint.interval=20",
          "monitor.tensorboard=false", "monitor.activation_stats_interval=0",
          "monitor.peak_flops=1e12", "spike.enabled=false"]


@pytest.fixture(scope="module")
def oracles():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        transformers = pytest.importorskip("transformers")
        gpt = pytest.importorskip("megatron.core.datasets.gpt_dataset")
    return transformers, gpt


@pytest.fixture(scope="module")
def world(tmp_path_factory, oracles):
    """The corpus, a random transformers BLOOM and the reference loop's per-step losses."""
    transformers, _ = oracles
    root = tmp_path_factory.mktemp("reference_run")
    rng = np.random.default_rng(7)
    (root / "corpus").mkdir()
    with IndexedDatasetWriter(root / "corpus" / "toy", np.uint16) as writer:
        for _ in range(400):  # ramps a model can learn, ended by EOD (id 1)
            start, stride = int(rng.integers(2, 200)), int(rng.integers(1, 4))
            length = int(rng.integers(10, 90))
            writer.add_document(np.append((start + stride * np.arange(length)) % 200 + 2, 1))
    config = transformers.BloomConfig(vocab_size=VOCAB, hidden_size=64, n_layer=2, n_head=4,
                                      hidden_dropout=0.0, attention_dropout=0.0,
                                      bos_token_id=None, eos_token_id=1, pad_token_id=None)
    torch.manual_seed(3)
    transformers.BloomForCausalLM(config).save_pretrained(root / "hf")
    samples = _megatron_samples(oracles[1], root / "corpus" / "toy", STEPS * GLOBAL)
    reference = reference_losses(transformers, root / "hf", samples, STEPS)
    return root, samples, reference


class _Tokenizer:  # what GPTDatasetConfig needs of a tokenizer
    eod, pad, vocab_size = 1, 0, VOCAB
    unique_identifiers = {"name": "reference-run"}


def _megatron_samples(gpt, prefix: Path, count: int) -> torch.Tensor:
    """The first ``count`` train samples ([count, L + 1]) as megatron-core's builder orders
    them for the run's split and seed."""
    import torch.distributed as dist
    from megatron.core.datasets.blended_megatron_dataset_builder import (
        BlendedMegatronDatasetBuilder,
    )

    with socket.socket() as sock:  # the builder asks torch.distributed for the rank
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0,
                            world_size=1)
    try:
        config = gpt.GPTDatasetConfig(
            random_seed=1234, sequence_length=SEQ, split="98,2,0", blend=([str(prefix)], None),
            path_to_cache=str(prefix.parent / "mcore_cache"), tokenizer=_Tokenizer(),
            reset_position_ids=False, reset_attention_mask=False, eod_mask_loss=False)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            train = BlendedMegatronDatasetBuilder(gpt.GPTDataset, [count, None, None],
                                                  lambda: True, config).build()[0]
            rows = [train[i] for i in range(count)]
    finally:
        dist.destroy_process_group()
    # GPTDataset hands out tokens (L) and labels (shifted by one): rebuild the L + 1 window
    return torch.stack([torch.cat([torch.as_tensor(r["tokens"]), torch.as_tensor(r["labels"])[-1:]])
                        for r in rows]).long()


def _learning_rate(consumed: int, total: int) -> float:
    """Linear warmup over WARMUP samples, then cosine to MIN_LR at the end of the run."""
    if consumed < WARMUP:
        return LR * consumed / WARMUP
    ratio = min((consumed - WARMUP) / (total - WARMUP), 1.0)
    return MIN_LR + (LR - MIN_LR) * 0.5 * (1.0 + math.cos(math.pi * ratio))


def reference_losses(transformers, hf_dir: Path, samples: torch.Tensor,
                     steps: int) -> list[float]:
    """Per-step losses of ``steps`` steps of the plain loop over ``samples`` (the whole run:
    the schedule ends at its last sample), from the weights in ``hf_dir``."""
    torch.manual_seed(0)
    model = transformers.BloomForCausalLM.from_pretrained(hf_dir, dtype=torch.float32)
    model.train()
    params = list(model.parameters())  # the tied head is the embedding: counted once
    optimizer = torch.optim.AdamW(
        [{"params": [p for p in params if p.ndim >= 2], "weight_decay": DECAY},
         {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}],
        lr=LR, betas=BETAS, eps=EPS)
    total = len(samples)
    losses = []
    for step in range(steps):
        consumed = step * GLOBAL
        for group in optimizer.param_groups:
            group["lr"] = _learning_rate(consumed, total)
        batch = samples[consumed:consumed + GLOBAL]
        step_loss = 0.0
        for micro in batch.split(MICRO):
            logits = model(input_ids=micro[:, :-1]).logits
            loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1),
                                                     micro[:, 1:].flatten())
            (loss / (GLOBAL // MICRO)).backward()
            step_loss += loss.item() / (GLOBAL // MICRO)
        torch.nn.utils.clip_grad_norm_(params, CLIP)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(step_loss)
    return losses


def _pretrain(root: Path, run: str, *extra: str, nproc: int = 0) -> list[dict]:
    launch = ["--nproc", str(nproc)] if nproc else []
    done = subprocess.run([str(BIN / "trainer"), "pretrain", *launch, *RECIPE,
                           f"data.corpus={root / 'corpus'}", f"train.run_dir={root / run}",
                           *extra], capture_output=True, text=True, timeout=600, cwd=root)
    assert done.returncode == 0, done.stdout + done.stderr
    records = [json.loads(line) for line in (root / run / "metrics.jsonl").open()]
    return [r for r in records if r["kind"] == "train"]


def _compare(records: list[dict], reference: list[float], first_step: int = 1) -> None:
    steps = [r["step"] for r in records]
    assert steps == list(range(first_step, first_step + len(reference)))
    table = [(r["step"], r["loss"], ref, abs(r["loss"] - ref) / abs(ref))
             for r, ref in zip(records, reference, strict=True)]
    print("\nstep  ours        reference   relative difference")
    for step, ours, ref, rel in table:
        print(f"{step:4d}  {ours:.8f}  {ref:.8f}  {rel:.2e}")
    worst = max(table, key=lambda row: row[3])
    assert worst[3] < TOLERANCE, f"step {worst[0]}: {worst[1]} vs {worst[2]}"


def test_samples_are_megatron_cores(world):
    """Catches: a reference fed other samples than megatron-core's order (the comparison
    below would then prove nothing): its first sample is the first of our own index."""
    from bloomline.trainer.data import open_splits

    root, samples, _ = world
    train = open_splits(str(root / "corpus"), SEQ, STEPS * GLOBAL, None, "98,2,0", 1234, {},
                        "")["train"]
    ours = torch.stack([torch.as_tensor(np.asarray(train[i]), dtype=torch.long)
                        for i in range(len(samples))])
    assert torch.equal(ours, samples)


def test_one_process_matches_the_reference_loop(world):
    """Catches: anything in a run that the recipe does not say: an optimizer step that did
    not happen (DCP's initialization step recorded as Adam's first), a schedule off by one
    step, decayed norms, clipping after the step, weights not taken from init_from, samples
    out of Megatron's order."""
    root, _, reference = world
    records = _pretrain(root, "one", f"checkpoint.init_from={root / 'hf'}")
    _compare(records, reference)


@pytest.mark.parametrize("layout", [
    ("parallel.data_parallel=2",), ("parallel.tensor_parallel=2",),
    # ZeRO-1 on the buffers engine (the distributed optimizer)
    ("parallel.data_parallel=2", "parallel.zero_stage=1")], ids=" ".join)
def test_two_process_layouts_match_the_reference_loop(world, layout):
    """Catches: a layout that changes what is computed (dp gradients not averaged, tp shards
    of the imported weights misplaced, the vocabulary padded differently), against the same
    independent loop and tolerance as one process."""
    root, _, reference = world
    name = "_".join(setting.split("=")[0].split(".")[1] for setting in layout)
    records = _pretrain(root, name, f"checkpoint.init_from={root / 'hf'}", *layout, nproc=2)
    _compare(records, reference)


def test_a_tp2_checkpoint_continues_in_one_process(world):
    """Catches: a tp2 checkpoint that does not reshard into one process exactly (optimizer
    moments, step counters, consumed samples, the schedule): its steps 21-40 must be the
    reference's."""
    root, _, reference = world
    checkpoint = root / "tensor_parallel" / "checkpoints" / "step_00000020"
    if not checkpoint.is_dir():
        pytest.skip("needs the tp2 run of test_two_process_layouts_match_the_reference_loop")
    records = _pretrain(root, "resumed", f"checkpoint.init_from={root / 'hf'}",
                        f"checkpoint.resume={checkpoint}")
    _compare(records, reference[20:], first_step=21)


def test_init_from_a_tp2_bloomline_checkpoint(world, oracles):
    """Catches: ``init_from`` a bloomline checkpoint of another layout that takes more than
    the weights (optimizer moments, step, sample position) or misplaces a shard: from the tp2
    run's step-20 weights, a fresh optimizer at step 0 and sample 0 must give the reference
    loop started from the same weights (exported to transformers)."""
    root, samples, _ = world
    checkpoint = root / "tensor_parallel" / "checkpoints" / "step_00000020"
    if not checkpoint.is_dir():
        pytest.skip("needs the tp2 run of test_two_process_layouts_match_the_reference_loop")
    done = subprocess.run([str(BIN / "trainer"), "export-hf", str(checkpoint),
                           str(root / "hf20")], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    steps = 10
    reference = reference_losses(oracles[0], root / "hf20", samples[:steps * GLOBAL], steps)
    records = _pretrain(root, "from_tp2", f"checkpoint.init_from={checkpoint}",
                        f"train.train_samples={steps * GLOBAL}", "checkpoint.interval=0")
    # the schedule of a 10-step run: the reference's is computed over its samples too
    _compare(records, reference)
