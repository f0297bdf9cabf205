"""``configs/slurm/tokenize.sbatch`` run for real under a stand-in ``sbatch``: a job array of
``dataprep tokenize --shard K/N`` tasks, then a merge that depends on the whole array, gives
the bytes of one ``dataprep tokenize``; a failed part stops the merge, and submitting again
redoes only the parts that are not complete.

The stand-in (written into ``tmp_path/bin``) does what SLURM would, synchronously: it reads the
script's ``#SBATCH`` header and the command line (refusing options it does not know, as sbatch
does), gives job ids, copies the script to a spool folder and runs it once per array index in
the folder it was submitted from, with the environment of ``--export`` and SLURM's variables,
its output in the ``--output`` file. A job with ``--dependency=afterok:ID`` runs only if every
task of the earlier job ID succeeded; otherwise it is never started (cancelled with
``--kill-on-invalid-dep=yes``, pending forever without). Each submission is a line of
``tmp_path/slurm/submissions.jsonl``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import run_cli

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "configs" / "slurm" / "tokenize.sbatch"

FAKE_SBATCH = r'''
"""Stand-in sbatch: runs the job at once, in this process's folder (see the test module)."""
import json, os, re, shutil, subprocess, sys
from pathlib import Path

STATE = Path(__file__).resolve().parent.parent / "slurm"
VALUED = {"--array", "--cpus-per-task", "--dependency", "--export", "--job-name",
          "--kill-on-invalid-dep", "--nodes", "--ntasks", "--output", "--time"}
FLAGS = {"--parsable"}


def fail(message):
    print(f"sbatch: error: {message}", file=sys.stderr)
    sys.exit(1)


def parse_options(args, options):
    """--name=value, --name value and flags, up to the first argument that is no option."""
    i = 0
    while i < len(args) and args[i].startswith("-"):
        name, eq, value = args[i].partition("=")
        if name in FLAGS and not eq:
            options[name] = True
        elif name in VALUED:
            if not eq:
                i += 1
                value = args[i]
            options[name] = value
        else:
            fail(f"unrecognized option '{args[i]}'")
        i += 1
    return args[i:]


def header_options(script):
    """#SBATCH lines before the first command (sbatch stops reading there)."""
    options = {}
    for line in Path(script).read_text().splitlines()[1:]:
        if line.strip() and not line.startswith("#"):
            break
        if line.startswith("#SBATCH"):
            parse_options(line.split()[1:2], options)
    return options


def array_indices(spec):
    """0-3,7 or 1-7:2, with an optional %limit."""
    indices = []
    for item in spec.split("%")[0].split(","):
        first, _, rest = item.partition("-")
        last, _, step = rest.partition(":")
        indices += range(int(first), int(last or first) + 1, int(step or 1))
    return indices


def new_id():
    path = STATE / "next_id"
    job_id = int(path.read_text()) if path.exists() else 1000
    path.write_text(str(job_id + 1))
    return job_id


def main():
    STATE.mkdir(exist_ok=True)
    given = {}
    rest = parse_options(sys.argv[1:], given)
    if not rest:
        fail("no batch script")
    script, args = rest[0], rest[1:]
    options = {**header_options(script), **given}
    jobs_path = STATE / "jobs.json"
    jobs = json.loads(jobs_path.read_text()) if jobs_path.exists() else {}
    runnable = True
    if "--dependency" in options:
        kind, _, after = options["--dependency"].partition(":")
        if kind != "afterok" or not after:
            fail(f"this stand-in knows only afterok:ID, not {options['--dependency']}")
        for dep in after.split(":"):
            if dep not in jobs:  # an id that was never issued
                fail("Batch job submission failed: Job dependency problem")
            runnable &= all(rc == 0 for rc in jobs[dep]["tasks"].values())
    job_id = new_id()
    name = options.get("--job-name", Path(script).name)
    array = options.get("--array")
    indices = array_indices(array) if array else [None]
    spool = STATE / "spool" / f"job{job_id}"
    spool.mkdir(parents=True)
    copy = spool / "slurm_script"  # slurmd runs a copy, not the file that was submitted
    shutil.copy(script, copy)
    copy.chmod(0o755)
    export = options.get("--export", "ALL").split(",")
    base = ({k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
            if export[0] == "ALL" else {"PATH": os.environ["PATH"]})
    base.update(item.split("=", 1) for item in export if "=" in item)
    tasks = {}
    state = "COMPLETED"
    if not runnable:
        cancel = options.get("--kill-on-invalid-dep") == "yes"
        state = "CANCELLED (DependencyNeverSatisfied)" if cancel else \
            "PENDING (DependencyNeverSatisfied)"
    for position, index in enumerate(indices if runnable else []):
        task_id = job_id if position == 0 else new_id()
        env = dict(base, SLURM_JOB_ID=str(task_id), SLURM_JOB_NAME=name,
                   SLURM_CPUS_PER_TASK=options.get("--cpus-per-task", "1"),
                   SLURM_SUBMIT_DIR=os.getcwd())
        if index is not None:
            env.update(SLURM_ARRAY_JOB_ID=str(job_id), SLURM_ARRAY_TASK_ID=str(index),
                       SLURM_ARRAY_TASK_COUNT=str(len(indices)))
        pattern = options.get("--output", "slurm-%A_%a.out" if array else "slurm-%j.out")
        log = re.sub(r"%[xAaj]", lambda m: {
            "%x": name, "%A": str(job_id), "%j": str(task_id),
            "%a": str(index if index is not None else 4294967294)}[m[0]], pattern)
        with open(log, "w") as out:
            done = subprocess.run([str(copy), *args], env=env, stdout=out,
                                  stderr=subprocess.STDOUT, timeout=120)
        tasks[str(index if index is not None else 0)] = done.returncode
        if done.returncode:
            state = "FAILED"
    jobs[str(job_id)] = {"name": name, "tasks": tasks}
    jobs_path.write_text(json.dumps(jobs))
    record = {"id": job_id, "options": given, "args": args, "tasks": tasks, "state": state}
    with open(STATE / "submissions.jsonl", "a") as log:
        log.write(json.dumps(record) + "\n")
    print(job_id if "--parsable" in options else f"Submitted batch job {job_id}")


main()
'''


def slurm_env(tmp_path: Path, tokenizer: Path) -> dict:
    """The submitter's environment: the stand-in sbatch and dataprep on PATH, no SLURM
    variables (as on a login node), 3 shards of one worker each."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "sbatch").write_text(f"#!{sys.executable}\n{FAKE_SBATCH}")
    (bin_dir / "sbatch").chmod(0o755)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("SLURM_") and k != "BLOOMLINE_TOKENIZE_STAGE"}
    env.update(PATH=os.pathsep.join([str(bin_dir), str(Path(sys.executable).parent),
                                     os.environ["PATH"]]),
               PYTHONWARNINGS="ignore", INPUTS="raw/*.jsonl raw/c_small.jsonl.zst",
               TOKENIZER=str(tokenizer), OUTPUT="corpus/demo", SHARDS="3", WORKERS="1")
    return env


def submit(work: Path, env: dict, *args: str) -> subprocess.CompletedProcess:
    """``bash configs/slurm/tokenize.sbatch ARGS`` in ``work``, as a user runs it."""
    return subprocess.run(["bash", str(SCRIPT), *args], cwd=work, env=env,
                          capture_output=True, text=True, timeout=300)


def submissions(tmp_path: Path) -> list[dict]:
    path = tmp_path / "slurm" / "submissions.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


TOKENIZE_ARGS = ("--json-key", "body")  # extra args; without them every part fails (no "text")
BAD_LINE = 1900  # of b_big.jsonl, in the last part (which starts inside the file)


def _line(i: int) -> str:
    words = ["The quick brown fox", "jumps over the lazy dog", "Привет, мир", "東京 👍🏽"]
    return json.dumps({"body": f"{words[i % 4]} {i} " + "items " * (i % 7)},
                      ensure_ascii=False) + "\n"


def write_corpus(raw: Path, bad: bool = False) -> None:
    """a_small.jsonl, b_big.jsonl (~70% of the bytes), d_small.jsonl and c_small.jsonl.zst,
    given in that order; ``bad``: b_big.jsonl's line 1900 is malformed JSON of the same
    length, so that fixing it keeps every file's size (the parts' cuts depend on sizes)."""
    import zstandard

    raw.mkdir(parents=True, exist_ok=True)
    (raw / "a_small.jsonl").write_text("".join(map(_line, range(250))), encoding="utf-8")
    big = [_line(i) for i in range(3000, 5000)]
    if bad:
        big[BAD_LINE - 1] = big[BAD_LINE - 1].replace('"body": "', '"body": #', 1)
    (raw / "b_big.jsonl").write_text("".join(big), encoding="utf-8")
    (raw / "d_small.jsonl").write_text("".join(map(_line, range(600, 850))), encoding="utf-8")
    text = "".join(map(_line, range(900, 1400))).encode()
    (raw / "c_small.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(text))
    sizes = [(raw / n).stat().st_size for n in ("a_small.jsonl", "b_big.jsonl",
                                                "d_small.jsonl", "c_small.jsonl.zst")]
    # both cuts of 3 parts (at 1/3 and 2/3 of the bytes laid end to end) fall inside b_big,
    # and line 1900 lies after the second: part 2 starts inside b_big and holds the bad line
    assert sizes[0] < sum(sizes) // 3 and 2 * sum(sizes) // 3 < sizes[0] + sizes[1]
    assert sizes[0] + sum(map(len, big[:BAD_LINE - 1])) > 2 * sum(sizes) // 3


@pytest.fixture(scope="module")
def reference(tmp_path_factory, tiny_tokenizer) -> dict[str, bytes]:
    """One ``dataprep tokenize`` of the good corpus: .bin and .idx bytes."""
    work = tmp_path_factory.mktemp("single")
    write_corpus(work / "raw")
    done = run_cli("tokenize", "raw/*.jsonl", "raw/c_small.jsonl.zst", "--tokenizer",
                   tiny_tokenizer, "--output", "ref/demo", "--workers", "1", *TOKENIZE_ARGS,
                   cwd=work)
    assert done.returncode == 0, done.stderr
    return {ext: (work / "ref" / f"demo.{ext}").read_bytes() for ext in ("bin", "idx")}


def _assert_output_is(work: Path, reference: dict[str, bytes]) -> None:
    for ext, want in reference.items():
        assert (work / "corpus" / f"demo.{ext}").read_bytes() == want, ext


def test_three_parts_merge_into_the_single_run_bytes(tmp_path, tiny_tokenizer, reference):
    """Bug: the tasks tokenize the wrong part (the array index not passed as --shard K/N, N
    taken from the array size), drop the extra tokenize args, or the merge takes the parts
    out of order, runs before the array ends (no afterok on the array's id) or leaves the
    parts behind: 3 parts, cut inside a big file, must merge into the bytes of one `dataprep
    tokenize` and the parts folder must be gone."""
    work = tmp_path / "work"
    write_corpus(work / "raw")
    done = submit(work, slurm_env(tmp_path, tiny_tokenizer), *TOKENIZE_ARGS)
    assert done.returncode == 0, done.stderr
    array, merge = submissions(tmp_path)
    assert array["options"]["--array"] == "0-2" and array["tasks"] == {"0": 0, "1": 0, "2": 0}
    assert array["args"] == list(TOKENIZE_ARGS) and merge["args"] == list(TOKENIZE_ARGS)
    assert merge["options"]["--dependency"] == f"afterok:{array['id']}"
    assert merge["state"] == "COMPLETED", (work / f"merge-demo-{merge['id']}.out").read_text()
    assert f"job {array['id']}" in done.stdout and f"job {merge['id']}" in done.stdout
    _assert_output_is(work, reference)
    assert "3 parts on 1 host(s)" in (work / f"merge-demo-{merge['id']}.out").read_text()
    assert not (work / "corpus" / "demo.parts").exists()
    assert sorted(p.name for p in (work / "corpus").iterdir()) == [
        "demo.bin", "demo.fingerprint.json", "demo.idx"]


def test_a_bad_line_stops_the_merge_and_a_resubmission_redoes_only_that_part(
        tmp_path, tiny_tokenizer, reference):
    """Bug: a failed part still lets the merge run (afterany, or no dependency) and write a
    corpus with a hole, the error is not the one-line FILE:LINE (or counts lines from the
    part's start), or submitting again redoes the parts that were complete (or cannot, its
    leftovers refusing --overwrite): the resubmission must run part 2 alone and give the
    single run's bytes."""
    work = tmp_path / "work"
    write_corpus(work / "raw", bad=True)
    env = slurm_env(tmp_path, tiny_tokenizer)
    done = submit(work, env, *TOKENIZE_ARGS)
    assert done.returncode == 0, done.stderr
    array, merge = submissions(tmp_path)
    assert array["tasks"] == {"0": 0, "1": 0, "2": 1}
    log = (work / f"tokenize-demo-{array['id']}_2.out").read_text()
    last = log.strip().splitlines()[-1]
    assert last.startswith("error: ") and f"b_big.jsonl:{BAD_LINE}: malformed JSON" in last, log
    assert "Traceback" not in log
    assert merge["options"]["--dependency"] == f"afterok:{array['id']}"
    assert merge["state"].startswith("CANCELLED") and merge["tasks"] == {}
    assert sorted(p.name for p in (work / "corpus").iterdir()) == ["demo.parts"]

    write_corpus(work / "raw")  # the line fixed
    parts = work / "corpus" / "demo.parts"
    for ext in ("bin", "idx"):  # as if a node died after part 2's .bin/.idx, before its record
        (parts / f"demo-00002-of-00003.{ext}").write_bytes(
            (parts / f"demo-00000-of-00003.{ext}").read_bytes())
    done = submit(work, env, *TOKENIZE_ARGS)
    assert done.returncode == 0, done.stderr
    again, merge = submissions(tmp_path)[2:]
    assert again["options"]["--array"] == "2" and again["tasks"] == {"2": 0}
    assert merge["options"]["--dependency"] == f"afterok:{again['id']}"
    assert merge["state"] == "COMPLETED", (work / f"merge-demo-{merge['id']}.out").read_text()
    _assert_output_is(work, reference)
    assert not (work / "corpus" / "demo.parts").exists()


def test_an_input_that_changed_size_makes_the_resubmission_redo_every_part(
        tmp_path, tiny_tokenizer):
    """Bug: fixing a bad line by deleting it moves every cut (they follow the inputs' sizes),
    yet the resubmission keeps the complete parts of the old cuts: the merge then refuses
    them (or, had they all been complete, merges a stale corpus). It must redo all 3 parts
    and give the bytes of one run of the fixed inputs."""
    work = tmp_path / "work"
    write_corpus(work / "raw", bad=True)
    env = slurm_env(tmp_path, tiny_tokenizer)
    assert submit(work, env, *TOKENIZE_ARGS).returncode == 0
    assert submissions(tmp_path)[0]["tasks"] == {"0": 0, "1": 0, "2": 1}
    big = work / "raw" / "b_big.jsonl"
    lines = big.read_text(encoding="utf-8").splitlines(keepends=True)
    big.write_text("".join(lines[:BAD_LINE - 1] + lines[BAD_LINE:]), encoding="utf-8")

    done = submit(work, env, *TOKENIZE_ARGS)
    assert done.returncode == 0, done.stderr
    assert "redoing every part" in done.stdout
    again, merge = submissions(tmp_path)[2:]
    assert again["options"]["--array"] == "0-2" and again["tasks"] == {"0": 0, "1": 0, "2": 0}
    assert merge["state"] == "COMPLETED", (work / f"merge-demo-{merge['id']}.out").read_text()
    single = run_cli("tokenize", "raw/*.jsonl", "raw/c_small.jsonl.zst", "--tokenizer",
                     tiny_tokenizer, "--output", "single/demo", "--workers", "1",
                     *TOKENIZE_ARGS, cwd=work)
    assert single.returncode == 0, single.stderr
    _assert_output_is(work, {ext: (work / "single" / f"demo.{ext}").read_bytes()
                             for ext in ("bin", "idx")})


def test_files_of_another_job_in_the_parts_folder_are_neither_merged_nor_deleted(
        tmp_path, tiny_tokenizer, reference):
    """Bug: the merge finds its parts by a glob, taking the parts of a 2-shard job left in
    the same folder (here junk that cannot be merged), or the cleanup deletes the whole
    folder (rm -rf PARTS) with files it did not make: the output must be the single run's
    and the other job's files must stay."""
    work = tmp_path / "work"
    write_corpus(work / "raw")
    parts = work / "corpus" / "demo.parts"
    parts.mkdir(parents=True)
    others = ["demo-00000-of-00002.bin", "demo-00000-of-00002.idx",
              "demo-00000-of-00002.shard.json", "demo-of-00002.plan", "notes.txt"]
    for name in others:
        (parts / name).write_text("not this job's\n")
    done = submit(work, slurm_env(tmp_path, tiny_tokenizer), *TOKENIZE_ARGS)
    assert done.returncode == 0, done.stderr
    merge = submissions(tmp_path)[1]
    log = (work / f"merge-demo-{merge['id']}.out").read_text()
    assert merge["state"] == "COMPLETED", log
    _assert_output_is(work, reference)
    assert sorted(p.name for p in parts.iterdir()) == others
    assert "kept corpus/demo.parts: it holds other files too" in log


@pytest.mark.parametrize(("settings", "args", "message"), [
    ({"OUTPUT": None}, (), "error: OUTPUT not set: run as INPUTS="),
    ({"TOKENIZER": None}, (), "error: TOKENIZER not set: run as INPUTS="),
    ({"INPUTS": None, "OUTPUT": None}, (), "error: INPUTS OUTPUT not set: run as INPUTS="),
    ({"SHARDS": "0"}, (), "error: SHARDS=0: give the number of parts, 1 or more"),
    ({"INPUTS": "corpus/*.jsonl"}, (), "error: INPUTS: corpus/*.jsonl: no such file, or a"),
    ({"SLURM_ARRAY_TASK_ID": "0"}, (), "error: run this script with bash, not sbatch"),
    ({"OUTPUT": "corpus/old"}, (), "error: corpus/old.bin exists; pass --overwrite"),
    ({}, ("--json-key", "a", "--json-key=b"), "error: one --json-key per submission"),
])
def test_bad_settings_stop_before_anything_is_submitted(tmp_path, settings, args, message):
    """Bug: a missing knob or an output that the merge will refuse is found only by the jobs
    (each failing after its wait in the queue, with a bash "unbound variable" or dataprep's
    usage text), or the script started by `sbatch --array` submits itself again from every
    task: one line, exit 2, no job."""
    env = slurm_env(tmp_path, tmp_path / "tok.model")
    for knob, value in settings.items():
        if value is None:
            env.pop(knob)
        else:
            env[knob] = value
    (tmp_path / "raw").mkdir()
    for name in ("a.jsonl", "c_small.jsonl.zst"):  # what INPUTS names exists
        (tmp_path / "raw" / name).touch()
    (tmp_path / "corpus").mkdir()
    (tmp_path / "corpus" / "old.bin").write_bytes(b"")
    done = submit(tmp_path, env, *args)
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == [done.stderr.strip()], done.stderr
    assert done.stderr.startswith(message), done.stderr
    assert submissions(tmp_path) == []
    assert sorted(p.name for p in (tmp_path / "corpus").iterdir()) == ["old.bin"]  # no PARTS
