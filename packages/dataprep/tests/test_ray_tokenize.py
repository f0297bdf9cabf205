"""``dataprep tokenize --ray``: the chunks as Ray tasks on a real Ray cluster of two nodes.

The cluster is a head and a worker node started on this machine by ``ray start`` on two
loopback addresses (127.0.0.2 and 127.0.0.3, one core each), so tasks run on both nodes and
nothing leaves the machine. The jobs are the real command line in a fresh interpreter; the
reference is the same command without ``--ray``. Every Ray process of the tests gets the same
explicit token authentication (``RAY_AUTH_MODE=token`` and a token of the test's own), so
that nothing depends on, or writes, a token in the user's ``~/.ray``.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

pytest.importorskip("ray")

HEAD, WORKER = "127.0.0.2", "127.0.0.3"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# the environment of every Ray process and every dataprep job of this module
ENV = dict(os.environ, PYTHONWARNINGS="ignore", RAY_USAGE_STATS_ENABLED="0",
           RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=secrets.token_hex(32))


def _ray(*args: str, env: dict) -> None:
    ray = Path(sys.executable).parent / "ray"
    done = subprocess.run([str(ray), *args], capture_output=True, text=True, timeout=120,
                          env=env)
    assert done.returncode == 0, f"ray {' '.join(args)}:\n{done.stdout}\n{done.stderr}"


@pytest.fixture(scope="module")
def ray_cluster():
    """The address of a running 2-node Ray cluster (head + worker, one core each)."""
    # Ray's unix sockets live under the temp dir: keep its path short (108-byte limit).
    temp = tempfile.mkdtemp(prefix="ray", dir="/tmp")
    port = _free_port()
    try:
        _ray("start", "--head", "--node-ip-address", HEAD, "--port", str(port),
             "--num-cpus", "1", "--include-dashboard=false", "--disable-usage-stats",
             "--temp-dir", temp, env=ENV)
        _ray("start", "--address", f"{HEAD}:{port}", "--node-ip-address", WORKER,
             "--num-cpus", "1", env=ENV)
        yield f"{HEAD}:{port}"
    finally:
        subprocess.run([str(Path(sys.executable).parent / "ray"), "stop", "--force"],
                       capture_output=True, timeout=120, env=ENV)
        shutil.rmtree(temp, ignore_errors=True)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """~400 KB of JSON lines: about 20 chunks of 20 KB, so that both nodes get several."""
    folder = tmp_path_factory.mktemp("ray_corpus")
    words = "the quick brown fox jumps over a lazy dog while memory maps tokens".split()
    with open(folder / "docs.jsonl", "w") as fh:
        for i in range(2000):
            text = " ".join(words[(i * 7 + j) % len(words)] for j in range(20 + i % 50))
            fh.write(json.dumps({"text": f"{i}: {text}"}) + "\n")
    return folder / "docs.jsonl"


def _dataprep(*args: str, env: dict = ENV) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bloomline.dataprep.cli", *args],
                          capture_output=True, text=True, env=env, timeout=300)


def _tokenize(corpus: Path, tokenizer: Path, output: Path, *extra: str, env: dict = ENV
              ) -> subprocess.CompletedProcess:
    return _dataprep("tokenize", str(corpus), "--tokenizer", str(tokenizer), "--output",
                     str(output), "--chunk-mb", "0.02", "--quiet", *extra, env=env)


@pytest.fixture(scope="module")
def reference(corpus, tiny_tokenizer, tmp_path_factory) -> Path:
    output = tmp_path_factory.mktemp("ray_reference") / "docs"
    done = _tokenize(corpus, tiny_tokenizer, output, "--workers", "1")
    assert done.returncode == 0, done.stderr
    return output


def _assert_same_bytes(got: Path, want: Path) -> None:
    for suffix in (".bin", ".idx"):
        assert Path(f"{got}{suffix}").read_bytes() == Path(f"{want}{suffix}").read_bytes(), suffix


def test_ray_cluster_writes_the_bytes_of_the_local_run(ray_cluster, corpus, tiny_tokenizer,
                                                       reference, tmp_path):
    """Bug: chunks spliced in completion order instead of chunk order (tasks on two nodes
    finish out of order), a chunk lost or repeated, or the scratch folder left behind: the
    output on a 2-node cluster must be byte-identical to the local run's."""
    output = tmp_path / "docs"
    done = _tokenize(corpus, tiny_tokenizer, output, "--ray", ray_cluster)
    assert done.returncode == 0, done.stderr
    assert "2,000 documents" in done.stdout
    _assert_same_bytes(output, reference)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "docs.bin", "docs.fingerprint.json", "docs.idx"]


def test_a_killed_worker_is_retried_and_the_output_is_unchanged(ray_cluster, corpus,
                                                                tiny_tokenizer, reference,
                                                                tmp_path):
    """Bug: a task whose worker process is SIGKILLed mid-run is not retried (the job fails or
    hangs), or its retry cannot replace the shard the dead attempt started (it exists): the
    worker running chunk 3 kills itself on the first attempt, and the output must still equal
    the local run's."""
    fired = tmp_path / "fired"
    env = dict(ENV, BLOOMLINE_FAULTS=f"kill@chunk:chunk=3:once={fired}")
    output = tmp_path / "out" / "docs"
    output.parent.mkdir()
    done = _tokenize(corpus, tiny_tokenizer, output, "--ray", ray_cluster, env=env)
    assert fired.exists(), "the fault did not fire: the test proves nothing"
    assert done.returncode == 0, done.stderr
    _assert_same_bytes(output, reference)


def test_a_bad_line_gives_the_local_one_line_error(ray_cluster, corpus, tiny_tokenizer,
                                                   tmp_path):
    """Bug: a task's bad-input error reaches the user as a Ray traceback (RayTaskError), is
    retried as if the worker had died, or leaves a half-written output: a malformed line deep
    in the file must give the same one-line FILE:LINE error as the local run, exit 1, and
    leave nothing."""
    lines = corpus.read_text().splitlines(keepends=True)
    lines[1500] = '{"text": "unterminated\n'
    bad = tmp_path / "bad.jsonl"
    bad.write_text("".join(lines))
    local = _tokenize(bad, tiny_tokenizer, tmp_path / "local" / "docs", "--workers", "1")
    on_ray = _tokenize(bad, tiny_tokenizer, tmp_path / "ray" / "docs", "--ray", ray_cluster)
    assert local.returncode == on_ray.returncode == 1, on_ray.stderr
    message = f"error: {bad}:1501: malformed JSON"
    assert local.stderr.strip().splitlines()[-1].startswith(message), local.stderr
    assert on_ray.stderr.strip().splitlines()[-1] == local.stderr.strip().splitlines()[-1]
    assert "Traceback" not in on_ray.stderr
    assert not (tmp_path / "ray").exists() or not any((tmp_path / "ray").iterdir())


def test_ray_without_address_starts_a_local_instance(corpus, tiny_tokenizer, reference,
                                                     tmp_path):
    """Bug: a bare ``--ray`` swallows the next argument as an address or needs a running
    cluster: with no address it must start a Ray instance of its own (2 cores) and write the
    local run's bytes."""
    output = tmp_path / "docs"
    done = _dataprep("tokenize", "--ray", str(corpus), "--tokenizer", str(tiny_tokenizer),
                     "--output", str(output), "--chunk-mb", "0.02", "--quiet", "--workers", "2")
    assert done.returncode == 0, done.stderr
    _assert_same_bytes(output, reference)
