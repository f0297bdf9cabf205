"""Make a golden checkpoint: what the trainer of commit COMMIT writes at step K of a tiny fp32
run, with the losses of the steps after it, for ``test_golden_checkpoints.py`` to resume with
today's code.

    .venv/bin/python packages/trainer/tests/checkpoint/golden/make_golden.py make COMMIT \\
        --name NAME --format "what this format is"
    .venv/bin/python .../make_golden.py survey COMMIT...   # each commit's format, nothing kept
    .venv/bin/python .../make_golden.py rerecord NAME --why "the commit that changed the math"
    .venv/bin/python .../make_golden.py corpus   # corpus/ (committed; written once)

``make`` checks COMMIT out into a git worktree in a temporary folder and runs *that commit's*
trainer (``python -m bloomline.trainer pretrain``, its packages first on PYTHONPATH, this
repository's .venv for torch and the rest) on the committed corpus ``corpus/`` with the config
of ``CONFIG`` below: K + M steps straight with a checkpoint at K, then that commit's own resume
of the checkpoint for M steps (recorded for information: the straight run's losses are the
expected ones, what a resume should repeat). The checkpoint of step K goes to
``NAME/checkpoint/``, and ``NAME/golden.json`` says from which commit, which format, which
torch and CPU, the config, the losses (``float.hex``: exact), the digest of the state the
checkpoint holds and the format's signature. Then it resumes the new golden with this working
tree, as the test does, and says whether the state and the losses agree. The worktree is
removed afterwards.

``rerecord`` is for a legitimate change of the math (a kernel, the loss reduction): it
resumes NAME with this working tree and replaces its expected losses, naming the commit and the
reason; the origin's own losses stay in the file. It refuses unless today's load restores the
golden's state exactly: a change of the format or of the load is the bug the goldens catch,
never a reason to re-record.

A script beside its data, not a tool under packages/: it writes test data, imports nothing
of bloomline's at module level (it runs other commits' code in subprocesses) and nothing
imports it but the test (for ``resume_golden``).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[4]
CORPUS = HERE / "corpus"
STEP = 6  # K: the golden's step
CONTINUE = 4  # M: the steps resumed and compared
# Settings every commit since the trainer's first one reads, chosen so that the continuation
# depends on every piece of state a checkpoint holds: dropout draws from torch's RNG, two
# micro-batches per step, warm-up then cosine decay by the consumed samples, AdamW's moments and
# step, gradient clipping, the sampler's position. fp32 on CPU: bit for bit repeatable.
CONFIG = {
    "model": {"vocab_size": 128, "hidden_size": 16, "num_layers": 1, "num_heads": 2,
              "hidden_dropout": 0.1, "attention_dropout": 0.1},
    "data": {"seq_length": 32, "split": "90,10,0", "num_workers": 0},
    "train": {"micro_batch_size": 2, "global_batch_size": 4, "eval_interval": 0,
              "log_interval": 1, "device": "cpu", "seed": 1234},
    "precision": {"dtype": "fp32"},
    "optimizer": {"name": "adamw", "lr": 3e-3, "min_lr": 3e-4, "clip_grad": 0.5},
    "schedule": {"warmup": 8, "style": "cosine"},
    "checkpoint": {"keep_last": 10},
    "monitor": {"tensorboard": False},
}


def _toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)
    return repr(value)


def write_config(path: Path, corpus: Path, run_dir: Path, steps: int, interval: int) -> None:
    tables = json.loads(json.dumps(CONFIG))
    tables["data"]["corpus"] = str(corpus)
    tables["train"]["run_dir"] = str(run_dir)
    tables["train"]["train_samples"] = steps * tables["train"]["global_batch_size"]
    tables["checkpoint"]["interval"] = interval
    lines = []
    for section, values in tables.items():
        lines.append(f"[{section}]")
        lines += [f"{key} = {_toml_value(value)}" for key, value in values.items()]
    path.write_text("\n".join(lines) + "\n")


def train_losses(run_dir: Path) -> dict[int, float]:
    """{step: loss} of the train records of a run's metrics.jsonl (a resumed run appends)."""
    losses = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        if record.get("kind") == "train":
            losses[record["step"]] = record["loss"]
    return losses


def environment() -> dict:
    """What the losses' last bits depend on besides the code: torch, its CPU kernels, the CPU."""
    import torch

    vendor = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("vendor_id"):
                vendor = line.split(":", 1)[1].strip()
                break
    return {"torch": torch.__version__, "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "cpu_vendor": vendor or platform.processor(), "python": platform.python_version()}


def _git(*args: str, cwd: Path = REPO) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True,
                          text=True).stdout.strip()


@contextlib.contextmanager
def worktree(commit: str):
    """A checkout of ``commit`` in a temporary folder, removed afterwards."""
    with tempfile.TemporaryDirectory(prefix="golden-") as tmp:
        path = Path(tmp) / "src"
        _git("worktree", "add", "--detach", str(path), commit)
        try:
            yield path
        finally:
            _git("worktree", "remove", "--force", str(path))


def _run_at(source: Path, args: list[str], cwd: Path) -> str:
    """``python -m bloomline.trainer ARGS`` with ``source``'s packages first on the path."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        str(source / "packages" / name / "src") for name in ("common", "dataprep", "trainer"))
    env["OMP_NUM_THREADS"] = "1"  # (the tiny model's kernels run on one thread anyway)
    check = subprocess.run([sys.executable, "-c", "import bloomline.trainer as t; "
                            "print(t.__file__)"], env=env, capture_output=True, text=True,
                           check=True).stdout.strip()
    if not Path(check).is_relative_to(source):
        raise SystemExit(f"bloomline.trainer imports from {check}, not from {source}")
    done = subprocess.run([sys.executable, "-m", "bloomline.trainer", *args], cwd=cwd, env=env,
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"trainer {' '.join(args)} at {source} failed "
                         f"({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return done.stdout


def run_commit(source: Path, work: Path, steps: int, checkpoint_step: int,
               resume: bool = True) -> tuple[Path, dict[int, float], dict[int, float]]:
    """Train at ``source`` for ``steps`` steps with a checkpoint at ``checkpoint_step``, then
    (``resume``) resume that checkpoint there. Returns the checkpoint folder, the straight
    run's losses by step and the resumed run's (empty without ``resume``)."""
    corpus = work / "corpus"
    shutil.copytree(CORPUS, corpus)
    straight = work / "straight"
    write_config(work / "golden.toml", corpus, straight, steps, checkpoint_step)
    _run_at(source, ["pretrain", "--config", str(work / "golden.toml")], work)
    losses = train_losses(straight)
    if sorted(losses) != list(range(1, steps + 1)):
        raise SystemExit(f"the run at {source} logged steps {sorted(losses)}")
    checkpoint = straight / "checkpoints" / f"step_{checkpoint_step:08d}"
    again: dict[int, float] = {}
    if resume and steps > checkpoint_step:
        resumed = work / "resumed"
        copy = work / "resume-from"
        shutil.copytree(checkpoint, copy)
        _run_at(source, ["pretrain", "--config", str(work / "golden.toml"),
                         f"checkpoint.resume={copy}", f"train.run_dir={resumed}",
                         "checkpoint.interval=0"], work)
        again = train_losses(resumed)
    return checkpoint, losses, again


def _hex(values) -> list[str]:
    return [float(v).hex() for v in values]


def _dcp_pattern(fqn: str, params: set[str]) -> str:
    """A DCP entry's name with the parameter's name as ``P`` (``optim.state.P.exp_avg``)."""
    for prefix in ("model.", "optim.state.", "optim.param_groups."):
        if fqn.startswith(prefix):
            rest = fqn[len(prefix):]
            for name in sorted(params, key=len, reverse=True):
                if rest == name or rest.startswith(name + "."):
                    return prefix + "P" + rest[len(name):]
            head, _, tail = rest.partition(".")
            return prefix + ("N" if head.isdigit() else head) + ("." + tail if tail else "")
    return fqn


def signature(checkpoint: Path) -> dict:
    """What a checkpoint's format is made of, values left out: its files, the small files'
    keys, the config's keys, DCP's entries by kind (parameter names as ``P``)."""
    import tomllib

    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    from bloomline.trainer.checkpoint.metadata import read_metadata

    files = sorted(p.relative_to(checkpoint).as_posix() for p in checkpoint.rglob("*")
                   if p.is_file())
    out: dict = {"files": files}
    for name in ("manifest.json", "trainer_state.json", "rng.json"):
        if (checkpoint / name).is_file():
            value = json.loads((checkpoint / name).read_text())
            out[name] = sorted(f"{k}={v}" if k in ("format", "version") else k
                               for k in value for v in [value[k]])
    config = tomllib.loads((checkpoint / "config.toml").read_text())
    out["config.toml"] = sorted(f"{section}.{key}" for section, values in config.items()
                                for key in values)
    items = read_metadata(checkpoint).state_dict_metadata
    params = {fqn[len("model."):] for fqn in items if fqn.startswith("model.")}
    kinds: dict[str, set] = {}
    for fqn, item in items.items():
        kind = (str(item.properties.dtype).removeprefix("torch.")
                if isinstance(item, TensorStorageMetadata) else "bytes")
        kinds.setdefault(_dcp_pattern(fqn, params), set()).add(kind)
    out["dcp"] = sorted(f"{pattern}: {'/'.join(sorted(k))}" for pattern, k in kinds.items())
    return out


def _digest(tensors: dict, rng: dict, counters: list[int]) -> str:
    import hashlib

    import torch

    digest = hashlib.sha256()
    for fqn, tensor in sorted(tensors.items()):
        digest.update(f"{fqn} {tensor.dtype} {list(tensor.shape)}".encode())
        flat = tensor.detach().cpu().reshape(-1).contiguous()
        digest.update(flat.view(torch.uint8).numpy().tobytes())
    # CUDA generators exist on GPU machines only; the CPU run's state is the rest
    digest.update(json.dumps({k: v for k, v in rng.items() if k != "cuda"},
                             sort_keys=True).encode())
    digest.update(json.dumps(counters).encode())
    return digest.hexdigest()


def state_digest(checkpoint: Path) -> str:
    """sha256 of what a checkpoint holds for the steps after it, read from its files whatever
    its format: every weight and optimizer moment by name, the generator states, the step and
    the data position (not the param_groups: a resume takes its hyper-parameters from the
    config). ``live_digest`` computes the same from a model and optimizer just loaded."""
    import torch
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    from bloomline.trainer.checkpoint.layout import LEGACY_RNG_FILE
    from bloomline.trainer.checkpoint.legacy import _rng_json
    from bloomline.trainer.checkpoint.metadata import dcp_load, read_metadata

    items = read_metadata(checkpoint).state_dict_metadata
    tensors = {fqn: torch.empty(tuple(item.size), dtype=item.properties.dtype)
               for fqn, item in items.items() if isinstance(item, TensorStorageMetadata)
               and fqn.startswith(("model.", "optim.state."))}
    dcp_load(tensors, checkpoint)
    legacy = checkpoint / LEGACY_RNG_FILE
    rng = (_rng_json(legacy) if legacy.is_file()
           else json.loads((checkpoint / "rng.json").read_text()))
    state = json.loads((checkpoint / "trainer_state.json").read_text())
    return _digest(tensors, rng, [state["step"], state["consumed_samples"],
                                  state["consumed_tokens"]])


def live_digest(model, optimizer, state) -> str:
    """``state_digest`` of a model, optimizer and ``TrainState`` in memory, with this
    process's generator states: what a load restored."""
    import torch
    from torch.distributed.checkpoint._nested_dict import flatten_state_dict

    from bloomline.trainer.checkpoint.dcp_state import saved_state_dict
    from bloomline.trainer.checkpoint.rng_state import rng_state

    flat, _ = flatten_state_dict(saved_state_dict(model, optimizer))
    tensors = {fqn: value for fqn, value in flat.items() if isinstance(value, torch.Tensor)
               and fqn.startswith(("model.", "optim.state."))}
    return _digest(tensors, rng_state(), [state.step, state.consumed_samples,
                                          state.consumed_tokens])


def comparable(signature: dict) -> dict:
    """A signature without what changes with no change of the format: the config's keys
    (a new setting takes its default in older checkpoints; a renamed or removed one shows in
    the goldens' resume) and the CUDA generator states of GPU machines."""
    return {key: ([v for v in value if v != "cuda"] if key == "rng.json" else value)
            for key, value in signature.items() if key != "config.toml"}


@dataclass
class Resumed:
    """A golden resumed with today's code: the losses by step, ``live_digest`` right after
    the load, and the run folder (its last checkpoint is one of today's format)."""

    losses: dict[int, float]
    digest: str
    run_dir: Path


def resume_golden(folder: Path, work: Path) -> Resumed:
    """Resume the golden in ``folder`` with the code this interpreter imports (today's tree)
    for its ``continue_steps`` steps in ``work``, on one thread; a checkpoint of the format
    before manifests is upgraded first (``trainer upgrade-checkpoint``). What the test runs."""
    import tomllib

    import torch

    from bloomline.common.config_loader import config_from_dict, resolve_paths
    from bloomline.trainer import run_checkpoints
    from bloomline.trainer.checkpoint.layout import is_legacy_checkpoint
    from bloomline.trainer.checkpoint.legacy import upgrade_checkpoint
    from bloomline.trainer.config import Config
    from bloomline.trainer.loop import Trainer

    golden = json.loads((folder / "golden.json").read_text())
    checkpoint = work / "checkpoint"
    if is_legacy_checkpoint(folder / "checkpoint"):
        upgrade_checkpoint(folder / "checkpoint", checkpoint)
    else:
        shutil.copytree(folder / "checkpoint", checkpoint)
    corpus = work / "corpus"
    shutil.copytree(CORPUS, corpus)
    # the run as the golden's config.toml describes it (today's reader: renamed keys move,
    # missing ones take today's defaults), in this machine's folders
    cfg = config_from_dict(Config, tomllib.loads((checkpoint / "config.toml").read_text()),
                           str(checkpoint / "config.toml"))
    cfg.data.corpus = str(corpus)
    cfg.train.run_dir = str(work / "run")
    cfg.train.train_samples = golden["config"]["train_samples"]
    cfg.checkpoint.resume = str(checkpoint)
    cfg.checkpoint.interval = 0  # one checkpoint, at the end: today's format
    cfg.monitor.peak_flops = 1e12  # given, not measured: no start-up timing
    for override in golden.get("resume_overrides", []):
        key, value = override.split("=", 1)
        section, name = key.split(".")
        setattr(getattr(cfg, section), name, type(getattr(getattr(cfg, section), name))(value))
    resolve_paths(cfg)
    digests = []
    load = run_checkpoints.RunCheckpoints.load

    def load_and_digest(self, *args, **kwargs):
        loaded = load(self, *args, **kwargs)
        digests.append(live_digest(self.model, self.optimizer, loaded.state))
        return loaded

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    run_checkpoints.RunCheckpoints.load = load_and_digest
    try:
        Trainer(cfg, log=lambda line: None).run()
    finally:
        run_checkpoints.RunCheckpoints.load = load
        torch.set_num_threads(threads)
    return Resumed(train_losses(work / "run"), digests[0] if digests else "", work / "run")


def make(args) -> None:
    commit = _git("rev-parse", args.commit)
    folder = HERE / args.name
    if folder.exists() and not args.overwrite:
        raise SystemExit(f"{folder} exists (--overwrite replaces it)")
    with tempfile.TemporaryDirectory(prefix="golden-run-") as tmp, worktree(commit) as source:
        work = Path(tmp)
        checkpoint, losses, resumed = run_commit(source, work, STEP + CONTINUE, STEP)
        if folder.exists():
            shutil.rmtree(folder)
        folder.mkdir()
        shutil.copytree(checkpoint, folder / "checkpoint")
    date = _git("show", "-s", "--format=%cI", commit)
    subject = _git("show", "-s", "--format=%s", commit)
    env = environment()
    tail = [losses[s] for s in range(STEP + 1, STEP + CONTINUE + 1)]
    golden = {
        "name": args.name,
        "commit": commit,
        "commit_date": date,
        "commit_subject": subject[:200],
        "format": args.format,
        "made": datetime.date.today().isoformat(),
        "step": STEP,
        "continue_steps": CONTINUE,
        "config": {**CONFIG, "train_samples": (STEP + CONTINUE)
                   * CONFIG["train"]["global_batch_size"]},
        "resume_overrides": args.resume_override or [],
        # the origin's straight run, steps 1..K+M, and its own resume of the golden, K+1..K+M
        # (not always the same: what a version resumed to is not always what it should have)
        "origin": {"environment": env, "losses": _hex(losses[s] for s in sorted(losses)),
                   "resumed_losses": _hex(resumed[s] for s in sorted(resumed))},
        "expected": {"recorded_at": commit,
                     "why": "the origin commit's uninterrupted run past the golden's step",
                     "environment": env, "losses": _hex(tail)},
        "state_sha256": state_digest(folder / "checkpoint"),
        "signature": signature(folder / "checkpoint"),
    }
    (folder / "golden.json").write_text(json.dumps(golden, indent=1) + "\n")
    size = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
    print(f"{folder.relative_to(REPO)}: step {STEP} of {commit[:10]} ({date}), {size} bytes")
    _compare_today(folder, golden)


def _compare_today(folder: Path, golden: dict) -> bool:
    """Resume the golden with this tree; print whether the load restored its state exactly
    and whether the losses are the expected ones, bit for bit."""
    with tempfile.TemporaryDirectory(prefix="golden-resume-") as tmp:
        got = resume_golden(folder, Path(tmp))
    exact = got.digest == golden["state_sha256"]
    print(f"  state right after today's load: {'exact' if exact else 'NOT THE GOLDEN STATE'}")
    expected = [float.fromhex(h) for h in golden["expected"]["losses"]]
    steps = range(golden["step"] + 1, golden["step"] + golden["continue_steps"] + 1)
    values = [got.losses.get(s) for s in steps]
    same = None not in values and _hex(values) == _hex(expected)
    print(f"  losses resumed with this tree: {'bitwise equal' if same else 'DIFFERENT'}")
    for step, want, have in zip(steps, expected, values, strict=True):
        print(f"    step {step}: expected {want!r}, got {have!r}")
    return exact and same


def rerecord(args) -> None:
    folder = HERE / args.name
    golden = json.loads((folder / "golden.json").read_text())
    head = _git("rev-parse", "HEAD")
    if _git("status", "--porcelain", "--", "packages"):
        print("note: the working tree has uncommitted changes; recorded as HEAD's anyway")
    with tempfile.TemporaryDirectory(prefix="golden-resume-") as tmp:
        got = resume_golden(folder, Path(tmp))
    if got.digest != golden["state_sha256"]:
        raise SystemExit(f"{folder.name}: today's load does not restore the golden's state "
                         "exactly: that is a bug of the load, not a change of the math; "
                         "nothing re-recorded")
    golden["expected"] = {"recorded_at": head, "why": args.why, "environment": environment(),
                          "losses": _hex(got.losses[s] for s in sorted(got.losses))}
    (folder / "golden.json").write_text(json.dumps(golden, indent=1) + "\n")
    print(f"{folder.name}: expected losses re-recorded at {head[:10]}")


def write_corpus(args) -> None:
    """The committed ``corpus/``: documents of a learnable pattern (ramps), as the trainer
    tests' corpus; written once, committed (the goldens' losses depend on its bytes)."""
    import numpy as np

    from bloomline.dataprep.indexed_dataset import IndexedDatasetWriter

    rng = np.random.default_rng(0)
    CORPUS.mkdir(exist_ok=True)
    writer = IndexedDatasetWriter(CORPUS / "toy", np.uint16)
    for _ in range(48):
        start, length = int(rng.integers(0, 95)), int(rng.integers(20, 120))
        tokens = (start + np.arange(length) * int(rng.integers(1, 3))) % 95
        writer.add_document(np.append(tokens, 95).astype(np.uint16))
    writer.finalize()


def survey(args) -> None:
    """Each commit's checkpoint format and first losses, printed where they change."""
    before: dict = {}
    losses_before = None
    for commit in args.commits:
        full = _git("rev-parse", commit)
        line = _git("show", "-s", "--format=%h %cs %s", full)[:110]
        with tempfile.TemporaryDirectory(prefix="golden-survey-") as tmp, \
                worktree(full) as source:
            try:
                checkpoint, losses, _ = run_commit(source, Path(tmp), STEP, STEP,
                                                   resume=False)
            except SystemExit as err:
                lines = [x for x in str(err).splitlines() if x.strip()]
                print(f"{line}\n  fails: {lines[-1] if lines else err}", flush=True)
                continue
            now = signature(checkpoint)
        changes = []
        for key in sorted(set(now) | set(before)):
            old, new = set(before.get(key, [])), set(now.get(key, []))
            if old != new:
                changes.append(f"  {key}: +{sorted(new - old)} -{sorted(old - new)}")
        hexes = _hex(losses[s] for s in sorted(losses))
        if hexes != losses_before:
            changes.append(f"  losses: {' '.join(h[4:13] for h in hexes)}")
        print(line + ("\n" + "\n".join(changes) if changes else "  (same)"), flush=True)
        before, losses_before = now, hexes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    one = sub.add_parser("make", help="make the golden of one commit")
    one.add_argument("commit")
    one.add_argument("--name", required=True, help="its folder under golden/")
    one.add_argument("--format", required=True, help="what this checkpoint format is")
    one.add_argument("--resume-override", action="append",
                     help="section.key=value for today's resume (a kernel choice the origin "
                     "commit made implicitly)")
    one.add_argument("--overwrite", action="store_true")
    again = sub.add_parser("rerecord", help="re-record a golden's expected losses with this tree")
    again.add_argument("name")
    again.add_argument("--why", required=True, help="the commit that changed the math, and how")
    many = sub.add_parser("survey", help="print each commit's checkpoint format")
    many.add_argument("commits", nargs="+")
    sub.add_parser("corpus", help="write corpus/ (committed; once)")
    args = parser.parse_args()
    {"make": make, "rerecord": rerecord, "survey": survey,
     "corpus": write_corpus}[args.command](args)


if __name__ == "__main__":
    main()
