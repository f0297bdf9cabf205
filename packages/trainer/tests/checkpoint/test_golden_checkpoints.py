"""Checkpoints written by earlier versions of bloomline, one per checkpoint format it has
written (``golden/``: each with the commit that wrote it and the losses that follow it;
``golden/README.md``), resumed with today's code.

The save/resume round trip of today's code (``test_train.py``) cannot see a change that
breaks what older versions wrote: a state the save renames and the load then looks for under
the new name only, a key of an old ``config.toml`` no longer read, an RNG or data position
restored another way. These tests resume each golden for its next steps and compare the
state right after the load, and the losses, bit for bit.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from bloomline.common.errors import UserError
from bloomline.trainer.checkpoint import load_config_of
from bloomline.trainer.checkpoint.legacy import upgrade_checkpoint
from bloomline.trainer.cli import app
from bloomline.trainer.config import Config
from bloomline.trainer.survival.run_folder import check_start_point

GOLDEN = Path(__file__).parent / "golden"
_spec = importlib.util.spec_from_file_location("make_golden", GOLDEN / "make_golden.py")
make_golden = importlib.util.module_from_spec(_spec)
sys.modules["make_golden"] = make_golden  # (its dataclass looks its module up)
_spec.loader.exec_module(make_golden)

NAMES = sorted(p.name for p in GOLDEN.iterdir() if (p / "golden.json").is_file())
NEWEST = NAMES[-1]
LEGACY = "01-rng-pickle"  # the newest golden of the format before manifests
_resumed: dict[str, object] = {}


def _golden(name: str) -> dict:
    return json.loads((GOLDEN / name / "golden.json").read_text())


def _resume(name: str, tmp_path_factory):
    """The golden resumed with today's code, once per session (the format test reuses it)."""
    if name not in _resumed:
        _resumed[name] = make_golden.resume_golden(GOLDEN / name,
                                                   tmp_path_factory.mktemp(name))
    return _resumed[name]


def _same_numerics(recorded: dict) -> bool:
    """Whether this machine computes as the one that recorded the losses: the torch, its CPU
    kernels (AVX2 and AVX-512 sum in other orders) and the CPU's vendor (the fp32 linear
    kernel ``auto`` picks)."""
    here = make_golden.environment()
    return all(here[key] == recorded[key] for key in ("torch", "cpu_capability", "cpu_vendor"))


@pytest.mark.compat
@pytest.mark.parametrize("name", NAMES)
def test_golden_checkpoint_resumes_bitwise(name, tmp_path_factory):
    """Bug: a change of the checkpoint format or of the resume that breaks checkpoints older
    versions wrote while today's own round trip still passes: a state the save dropped or
    renamed and the load no longer finds (or silently leaves at its initial value), an old
    ``config.toml`` key no longer read, the RNG or the data position restored another way
    (a draw between the restore and the first step once changed every dropout mask).

    Right after today's load the weights, optimizer moments and steps, the three generators'
    states, the step and the data position equal what the golden holds, bit for bit
    (``state_sha256``, any machine); the next losses equal the recorded ones bit for bit on a
    machine of the recording's numerics (torch, CPU kernels, vendor), else to 1e-5: their
    last bits depend on the kernels, not on the checkpoint."""
    golden = _golden(name)
    resumed = _resume(name, tmp_path_factory)
    assert resumed.digest == golden["state_sha256"], (
        f"{name} (written by {golden['commit'][:10]}): today's load does not restore the "
        "state the checkpoint holds")
    steps = range(golden["step"] + 1, golden["step"] + golden["continue_steps"] + 1)
    got = [resumed.losses.get(step) for step in steps]
    expected = [float.fromhex(h) for h in golden["expected"]["losses"]]
    assert None not in got, f"{name}: resumed steps {sorted(resumed.losses)}"
    if _same_numerics(golden["expected"]["environment"]):
        assert [v.hex() for v in got] == golden["expected"]["losses"], (
            f"{name}: losses {got}, recorded at {golden['expected']['recorded_at'][:10]} "
            f"{expected}")
    else:
        assert got == pytest.approx(expected, rel=1e-5, abs=0), name


def test_todays_format_has_a_golden(tmp_path_factory):
    """Bug: a change of what a save writes (a file, a key of trainer_state.json, rng.json or
    the manifest, the manifest's version, DCP's entries by name and dtype) without a golden
    of the new format: the checkpoints it writes would never be tested for loading in later
    versions. A checkpoint today's code writes has the format of the newest golden, else add
    one (``golden/README.md``: ``make_golden.py make HEAD --name NN-...``) and keep the
    older ones loading."""
    resumed = _resume(NEWEST, tmp_path_factory)
    saved = sorted((resumed.run_dir / "checkpoints").iterdir())[-1]
    today = make_golden.comparable(make_golden.signature(saved))
    newest = make_golden.comparable(_golden(NEWEST)["signature"])
    changed = {key: {"today": today.get(key), "golden": newest.get(key)}
               for key in sorted(set(today) | set(newest)) if today.get(key) != newest.get(key)}
    assert not changed, (f"the checkpoint format changed since golden {NEWEST}: add a golden "
                         f"of today's format (golden/README.md); differences: {changed}")


def test_goldens_are_small():
    """Bug: a golden regenerated with a bigger model or more steps: the repository carries
    every golden forever, so each stays a few hundred KB."""
    for name in NAMES:
        size = sum(p.stat().st_size for p in (GOLDEN / name).rglob("*") if p.is_file())
        assert size < 600_000, f"{name}: {size} bytes"


def test_legacy_checkpoint_is_refused_by_a_load_naming_the_upgrade(tmp_path):
    """Bug: a checkpoint of the format before manifests refused as merely "damaged or
    incomplete", with no way to continue it named."""
    copy = tmp_path / "step_00000006"
    shutil.copytree(GOLDEN / LEGACY / "checkpoint", copy)
    with pytest.raises(UserError) as err:
        load_config_of(copy, Config)
    assert "format before manifests" in str(err.value)
    assert f"trainer upgrade-checkpoint {copy} NEW" in str(err.value)


def test_run_folder_of_legacy_checkpoints_is_not_overwritten(tmp_path):
    """Bug: ``--resume auto`` saw no checkpoint in a run folder of checkpoints of the format
    before manifests (they have no manifest), trained from step 0 and replaced the old run's
    checkpoint of the same step with its own. Refused in one line naming the upgrade, also
    for a resume of an upgraded copy of an older step; a legacy step at or before the one
    resumed is left alone (nothing writes it)."""
    run = tmp_path / "run"
    shutil.copytree(GOLDEN / LEGACY / "checkpoint", run / "checkpoints" / "step_00000006")
    for setting, resumed, step in (("auto", None, 0), ("none", None, 0),
                                   ("/x/step_00000004", Path("/x/step_00000004"), 4)):
        with pytest.raises(UserError) as err:
            check_start_point(run, setting, resumed, step)
        assert "format before manifests (step_00000006)" in str(err.value)
        assert "\n" not in str(err.value)
    check_start_point(run, "/x/step_00000006", Path("/x/step_00000006"), 6)


def test_upgrade_command_writes_a_verified_checkpoint(tmp_path):
    """Bug: ``trainer upgrade-checkpoint`` leaving a checkpoint today's verification refuses,
    or changing the old folder."""
    before = {p.name: p.read_bytes() for p in (GOLDEN / LEGACY / "checkpoint").iterdir()}
    target = tmp_path / "upgraded"
    result = CliRunner().invoke(app, ["upgrade-checkpoint", str(GOLDEN / LEGACY / "checkpoint"),
                                      str(target)])
    assert result.exit_code == 0, result.output
    assert result.output.startswith(f"ok: {target}: 5 files, ")
    result = CliRunner().invoke(app, ["verify-checkpoint", str(target)])
    assert result.exit_code == 0, result.output
    assert {p.name: p.read_bytes() for p in (GOLDEN / LEGACY / "checkpoint").iterdir()} == before
    result = CliRunner().invoke(app, ["upgrade-checkpoint", str(target), str(tmp_path / "x")])
    assert isinstance(result.exception, UserError)
    assert "today's format, nothing to upgrade" in str(result.exception)


class _Foreign:
    """A class no allowlist admits."""


def test_upgrade_refuses_a_foreign_pickle_in_rng_pt(tmp_path):
    """Bug: the upgrade reads ``rng.pt``, a pickle, from a folder nothing vouches for; it must
    admit nothing but the generator states' types (a global of the file's choosing would run
    code), refused in one line, no output written."""
    copy = tmp_path / "old"
    shutil.copytree(GOLDEN / LEGACY / "checkpoint", copy)
    torch.save({"python": _Foreign(), "numpy": None, "torch": None}, copy / "rng.pt")
    with pytest.raises(UserError) as err:
        upgrade_checkpoint(copy, tmp_path / "new")
    assert str(err.value).startswith(f"{copy / 'rng.pt'}: not the generator states")
    assert "\n" not in str(err.value)
    assert not (tmp_path / "new").exists()
