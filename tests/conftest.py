"""Fixtures shared by the cross-package tests."""

from __future__ import annotations

import socket
import warnings
from types import SimpleNamespace

import pytest


class MegatronTokenizer:
    """What megatron-core's ``GPTDatasetConfig`` needs of a tokenizer (the sample orders do not
    depend on it)."""

    eod, pad, vocab_size = 2, 3, 1000
    unique_identifiers = {"name": "test"}


@pytest.fixture(scope="module")
def megatron():
    """megatron-core's dataset modules (skipped when the optional oracle is not installed) as
    ``.gpt``, ``.builder``, ``.utils``, and ``.tokenizer()`` for its configs; inside a
    one-process gloo group, because its builder asks torch.distributed for the rank."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        gpt = pytest.importorskip("megatron.core.datasets.gpt_dataset")
        builder = pytest.importorskip(
            "megatron.core.datasets.blended_megatron_dataset_builder")
        utils = pytest.importorskip("megatron.core.datasets.utils")
    import torch.distributed as dist

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0,
                            world_size=1)
    yield SimpleNamespace(gpt=gpt, builder=builder, utils=utils, tokenizer=MegatronTokenizer)
    dist.destroy_process_group()
