"""Bad input from the command line: one line naming file and line, exit 1, nothing left."""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from bloomline.common import UserError
from bloomline.dataprep import IndexedDataset, IndexedDatasetWriter
from bloomline.dataprep.tokenize_corpus import tokenize_corpus

pytestmark = pytest.mark.slow


def _assert_clean_failure(result, message, out_dir):
    assert result.returncode == 1, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert message in lines[0], lines[0]
    assert "Traceback" not in result.stderr
    # nothing half-written: no output pair, no hidden scratch or temporary files
    if out_dir.exists():
        assert [p.name for p in out_dir.iterdir()] == []


BAD_LINES = {
    "malformed JSON": (b'{"text": "ok"}\n{"text": "ok"}\n{"text": broken\n',
                       "bad.jsonl:3: malformed JSON"),
    "missing key": (b'{"text": "ok"}\n{"body": "no text key"}\n',
                    "bad.jsonl:2: missing key 'text' (keys present: 'body')"),
    "non-string value": (b'{"text": ["a", "list"]}\n', "bad.jsonl:1: key 'text' is list"),
    "null value": (b'{"text": "ok"}\n{"text": null}\n', "bad.jsonl:2: key 'text' is null"),
    "undecodable bytes": (b'{"text": "ok"}\n{"text": "caf\xe9"}\n',
                          "bad.jsonl:2: not valid UTF-8"),
    "lone surrogate": (b'{"text": "a\\ud800b"}\n', "bad.jsonl:1: key 'text' holds an unpaired"),
    "not an object": (b'["a list line"]\n', "bad.jsonl:1: expected a JSON object, got list"),
}


@pytest.mark.parametrize("case", list(BAD_LINES))
def test_bad_line_is_named_with_file_and_line(tmp_path, tiny_tokenizer, cli, case):
    """Catches: a traceback or an error without file:line for each kind of bad line, and
    partial outputs left behind by the failed run."""
    content, message = BAD_LINES[case]
    (tmp_path / "bad.jsonl").write_bytes(content)
    result = cli("tokenize", tmp_path / "bad.jsonl", "--tokenizer", tiny_tokenizer,
                 "--output", tmp_path / "out" / "c", "--workers", "2")
    _assert_clean_failure(result, message, tmp_path / "out")


def test_bad_line_deep_in_a_big_file_gets_its_true_line_number(tmp_path, tiny_tokenizer, cli):
    """Catches: line numbers counted from the start of a chunk instead of the file."""
    good = b'{"text": "a fine line of text"}\n' * 5000
    (tmp_path / "big.jsonl.zst").write_bytes(
        __import__("zstandard").ZstdCompressor().compress(good + b"{oops\n" + good))
    result = cli("tokenize", tmp_path / "big.jsonl.zst", "--tokenizer", tiny_tokenizer,
                 "--output", tmp_path / "out" / "c", "--chunk-mb", "0.01")
    _assert_clean_failure(result, "big.jsonl.zst:5001: malformed JSON", tmp_path / "out")


def _save_dataset_dict(path):
    import datasets

    datasets.disable_progress_bars()
    split = datasets.Dataset.from_dict({"text": ["a"]})
    datasets.DatasetDict({"train": split}).save_to_disk(str(path))


@pytest.mark.parametrize(("make_input", "message"), [
    (lambda d: str(d / "missing.jsonl"), "missing.jsonl: no such file or directory"),
    (lambda d: str(d / "*.parquet"), "*.parquet: glob matches no file"),
    (lambda d: (d / "empty").mkdir() or str(d / "empty"), "empty: directory holds no supported"),
    (lambda d: (d / "x.csv").write_text("a") and str(d / "x.csv"), "x.csv: unsupported input"),
    (lambda d: (d / "t.parquet").write_bytes(b"not parquet") and str(d / "t.parquet"),
     "t.parquet: not a readable Parquet file"),
    (lambda d: (d / "t.jsonl.zst").write_bytes(b"not zstd at all") and str(d / "t.jsonl.zst"),
     "t.jsonl.zst: cannot decompress"),
    (lambda d: (d / "t.jsonl.gz").write_bytes(b"\x1f\x8b broken") and str(d / "t.jsonl.gz"),
     "t.jsonl.gz: cannot decompress"),
    (lambda d: _save_dataset_dict(d / "dd") or str(d / "dd"),
     "dd: a Hugging Face DatasetDict; pass one split folder instead, e.g. "),
])
def test_bad_input_paths(tmp_path, tiny_tokenizer, cli, make_input, message):
    """Catches: inputs that match nothing or cannot be read failing with a traceback or,
    worse, producing an empty corpus."""
    result = cli("tokenize", make_input(tmp_path), "--tokenizer", tiny_tokenizer,
                 "--output", tmp_path / "out" / "c")
    _assert_clean_failure(result, message, tmp_path / "out")


def test_parquet_without_the_column(tmp_path, tiny_tokenizer, cli):
    """Catches: a KeyError from arrow instead of naming the column and the choices."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"content": ["x"]}), tmp_path / "p.parquet")
    result = cli("tokenize", tmp_path / "p.parquet", "--tokenizer", tiny_tokenizer,
                 "--output", tmp_path / "out" / "c")
    _assert_clean_failure(result, "p.parquet: no column 'text' (columns: content)",
                          tmp_path / "out")


@pytest.mark.parametrize(("model", "message"), [
    ("absent.model", "absent.model: tokenizer not found"),
    ("garbage.model", "garbage.model: not a readable SentencePiece model"),
])
def test_unreadable_tokenizer(tmp_path, cli, model, message):
    """Catches: a C++ abort or traceback from SentencePiece on a bad model path."""
    (tmp_path / "garbage.model").write_bytes(b"\x00garbage")
    (tmp_path / "in.jsonl").write_text('{"text": "x"}\n')
    result = cli("tokenize", tmp_path / "in.jsonl", "--tokenizer", tmp_path / model,
                 "--output", tmp_path / "out" / "c")
    _assert_clean_failure(result, message, tmp_path / "out")


def test_existing_output_needs_overwrite(tmp_path, tiny_tokenizer, cli):
    """Catches: overwriting a user's token files without --overwrite."""
    (tmp_path / "in.jsonl").write_text('{"text": "hello"}\n')
    args = ["tokenize", tmp_path / "in.jsonl", "--tokenizer", tiny_tokenizer,
            "--output", tmp_path / "c", "--quiet"]
    assert cli(*args).returncode == 0
    before = (tmp_path / "c.idx").read_bytes()
    result = cli(*args)
    assert result.returncode == 1 and "c.bin: output exists; pass --overwrite" in result.stderr
    assert (tmp_path / "c.idx").read_bytes() == before
    assert cli(*args, "--overwrite").returncode == 0


def test_skip_bad_lines_reports_counts(tmp_path, tiny_tokenizer, cli):
    """Catches: --skip-bad-lines not counting what it skipped in the summary."""
    (tmp_path / "in.jsonl").write_bytes(b'{"text": "ok"}\n{bad\n{"text": "fine"}\n')
    result = cli("tokenize", tmp_path / "in.jsonl", "--tokenizer", tiny_tokenizer,
                 "--output", tmp_path / "c", "--skip-bad-lines")
    assert result.returncode == 0, result.stderr
    assert "2 documents" in result.stdout and "1 skipped lines" in result.stdout
    assert "skipped: " in result.stderr and "in.jsonl:2: malformed JSON" in result.stderr


def _start_big_run(tmp_path, tiny_tokenizer):
    line = b'{"text": "' + b"many words of ordinary text " * 40 + b'"}\n'
    (tmp_path / "big.jsonl").write_bytes(line * 30000)  # ~34 MB: seconds of work
    out = tmp_path / "out"
    out.mkdir()
    proc = subprocess.Popen(
        [sys.executable, "-m", "bloomline.dataprep.cli", "tokenize", str(tmp_path / "big.jsonl"),
         "--tokenizer", str(tiny_tokenizer), "--output", str(out / "c"), "--workers", "2",
         "--chunk-mb", "0.25"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
        # a terminal's Ctrl-C reaches a process whose SIGINT is the default; a test runner
        # started in the background of a shell has it ignored, and that would be inherited
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    # Wait (by polling the file system, not by sleeping a guessed time) until workers have
    # written shards, i.e. the run is in the middle of its work.
    while proc.poll() is None and not list(out.glob(".c.*.partial/chunk*.idx")):
        os.sched_yield()
    assert proc.poll() is None, "the run finished before it could be interrupted"
    return proc, out


def test_kill_9_leaves_no_index_that_looks_complete(tmp_path, tiny_tokenizer):
    """Catches: an .idx written before the .bin is complete, which a reader would trust."""
    proc, out = _start_big_run(tmp_path, tiny_tokenizer)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not (out / "c.idx").exists() and not (out / "c.bin").exists()
    assert all(p.name.startswith(".") for p in out.iterdir())  # only hidden .partial litter
    with pytest.raises(UserError):
        IndexedDataset(out / "c")


def test_ctrl_c_stops_cleanly_and_removes_partial_files(tmp_path, tiny_tokenizer):
    """Catches: Ctrl-C leaving scratch shards behind or a traceback per worker."""
    proc, out = _start_big_run(tmp_path, tiny_tokenizer)
    os.killpg(proc.pid, signal.SIGINT)  # what a terminal sends to the whole process group
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr
    assert b"Traceback" not in stderr
    assert list(out.iterdir()) == []


def test_an_interrupt_between_chunks_stops_the_workers_before_cleanup(tmp_path, tiny_tokenizer,
                                                                     monkeypatch):
    """Catches: Ctrl-C landing while the main process splices a finished chunk (not while it
    waits on the workers) leaving the pool running: the scratch folder was removed under the
    workers, and a shard finished later recreated it (CI saw a ``.c.*.partial`` left behind).
    Deterministic: the interrupt is raised at the first splice, with more chunks in flight."""
    def interrupted(self, prefix):
        raise KeyboardInterrupt
    monkeypatch.setattr(IndexedDatasetWriter, "add_index", interrupted)  # main process only
    (tmp_path / "in.jsonl").write_bytes(b'{"text": "a few words"}\n' * 20000)  # ~0.5 MB
    out = tmp_path / "out"
    with pytest.raises(KeyboardInterrupt):
        tokenize_corpus([str(tmp_path / "in.jsonl")], str(tiny_tokenizer), str(out / "c"),
                        workers=2, max_chunk_bytes=16 << 10, show_progress=False)
    assert multiprocessing.active_children() == []  # the pool was shut down before cleanup
    assert list(out.iterdir()) == []


def test_output_that_is_a_folder(tmp_path, tiny_tokenizer, cli):
    """Catches: `--output corpus/` writing hidden files named `corpus/.bin`."""
    (tmp_path / "in.jsonl").write_text('{"text": "x"}\n')
    result = cli("tokenize", tmp_path / "in.jsonl", "--tokenizer", tiny_tokenizer,
                 "--output", f"{tmp_path}/")
    assert result.returncode == 1 and "a folder; give a file prefix" in result.stderr


def test_unwritable_output_is_one_line(tmp_path, tiny_tokenizer, cli):
    """Catches: a PermissionError traceback when the output folder cannot be created."""
    (tmp_path / "in.jsonl").write_text('{"text": "x"}\n')
    (tmp_path / "file").write_text("a file, not a folder")
    result = cli("tokenize", tmp_path / "in.jsonl", "--tokenizer", tiny_tokenizer,
                 "--output", tmp_path / "file" / "sub" / "c")
    _assert_clean_failure(result, "file/sub: Not a directory", tmp_path / "nothing")


def test_a_worker_killed_by_the_system_is_one_line(tmp_path, tiny_tokenizer):
    """Catches: an OOM-killed worker surfacing as a BrokenProcessPool traceback, or its
    run leaving partial files."""
    proc, out = _start_big_run(tmp_path, tiny_tokenizer)
    children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
    workers = [int(pid) for pid in children
               if b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes()]
    assert workers, children
    os.kill(workers[0], signal.SIGKILL)  # what the kernel's OOM killer does
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 1, stderr
    assert stderr.decode().strip().splitlines()[-1].startswith(
        "error: tokenize: a worker process died")
    assert b"Traceback" not in stderr
    assert list(out.iterdir()) == []


SCRIPT = """\
import sys
from bloomline.dataprep import tokenize_corpus

def main():
    tokenize_corpus([sys.argv[1]], sys.argv[2], sys.argv[3], workers=2, show_progress=False)
    print("tokenized")

{call}
"""


@pytest.mark.parametrize("guarded", [False, True])
def test_a_script_without_the_main_guard_is_told_so(tmp_path, tiny_tokenizer, guarded):
    """Catches: a script that calls tokenize_corpus at top level (the spawn workers import it
    again) told that "a worker process died ... out of memory", after each worker printed a
    page of multiprocessing's traceback; and the check firing on a script that has the guard."""
    source = tmp_path / "in.jsonl"
    source.write_text("".join(f'{{"text": "document {i}"}}\n' for i in range(50)))
    call = 'if __name__ == "__main__":\n    main()' if guarded else "main()"
    script = tmp_path / "prepare.py"
    script.write_text(SCRIPT.format(call=call))
    out = tmp_path / "out"
    result = subprocess.run([sys.executable, script, source, tiny_tokenizer, out / "c"],
                            capture_output=True, text=True, timeout=120, cwd=tmp_path)
    if guarded:
        assert result.returncode == 0 and "tokenized" in result.stdout, result.stderr
        return
    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("bloomline.common.errors.UserError: tokenize: the worker processes "
                           f"ran {script} again") and 'if __name__ == "__main__":' in last, last
    assert "out of memory" not in result.stderr and "bootstrapping" not in result.stderr
    assert result.stderr.count("Traceback") == 1  # the script's own, not one per worker
    assert list(out.iterdir()) == []
