"""Every setting of the trainer is checked before any work: each numeric or enumerated field
has its allowed range declared next to it (``ranged`` in ``bloomline.common.config_loader``), the
rules between fields live in ``config_rules.validate`` / ``config_rules.parallel_sizes``, and a
bad value ends in one ``error:`` line naming the field, never in a traceback, a hang or a silent
run.

The cases are generated from the dataclasses: a new numeric or enumerated field without a
declared range fails ``test_every_numeric_and_enumerated_field_declares_a_range``, and once
declared, its boundaries are tried by ``test_each_field_at_its_boundaries``."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import sys
import types
import typing
from pathlib import Path

import pytest

from bloomline.common.config_loader import check_ranges, field_range
from bloomline.common.errors import UserError
from bloomline.trainer.config import Config, load_trainer_config
from bloomline.trainer.config_rules import parallel_sizes, validate
from bloomline.trainer.run_spec import load_run

ROOT = Path(__file__).resolve().parents[3]
BIN = Path(sys.executable).parent

# strings that are paths, names or formats rather than a fixed set of words (train.device,
# data.split and train.profile_steps have rules of their own: test_cross_field_rules)
FREE_TEXT = {"data.corpus", "data.tokenizer", "data.eod_token", "data.split", "data.cache_dir",
             "data.data_path", "data.data_args_path", "data.per_split_data_args_path",
             "train.run_dir", "train.device", "train.profile_steps", "checkpoint.resume",
             "checkpoint.init_from", "monitor.wandb_project", "monitor.wandb_entity",
             "monitor.wandb_run_name", "checkpoint.snapshot_dir"}

# list and table fields: a valid whole value around one item (the range holds per item)
WRAP = {
    "train.rampup_batch_size": lambda v: [1, 1, v],  # [start, increment, samples]
    "train.skip_samples": lambda v: [[v, 10**6]],
    "data.weights": lambda v: {"a": v, "b": 1.0},
    "data.phases": lambda v: {"100": {"a": v, "b": 1.0}},
}

# settings under which every value inside a field's own range is also valid with the others
# (the rules between fields are tried in test_cross_field_rules)
BASE = ["checkpoint.resume=none", "schedule.warmup=0", "optimizer.min_lr=0",
        "spike.min_history=1", "model.num_heads=1", "train.micro_batch_size=1",
        "train.global_batch_size=1"]


def _fields(cls: type = Config, prefix: str = ""):
    """(key, type hint, dataclasses.Field) of every leaf setting of the tree."""
    hints = typing.get_type_hints(cls)
    for field in dataclasses.fields(cls):
        hint = hints[field.name]
        key = prefix + field.name.rstrip("_")
        if dataclasses.is_dataclass(hint):
            yield from _fields(hint, f"{key}.")
        else:
            yield key, hint, field


def _scalar(hint) -> type:
    """The item type of a field: int for list[list[int]], float for dict[str, float], str for
    list[str] | str (data.data_path: a list of words or one string of them)."""
    if isinstance(hint, types.UnionType):
        items = {_scalar(arg) for arg in typing.get_args(hint)}
        if len(items) == 1:
            return items.pop()
    while typing.get_origin(hint) in (list, dict):
        hint = typing.get_args(hint)[-1]
    return hint


def _toml(value) -> str:
    if isinstance(value, float):
        return repr(value)  # nan, inf, 5e-324: TOML reads them back
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {_toml(v)}" for k, v in value.items()) + "}"
    return str(value)


def _step(value, kind: type, direction: float):
    """The nearest value of ``kind`` past ``value`` in ``direction`` (+inf or -inf)."""
    if kind is int:
        return int(value) + (1 if direction > 0 else -1)
    return math.nextafter(float(value), direction)


def _cases():
    """(key, override value, expected) for every ranged field: just outside each bound (and
    nan/inf for floats, an unknown word for choices), just inside it, and a wrong type."""
    for key, hint, field in _fields():
        rng, kind = field_range(field), _scalar(hint)
        if rng is None:
            continue
        wrap = WRAP.get(key, lambda v: v) if kind is not str else (lambda v: v)
        inside, outside = [], []
        if rng.choices is not None:
            inside = list(rng.choices)
            outside = (["bogus", ""] if kind is str
                       else [max(rng.choices) + 1, min(rng.choices) - 1])
        else:
            for bound, closed, direction in ((rng.ge, True, -math.inf), (rng.gt, False, -math.inf),
                                             (rng.le, True, math.inf), (rng.lt, False, math.inf)):
                if bound is None:
                    continue
                bound = kind(bound)
                if closed:  # ge / le: the bound itself is allowed, the next value past it not
                    inside.append(bound)
                    outside.append(_step(bound, kind, direction))
                else:
                    outside.append(bound)
                    inside.append(_step(bound, kind, -direction))
            if kind is float:
                outside += [math.nan, math.inf, -math.inf]
        wrong = [3] if kind is str else ["x"] + ([1.5] if kind is int else [])
        for value in inside:
            yield pytest.param(key, wrap(value), "inside", id=f"{key}={value!r}-inside")
        for value in outside:
            yield pytest.param(key, wrap(value), "outside", id=f"{key}={value!r}-outside")
        for value in wrong:
            yield pytest.param(key, wrap(value), "wrong-type", id=f"{key}={value!r}-type")


def test_every_numeric_and_enumerated_field_declares_a_range():
    """Bug: a new number (or a string with a fixed set of values) added to the config without
    a range, so that -1, 0, nan or a typo reaches the training loop unchecked."""
    missing = []
    for key, hint, field in _fields():
        kind, rng = _scalar(hint), field_range(field)
        if kind is bool or (kind is str and key in FREE_TEXT):
            continue
        if rng is None or (kind is str and rng.choices is None):
            missing.append(key)
        elif typing.get_origin(hint) in (list, dict) and key not in WRAP:
            missing.append(f"{key} (add a WRAP entry to this test)")
    assert not missing, f"declare the allowed values (ranged(...)) of: {', '.join(missing)}"


@pytest.mark.parametrize("key, value, expected", list(_cases()))
def test_each_field_at_its_boundaries(key, value, expected):
    """Bug: a value outside a field's range accepted (gradient ascent from clip_grad -1, a
    ZeroDivisionError from log_interval 0, a hang from watchdog 0 s), a valid boundary value
    refused, or a bad one ending in a traceback instead of one line naming the field, the value,
    the allowed range and the override it came from."""
    override = f"{key}={_toml(value)}"
    if expected == "inside":
        load_trainer_config(None, [*BASE, override])
        return
    with pytest.raises(UserError) as refused:
        load_trainer_config(None, [*BASE, override])
    message = str(refused.value)
    assert "\n" not in message and message.startswith(f"override {override!r}: {key}"), message
    if expected == "outside":
        rng = next(field_range(f) for k, _, f in _fields() if k == key)
        assert (rng.describe() in message if rng.choices is None
                else "expected one of" in message), message
    else:
        assert ": expected " in message, message


def test_a_value_from_a_file_names_the_file(tmp_path):
    """Bug: a bad value in a recipe reported without saying which file holds it."""
    recipe = tmp_path / "r.toml"
    recipe.write_text("[optimizer]\nbeta2 = 1.5\n")
    with pytest.raises(UserError, match=r"r.toml: optimizer.beta2 = 1.5: must be in \[0, 1\)$"):
        load_trainer_config(recipe, ["checkpoint.resume=none"])


def test_defaults_and_recipes_are_in_range():
    """Bug: a default or a shipped recipe outside the ranges, refused as soon as it is used."""
    validate(Config())
    for recipe in sorted((ROOT / "configs").glob("*.toml")):
        load_trainer_config(recipe, ["checkpoint.resume=none"])


@pytest.mark.parametrize("overrides, message", [
    (["optimizer.lr=1e-3", "optimizer.min_lr=1e-2"],
     "optimizer.min_lr 0.01 is above optimizer.lr 0.001"),
    (["train.train_samples=100", "schedule.warmup=101"],
     "schedule.warmup 101 samples (schedule.unit samples) is longer than the run: "
     "train.train_samples 100"),
    (["train.train_samples=100", "data.seq_length=8", "schedule.unit=tokens",
      "schedule.warmup=801"], "schedule.warmup 801 tokens (schedule.unit tokens) is longer than "
     "the run: train.train_samples 100 x data.seq_length 8 = 800 tokens"),
    (["train.train_samples=100", "schedule.warmup=0", "data.seq_length=8",
      "curriculum.seqlen_warmup=true",
      "curriculum.start_seq_length=8", "curriculum.warmup_tokens=801"],
     "curriculum.warmup_tokens 801 is longer than the run"),
    (["curriculum.seqlen_warmup=true", "data.seq_length=64", "curriculum.start_seq_length=65"],
     "curriculum.start_seq_length 65: must be within [1, data.seq_length = 64]"),
    (["spike.window=10", "spike.min_history=11"], "spike.min_history 11 exceeds spike.window 10"),
    (["model.hidden_size=100", "model.num_heads=12"],
     "model.hidden_size 100 is not divisible by model.num_heads 12"),
    (["model.num_heads=12", "parallel.tensor_parallel=5"],
     "model.num_heads 12 is not divisible by parallel.tensor_parallel 5"),
    (["model.num_heads=4", "model.ffn_hidden_size=6", "parallel.tensor_parallel=4"],
     "model.ffn_hidden_size 6 is not divisible by parallel.tensor_parallel 4"),
    (["model.num_heads=4", "model.vocab_size=1001", "parallel.tensor_parallel=2"],
     "model.vocab_size 1001 is not divisible by parallel.tensor_parallel 2"),
    (["model.num_layers=4", "parallel.pipeline_parallel=2", "parallel.virtual_stages=3",
      "parallel.pipeline_schedule=interleaved"], "model.num_layers 4 is fewer than the 6 "
     "pipeline stages"),
    (["train.micro_batch_size=3", "train.global_batch_size=32"],
     "train.global_batch_size 32 is not a multiple of train.micro_batch_size 3"),
    (["parallel.offload=true"], "parallel.offload needs parallel.zero_stage = 3"),
    (["train.device=mps"], "train.device = 'mps': expected cpu, cuda, cuda:N or auto"),
    (["data.split=1,2,3,4"], "data.split '1,2,3,4': expected up to three non-negative"),
    (["data.weights={a=0, b=0}"], "data.weights: the weights must not all be zero"),
    (["train.profile_steps=5:2"], "train.profile_steps '5:2': expected A:B"),
    (["train.rampup_batch_size=[1, 1]"], "train.rampup_batch_size: expected [start, increment"),
])
def test_cross_field_rules(overrides, message):
    """Bug: settings each valid alone but not together accepted (min_lr above lr: the LR
    climbs during the decay; a warmup longer than the run: the LR never reaches its peak;
    a layout whose shards differ: a crash inside a collective), or refused with more than
    one line."""
    with pytest.raises(UserError) as refused:
        load_run(None, ["checkpoint.resume=none", *overrides], check_tokenizer=False)
    assert message in str(refused.value) and "\n" not in str(refused.value)


@pytest.mark.parametrize("world, parallel, message", [
    (3, {"tensor_parallel": 2}, "world size 3 is not divisible by parallel.tensor_parallel 2"),
    (4, {"data_parallel": 3}, "pp 1 x dp 3 x tp 1 = 3 processes, but the world size is 4"),
    (4, {"tensor_parallel": 0}, "parallel.tensor_parallel = 0: must be >= 1"),
])
def test_world_size_rules_and_configs_built_in_code(world, parallel, message):
    """Bug: a config built in code (tests, benchmarks, a checkpoint's model settings) skipping
    the range checks that load_config does, so that tp 0 reaches a ZeroDivisionError; or the
    world size checked only once the process group is up."""
    cfg = Config()
    cfg.model.num_heads = 4
    for key, value in parallel.items():
        setattr(cfg.parallel, key, value)
    with pytest.raises(UserError, match=message.replace("(", r"\(")):
        parallel_sizes(cfg, world)


@pytest.mark.parametrize("world", [1, 4, 16])
def test_a_layout_for_another_world_is_refused_in_one_line(world):
    """Bug: a recipe whose [parallel] layout is for 8 processes run by another
    number of them (pretrain training a layout nobody planned: dp 1 or dp 16 of a recipe whose
    batch, memory and plan assume dp 8), or refused with more than one line, without both
    numbers or without what to do. Its own world passes, and any world with world_size 0."""
    cfg = Config()
    cfg.parallel.world_size = 8
    with pytest.raises(UserError) as refused:
        parallel_sizes(cfg, world)
    text = str(refused.value)
    assert text.startswith("parallel.world_size 8 (the recipe's layout: pp1 x dp8 x tp1) but "
                           f"this run has {world} process") and "\n" not in text
    assert f"override parallel.world_size={world} with a layout for it" in text
    assert parallel_sizes(cfg, 8) == (1, 8, 1)
    cfg.parallel.world_size = 0
    assert parallel_sizes(cfg, 2) == (1, 2, 1)


def test_check_ranges_sees_values_set_in_code():
    """Bug: ``validate`` trusting a tree changed after loading (``cfg.optimizer.lr = -1``)."""
    cfg = Config()
    cfg.optimizer.lr = -1.0
    with pytest.raises(UserError, match=r"^optimizer.lr = -1.0: must be > 0$"):
        validate(cfg)
    cfg.optimizer.lr, cfg.train.skip_samples = 1e-3, [[0, 2**63]]
    with pytest.raises(UserError, match=r"train.skip_samples\[0\]\[1\] = 9223372036854775808: "
                                        "does not fit in a 64-bit integer"):
        check_ranges(cfg)


# the command-line cases: (arguments after the recipe, the one error line wanted)
CLI_CASES = {
    "log_interval": (["train.log_interval=0"],
                     "override 'train.log_interval=0': train.log_interval = 0: must be >= 1"),
    "lr_nan": (["optimizer.lr=nan"], "optimizer.lr = nan: not a finite number; must be > 0"),
    "train_samples": (["train.train_samples=1e30"],
                      "train.train_samples = 1e+30: must be in [1, 2**40]"),
    "nproc_watchdog": (["--nproc", "2", "watchdog.startup_seconds=0"],
                       "watchdog.startup_seconds = 0: must be in (0, 1e8]"),
    "nproc_layout": (["--nproc", "2", "parallel.world_size=2", "parallel.tensor_parallel=4"],
                     "world size 2 is not divisible by parallel.tensor_parallel 4"),
    # tiny-cpu states parallel.world_size = 1 (a vocabulary given: no tokenizer is read)
    "nproc_world": (["--nproc", "2", "model.vocab_size=8064"],
                    "error: parallel.world_size 1 (the recipe's layout: pp1 x dp1 x tp1) but "
                    "this run has 2 processes: run 1 process (no --nproc), or override "
                    "parallel.world_size=2 with a layout for it"),
    "one_process_world": (["parallel.world_size=8", "model.vocab_size=8064"],
                          "error: parallel.world_size 8 (the recipe's layout: pp1 x dp8 x tp1) "
                          "but this run has 1 process: start 8 (trainer pretrain --nproc ... / "
                          "torchrun), or override parallel.world_size=1 with a layout for it"),
}


class _Runs:
    """The CLI cases, all started at once (each process spends its seconds importing torch),
    each collected when a test asks for it; a hang fails that test at the timeout."""

    def __init__(self, root: Path) -> None:
        env = {k: v for k, v in os.environ.items() if k not in ("LOGLEVEL", "BLOOMLINE_FAULTS")}
        self.run_dirs = {name: root / name for name in CLI_CASES}
        self.procs = {
            name: subprocess.Popen(
                [str(BIN / "trainer"), "pretrain", "--config",
                 str(ROOT / "configs/tiny-cpu.toml"), *args,
                 f"train.run_dir={self.run_dirs[name]}"],
                cwd=root, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
            for name, (args, _) in CLI_CASES.items()}
        self.done: dict[str, tuple[int, str]] = {}

    def result(self, name: str) -> tuple[int, str]:
        if name not in self.done:
            _, stderr = self.procs[name].communicate(timeout=120)
            self.done[name] = (self.procs[name].returncode, stderr)
        return self.done[name]

    def close(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.communicate()


@pytest.fixture(scope="module")
def cli_runs(tmp_path_factory):
    runs = _Runs(tmp_path_factory.mktemp("cli"))
    yield runs
    runs.close()


def _assert_one_error_line(runs: _Runs, name: str) -> str:
    code, stderr = runs.result(name)
    wanted = CLI_CASES[name][1]
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert code != 0, stderr
    assert "Traceback" not in stderr, stderr
    assert len(errors) == 1 and wanted in errors[0], stderr
    assert not runs.run_dirs[name].exists(), stderr  # refused before any work
    return stderr


@pytest.mark.slow
@pytest.mark.parametrize("name", ["log_interval", "lr_nan", "train_samples"])
def test_cli_refuses_a_bad_setting_in_one_line(name, cli_runs):
    """Bug: ``trainer pretrain`` with a bad setting printing a traceback (ZeroDivisionError
    from log_interval 0, an OverflowError from a huge sample count), hanging, or exiting 0."""
    _assert_one_error_line(cli_runs, name)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["nproc_watchdog", "nproc_layout"])
def test_launcher_refuses_before_starting_the_processes(name, cli_runs):
    """Bug: ``--nproc 2`` starting the workers on a config that cannot run (each of them then
    failing, hanging or printing the error again): the launcher checks the config, and the
    layout for its world size, first and prints the error once."""
    stderr = _assert_one_error_line(cli_runs, name)
    assert "rank" not in stderr, stderr  # no worker ran: the launcher refused


@pytest.mark.slow
@pytest.mark.parametrize("name", ["nproc_world", "one_process_world"])
def test_pretrain_refuses_a_world_the_layout_is_not_for(name, cli_runs):
    """Bug: ``trainer pretrain`` running a recipe's layout on another number of
    processes than its parallel.world_size (tiny-cpu's 1 under ``--nproc 2``; a layout for 8
    in one process), so that the run trains another layout than the one planned; or refusing
    it with a traceback, more than one line, after the workers started, or exit 0."""
    stderr = _assert_one_error_line(cli_runs, name)
    assert "rank" not in stderr, stderr  # refused before any worker or process group
