"""Fixtures shared by every test folder: a tiny trained tokenizer, a CLI runner, and the
figures a plot draws."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

# Compiled kernels (the CPU GELU, the loss) taken from torch inductor's on-disk FX-graph and
# AOT-autograd caches now and then compute a first step's loss differently in the last bits
# from a fresh compilation (measured: 5.1884713 instead of 5.1884651, 1 process in 5 to 10
# with a shared cache, never in 20 with these caches off or with a cache of its own), and
# the tests compare losses bitwise across processes (resume, restarts, CLI against
# in-process). So every test process, and every process it starts (they inherit the
# environment), compiles afresh; the compiled C++ itself, cached by its source, is still reused.
os.environ.setdefault("TORCHINDUCTOR_FX_GRAPH_CACHE", "0")
os.environ.setdefault("TORCHINDUCTOR_AUTOGRAD_CACHE", "0")

# Texts that stress the tokenizer's Unicode handling: Cyrillic, CJK, emoji (with a ZWJ
# sequence and a skin tone), combining marks (decomposed é, Vietnamese stacks), RTL text.
UNICODE_TEXTS = [
    "Привет, мир! Съешь же ещё этих мягких французских булок.",
    "東京は日本の首都です。我们在学习中文。한국어도 있습니다.",
    "Emoji: 👩‍💻 👍🏽 🇺🇸 and 🧑‍🤝‍🧑 in a sentence.",
    "Combining: e\u0301 a\u0300 o\u0302\u0323 Tiê\u0301ng Viê\u0323t, "
    "Z\u0336a\u0336l\u0336g\u0336o.",
    "Mixed RTL: שלום עולם and مرحبا بالعالم, tabs\tand  double  spaces.",
]


def _training_lines() -> list[str]:
    base = [
        "The quick brown fox jumps over the lazy dog.",
        "Return the number of items in the container.",
        "def tokenize(text): return text.split()",
        "Memory-mapped token files in Megatron's format.",
    ]
    return [f"{line} {i}" for i in range(200) for line in base] + UNICODE_TEXTS * 20


@pytest.fixture(scope="session")
def tiny_tokenizer(tmp_path_factory) -> Path:
    """A 512-piece BPE SentencePiece model trained on a few hundred lines (~1 s)."""
    from bloomline.dataprep.tokenizer import train_tokenizer

    folder = tmp_path_factory.mktemp("tokenizer")
    corpus = folder / "train.jsonl"
    corpus.write_text("".join(json.dumps({"text": t}) + "\n" for t in _training_lines()),
                      encoding="utf-8")
    return train_tokenizer([str(corpus)], folder / "tiny", vocab_size=512, num_threads=1)


def run_cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """Run ``dataprep ARGS`` in a fresh interpreter, as a user would, capturing output."""
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    return subprocess.run([sys.executable, "-m", "bloomline.dataprep.cli", *map(str, args)],
                          capture_output=True, text=True, cwd=cwd, env=env, timeout=300)


@pytest.fixture
def cli():
    """The :func:`run_cli` helper as a fixture."""
    return run_cli


# -- tokenizers of the other kinds, built offline ---------------------------------------------
@pytest.fixture(scope="session")
def tiny_byte_bpe(tmp_path_factory) -> Path:
    """A 512-entry BLOOM-style byte-level BPE (``train-tokenizer --kind byte-bpe``): a folder
    with tokenizer.json and tokenizer_config.json."""
    from bloomline.dataprep.tokenizer import train_tokenizer

    folder = tmp_path_factory.mktemp("byte_bpe")
    corpus = folder / "train.jsonl"
    corpus.write_text("".join(json.dumps({"text": t}) + "\n" for t in _training_lines()),
                      encoding="utf-8")
    return train_tokenizer([str(corpus)], folder / "tok", vocab_size=512, kind="byte-bpe")


BLOOM_SPLIT = " ?[^(\\s|[.,!?…。，、।۔،])]+"  # BLOOM's tokenizer.json pre-tokenizer regex


@pytest.fixture(scope="session")
def bloom_like_tokenizer(tmp_path_factory) -> Path:
    """A tokenizer.json laid out like BLOOM's (its pre-tokenizer split, byte-level BPE, the
    special tokens <unk> <s> </s> <pad> at 0-3) with 65,796 entries, so that ids pass 65,535 as
    BLOOM's 250,680 do: every pair of byte-level characters is one merge."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors

    specials = ["<unk>", "<s>", "</s>", "<pad>"]
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {token: i for i, token in enumerate(specials + alphabet)}
    merges = [(a, b) for a in alphabet for b in alphabet]
    for a, b in merges:
        vocab[a + b] = len(vocab)
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(BLOOM_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)])
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    tokenizer.add_special_tokens(specials)
    path = tmp_path_factory.mktemp("bloom_like") / "tokenizer.json"
    tokenizer.save(str(path))
    return path


def tiktoken_ranks(words: list[str]) -> dict[bytes, int]:
    """tiktoken ranks: the 256 bytes, then every prefix of each word (so BPE can reach it)."""
    ranks = {bytes([b]): b for b in range(256)}
    for word in words:
        raw = word.encode("utf-8")
        for end in range(2, len(raw) + 1):
            ranks.setdefault(raw[:end], len(ranks))
    return ranks


def write_tiktoken_file(path: Path, ranks: dict[bytes, int]) -> Path:
    """tiktoken's ranks format: one ``base64(token) rank`` line per token."""
    import base64

    path.write_bytes(b"".join(base64.b64encode(token) + b" %d\n" % rank
                              for token, rank in sorted(ranks.items(), key=lambda kv: kv[1])))
    return path


@pytest.fixture(scope="session")
def tiny_tiktoken(tmp_path_factory) -> Path:
    """A small ``r50k_base.tiktoken``: its own ranks, r50k_base's split pattern and
    ``<|endoftext|>`` (id 50256, so the vocabulary is 50,257 with a gap)."""
    words = sorted({w for line in _training_lines() for w in line.split()})
    ranks = tiktoken_ranks([f" {w}" for w in words] + words)
    return write_tiktoken_file(tmp_path_factory.mktemp("tiktoken") / "r50k_base.tiktoken", ranks)


@contextlib.contextmanager
def held_elsewhere(output, pid: int = 4242):
    """The output lock of ``output`` (``bloomline.common.output_lock``) as another writer
    holds it: its own descriptor, its pid in the lock file, for tests of the refusal."""
    from bloomline.common.output_lock import lock_path

    path = lock_path(output)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.write(fd, f"{pid}\n".encode())
        yield
    finally:
        os.close(fd)


@pytest.fixture
def drawn_figures(monkeypatch):
    """``record(module)``: the figures ``module`` (one whose plots get matplotlib's Figure
    class from its ``require_matplotlib``) draws from then on, appended to the list it
    returns: tests check the drawn artists rather than pixels."""

    def record(module) -> list:
        figure_class = module.require_matplotlib()
        drawn = []

        class Recorded(figure_class):
            def __init__(self, *args, **kwargs):
                super().__init__(*args, **kwargs)
                drawn.append(self)

        monkeypatch.setattr(module, "require_matplotlib", lambda: Recorded)
        return drawn

    return record
