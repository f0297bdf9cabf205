"""``monitor.wandb``: Weights & Biases gets what TensorBoard gets, under the same names and
steps, continues the same W&B run on a resume, and is finished with the run's exit code. Offline
(no network, no API key): the test reads back the run file W&B writes (``run-ID.wandb``: W&B's
protobuf records in its LevelDB-style log) and compares it with TensorBoard's event files and
metrics.jsonl step by step. Skipped where wandb (the ``wandb`` extra) is not installed."""

from __future__ import annotations

import json
import math
import os
import struct
import sys
from pathlib import Path

import pytest
from trainer_fixtures import tiny_config

from bloomline.common.errors import UserError
from bloomline.trainer.config_rules import validate
from bloomline.trainer.loop import Trainer
from bloomline.trainer.reporting.wandb_sink import RUN_ID_FILE

# the run file: a 7-byte header, then 32 KiB blocks of chunks, each with a 7-byte header
# (crc32, length, type: 1 whole record, 2 first, 3 middle, 4 last part of one)
_HEADER, _BLOCK, _CHUNK = 7, 32 * 1024, 7


def _records(path: Path) -> list:
    """The protobuf records (``wandb_internal_pb2.Record``) of a W&B run file."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path}: not a W&B run file"
    records, parts, pos = [], [], _HEADER
    while pos + _CHUNK <= len(data):
        room = _BLOCK - pos % _BLOCK
        if room < _CHUNK:  # a block's tail too short for a chunk header is padding
            pos += room
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + _CHUNK])
        if kind == 0:  # zero padding up to the block's end
            pos += room
            continue
        parts.append(data[pos + _CHUNK:pos + _CHUNK + length])
        pos += _CHUNK + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(b"".join(parts))
            records.append(record)
            parts = []
    return records


def _run_file(wandb_dir: Path, run_id: str) -> Path:
    """The run file W&B wrote under ``wandb_dir`` (WANDB_DIR) for this run id."""
    (found,) = wandb_dir.glob(f"wandb/offline-run-*-{run_id}/run-{run_id}.wandb")
    return found


def _rows(records) -> list[dict[str, float]]:
    """Each logged row's values by name (W&B's own ``_`` keys left out)."""
    rows = []
    for record in records:
        if record.WhichOneof("record_type") != "history":
            continue
        row = {}
        for item in record.history.item:
            name = item.key or "/".join(item.nested_key)
            if not name.startswith("_"):
                row[name] = json.loads(item.value_json)
        rows.append(row)
    return rows


def _tensorboard(run: Path) -> dict[tuple[str, int], float]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run / "tensorboard"), size_guidance={"scalars": 0})
    events.Reload()
    return {(tag, event.step): event.value for tag in events.Tags()["scalars"]
            for event in events.Scalars(tag)}


def _exit_code(records) -> int:
    (code,) = [r.exit.exit_code for r in records if r.WhichOneof("record_type") == "exit"]
    return code


def _wandb_processes() -> list[str]:
    """W&B service processes that are children of this process (Linux /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:  # ended meanwhile
            continue
        parent = int(stat.rsplit(")", 1)[1].split()[1])
        if parent == os.getpid() and "wandb" in command:
            found.append(command)
    return found


@pytest.fixture
def offline_wandb(monkeypatch, tmp_path):
    """W&B offline and silent, every file of its own under tmp_path, no key, no faults."""
    pytest.importorskip("wandb", reason="the wandb extra (pip install "
                        "'bloomline-trainer[wandb]') is not installed")
    home = tmp_path / "wandb_home"
    for name in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR",
                 "WANDB_ARTIFACT_DIR"):
        monkeypatch.setenv(name, str(home / name.lower()))
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb_dir"))
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_CONSOLE", "off")  # pytest captures the output already
    monkeypatch.setenv("WANDB_X_DISABLE_STATS", "true")  # no system metrics: less CPU
    for name in ("WANDB_API_KEY", "WANDB_PROJECT", "WANDB_ENTITY", "WANDB_RUN_ID",
                 "WANDB_RESUME", "BLOOMLINE_FAULTS"):
        monkeypatch.delenv(name, raising=False)
    return tmp_path / "wandb_dir"


def _config(corpus, run: Path, samples: int):
    return tiny_config(corpus, run,
                       train={"train_samples": samples, "log_interval": 2, "eval_interval": 3,
                              "eval_samples": 4},
                       checkpoint={"interval": 3},
                       monitor={"tensorboard": True, "activation_stats_interval": 2,
                                "peak_flops": 1e12, "wandb": True, "wandb_project": "tests"})


@pytest.mark.slow
def test_wandb_gets_the_tensorboard_scalars_and_a_resume_continues_its_run(
        corpus, tmp_path, monkeypatch, offline_wandb):
    """Bug: W&B given other names, steps or values than TensorBoard (a record kind left out,
    activation stats not split per layer, W&B's own step instead of the run's as ``step``), a
    resume starting a second W&B run instead of continuing the first, the config not given,
    a stopped or finished run not finished in W&B (or with the wrong exit code), or W&B's
    service process outliving the run."""
    run = tmp_path / "run"
    # the first start is stopped by SIGUSR1 in step 2 (saved, exit code 75 to come)
    monkeypatch.setenv("BLOOMLINE_FAULTS", "usr1@step:step=2")
    first = Trainer(_config(corpus, run, 24), log=lambda *_: None).run()
    assert first.stopped and first.step == 2
    monkeypatch.delenv("BLOOMLINE_FAULTS")
    monkeypatch.delenv("WANDB_DIR")  # W&B's files of this start: in RUN/wandb
    second = Trainer(_config(corpus, run, 24), log=lambda *_: None).run()  # resumes: 3..6
    assert second.step == 6 and not second.stopped
    assert not _wandb_processes()

    run_id = (run / RUN_ID_FILE).read_text().strip()
    starts = [_records(_run_file(folder, run_id)) for folder in (offline_wandb, run)]
    for records in starts:
        (info,) = [r.run for r in records if r.WhichOneof("record_type") == "run"]
        assert info.run_id == run_id and info.project == "tests" and info.display_name == "run"
        config = {item.key: json.loads(item.value_json) for item in info.config.update}
        assert config["train"]["train_samples"] == 24 and config["monitor"]["wandb"] is True
    assert [_exit_code(records) for records in starts] == [75, 0]
    assert any(r.WhichOneof("record_type") == "preempting" for r in starts[0])

    logged = {}
    for records in starts:
        for row in _rows(records):
            step = row.pop("step")
            for name, value in row.items():
                assert (name, step) not in logged, (name, step)
                logged[name, step] = value
    tensorboard = _tensorboard(run)
    assert sorted(logged) == sorted(tensorboard)  # the same names at the same steps
    for key, value in logged.items():  # TensorBoard keeps float32
        assert value == pytest.approx(tensorboard[key], rel=1e-6, abs=1e-30), key
    kinds = {name.split("/")[0] for name, _ in logged}
    assert {"train", "valid", "activation_stats"} <= kinds, kinds
    assert ("activation_stats/grad_norm/layer_1", 4) in logged and ("valid/valid_loss", 3) in logged
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    train = {r["step"]: r for r in records if r["kind"] == "train"}
    assert sorted(train) == [1, 2, 3, 4, 6]  # each process's first step, then every 2
    for step, record in train.items():  # full precision, as metrics.jsonl has them
        assert logged["train/loss", step] == record["loss"]
        assert logged["train/lr", step] == record["lr"]
        assert math.isfinite(logged["train/grad_norm", step])


@pytest.mark.slow
def test_a_failed_run_finishes_its_wandb_run_with_exit_code_1(corpus, tmp_path, monkeypatch,
                                                              offline_wandb):
    """Bug: a run that fails leaving its W&B run open (shown as running until W&B calls it
    crashed) or finished as a success, or W&B's service process running on."""
    run = tmp_path / "run"
    monkeypatch.setenv("BLOOMLINE_FAULTS", "error@step:step=3")
    with pytest.raises(RuntimeError):
        Trainer(_config(corpus, run, 24), log=lambda *_: None).run()
    assert not _wandb_processes()
    run_id = (run / RUN_ID_FILE).read_text().strip()
    records = _records(_run_file(offline_wandb, run_id))
    assert _exit_code(records) == 1
    # the first step's train row, then step 2's train and stats rows
    assert [row["step"] for row in _rows(records)] == [1, 2, 2]


def test_monitor_wandb_without_wandb_is_one_line_naming_the_extra(corpus, tmp_path,
                                                                  monkeypatch):
    """Bug: ``monitor.wandb = true`` without the wandb package failing with an ImportError
    traceback once the model is built and the run started, instead of one line naming the
    extra while the config is checked."""
    monkeypatch.setitem(sys.modules, "wandb", None)  # as if not installed
    cfg = tiny_config(corpus, tmp_path / "run", monitor={"wandb": True})
    with pytest.raises(UserError) as raised:
        validate(cfg)
    message = str(raised.value)
    assert message == ("monitor.wandb = true needs the wandb package: pip install "
                       "'bloomline-trainer[wandb]' (or set monitor.wandb = false)")
    cfg.monitor.wandb = False
    validate(cfg)  # off, nothing is needed


def test_a_wandb_project_name_w_and_b_refuses_is_caught_with_the_config(corpus, tmp_path):
    """Bug: a project name with a slash (entity/project written into wandb_project) refused
    by W&B only at the run's start, after the model was built."""
    pytest.importorskip("wandb", reason="the wandb extra is not installed")
    cfg = tiny_config(corpus, tmp_path / "run",
                      monitor={"wandb": True, "wandb_project": "team/project"})
    with pytest.raises(UserError, match=r"^monitor.wandb_project = 'team/project': W&B"):
        validate(cfg)
