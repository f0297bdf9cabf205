"""Starting a run from a model (``checkpoint.init_from``) and resuming one: where the model
settings come from, what is fresh, and what a resume says about settings that changed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from trainer_fixtures import tiny_config

from bloomline.common.errors import UserError
from bloomline.trainer import checkpoint as ckpt
from bloomline.trainer.hf import export_hf
from bloomline.trainer.loop import Trainer
from bloomline.trainer.model_source import resolve_model_settings
from bloomline.trainer.run_spec import load_run

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


def _config(corpus, run_dir, **sections):
    cfg = tiny_config(corpus, run_dir, **sections)
    cfg.monitor.peak_flops = 1e12  # no start-up matmul timing: these tests do not read MFU
    return cfg


def _quiet(cfg) -> Trainer:
    return Trainer(cfg, log=lambda line: None)


def _adam_steps(optimizer) -> set[float]:
    return {float(state["step"]) for state in optimizer.state.values()}


def test_a_checkpoint_before_the_first_step_records_no_optimizer_step(corpus, tmp_path):
    """Catches: DCP's ``get_state_dict`` initializing an unstepped optimizer with a zero-lr
    ``step()`` and that counter being saved, so that the first real update after loading
    uses the second step's bias correction: one step after resuming a step-0 checkpoint must
    give bitwise the weights of one step of a fresh trainer."""
    saver = _quiet(_config(corpus, tmp_path / "a"))
    path = saver.save()
    assert _adam_steps(saver.optimizer) == {0.0}  # the live optimizer is left at step 0 too
    resumed = _quiet(_config(corpus, tmp_path / "b", checkpoint={"resume": str(path)}))
    resumed.resume()
    assert _adam_steps(resumed.optimizer) == {0.0}
    fresh = _quiet(_config(corpus, tmp_path / "c"))
    batch = [torch.randint(0, 96, (2, 33), generator=torch.Generator().manual_seed(i))
             for i in range(2)]
    for trainer in (resumed, fresh):
        trainer.train_step(batch, lr=1e-2)
    for (name, a), b in zip(resumed.model.state_dict().items(),
                            fresh.model.state_dict().values(), strict=True):
        assert torch.equal(a, b), name


@pytest.fixture
def hf_source(corpus, tmp_path) -> Path:
    """A transformers folder of a model shaped unlike the recipe (3 layers, hidden 48)."""
    cfg = _config(corpus, tmp_path / "unused")
    cfg.model.num_layers, cfg.model.hidden_size = 3, 48
    torch.manual_seed(5)
    source = Trainer(cfg, log=lambda line: None).model.state_dict()
    return export_hf(source, cfg.model, tmp_path / "hf")


def test_init_from_takes_the_sources_shape_and_weights_and_starts_fresh(corpus, tmp_path,
                                                                        hf_source):
    """Catches: ``init_from`` training the recipe's random model (the old import's silent
    fresh start), keeping the recipe's shape, or carrying anything but the weights: step 0,
    sample 0, an empty optimizer."""
    from bloomline.trainer.hf import import_hf

    cfg = _config(corpus, tmp_path / "run", checkpoint={"init_from": str(hf_source)})
    trainer = _quiet(cfg)
    assert (trainer.cfg.model.num_layers, trainer.cfg.model.hidden_size) == (3, 48)
    assert trainer.cfg.model.attention == "auto"  # a compute field: the recipe's
    assert trainer.resume() is None
    _, weights = import_hf(hf_source)
    for name, value in trainer.model.state_dict().items():
        assert torch.equal(value, weights[name]), name
    assert not trainer.optimizer.state and trainer.state.step == 0
    assert trainer.state.consumed_samples == 0


def test_an_override_that_contradicts_the_source_names_both(corpus, tmp_path, hf_source):
    """Catches: a command-line model setting silently dropped (or silently obeyed, building a
    model the weights do not fit), while the recipe's own [model] section is replaced."""
    base = [f"data.corpus={corpus}", f"train.run_dir={tmp_path / 'run'}",
            f"checkpoint.init_from={hf_source}"]
    cfg = load_run("configs/tiny-cpu.toml" if Path("configs/tiny-cpu.toml").is_file()
                   else None, [*base, "model.hidden_size=48"], check_tokenizer=False).config
    assert cfg.model.hidden_size == 48 and cfg.model.num_layers == 3
    with pytest.raises(UserError, match=r"model.num_layers = 4 contradicts checkpoint.init_from"
                                        r" .*hf, which has 3"):
        load_run(None, [*base, "model.num_layers=4"], check_tokenizer=False)


def test_a_run_folder_with_checkpoints_resumes_and_ignores_init_from(corpus, tmp_path,
                                                                     hf_source):
    """Catches: a restarted run (requeue, --max-restarts) that starts from ``init_from``
    again, throwing away its steps."""
    cfg = _config(corpus, tmp_path / "run", checkpoint={"init_from": str(hf_source)},
                  train={"exit_interval": 5})
    _quiet(cfg).run()
    lines = []
    again = _config(corpus, tmp_path / "run", checkpoint={"init_from": str(hf_source)})
    resumed = Trainer(again, log=lines.append)
    assert resumed.resume().name == "step_00000005" and resumed.state.step == 5
    assert any("init_from" in line and "ignored" in line for line in lines)


def test_init_from_a_folder_that_is_no_model_is_one_line(corpus, tmp_path):
    """Catches: a typo in init_from that trains a random model, or fails deep in a loader."""
    (tmp_path / "empty").mkdir()
    for where, match in ((tmp_path / "missing", "no such file or folder"),
                         (tmp_path / "empty", "neither a bloomline checkpoint")):
        with pytest.raises(UserError, match=match):
            _quiet(_config(corpus, tmp_path / "run", checkpoint={"init_from": str(where)}))


def test_resume_keeps_the_checkpoints_padded_vocabulary(corpus, tmp_path):
    """Catches: ``model.vocab_size = 0`` re-deriving the padding from this run's tensor-parallel
    size at resume, so that a tp2 run (rows padded to 256 x k) cannot continue in one process
    (128 x k): the checkpoint's rows are kept."""
    cfg = _config(corpus, tmp_path / "run", train={"exit_interval": 5})
    cfg.model.vocab_size = 256  # as a tp2 run pads a vocabulary of up to 256 ids
    _quiet(cfg).run()
    again = _config(corpus, tmp_path / "run")
    again.model.vocab_size = 0  # sized from the tokenizer: 128 rows for these 96 ids
    source = resolve_model_settings(again)
    assert source.kind == "resume" and again.model.vocab_size == 256


@pytest.mark.slow
def test_resume_lists_changed_settings_and_the_new_values_win(corpus, tmp_path):
    """Catches: a resume that silently keeps the checkpoint's optimizer hyper-parameters
    (DCP restores each param group's betas, eps and weight decay) when the config changed
    them, or changes them without saying so."""
    cfg = _config(corpus, tmp_path / "run", train={"exit_interval": 5})
    _quiet(cfg).run()
    lines = []
    again = _config(corpus, tmp_path / "run", optimizer={"beta2": 0.9, "weight_decay": 0.0})
    trainer = Trainer(again, log=lines.append)
    trainer.resume()
    changed = [line for line in lines if "differ from the checkpoint" in line]
    assert len(changed) == 1
    assert "optimizer.beta2 0.95 -> 0.9" in changed[0]
    assert "optimizer.weight_decay 0.1 -> 0.0" in changed[0]
    for group in trainer.optimizer.param_groups:
        assert group["betas"] == (0.9, 0.9) and group["weight_decay"] == 0.0


def test_the_trainer_state_of_an_init_run_says_where_it_started(corpus, tmp_path, hf_source):
    """Catches: a run folder that does not record which model its run started from."""
    cfg = _config(corpus, tmp_path / "run", checkpoint={"init_from": str(hf_source)},
                  train={"train_samples": 8})
    _quiet(cfg).run()
    info = json.loads((tmp_path / "run" / "run_info.json").read_text())
    assert info["initialized_from"] == str(hf_source)
    saved = ckpt.load_config_of(ckpt.list_checkpoints(tmp_path / "run")[-1], type(cfg))
    assert saved.model.num_layers == 3 and saved.checkpoint.init_from == str(hf_source)


def _init_from_at_dp2(corpus: str, run_dir: str, source: str) -> dict:
    """One rank of a dp2 ZeRO-1 bf16 run (the buffers engine) started from ``source``: its
    whole fp32 masters and its bf16 parameters, gathered."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    cfg = _config(Path(corpus), Path(run_dir), checkpoint={"init_from": source},
                  parallel={"zero_stage": 1}, precision={"dtype": "bf16"})
    trainer = _quiet(cfg)
    assert trainer.resume() is None
    params = get_model_state_dict(trainer.model, options=StateDictOptions(full_state_dict=True))
    return {"masters": trainer.full_model_state(),
            "params": {name: value.cpu() for name, value in params.items()},
            "engine": type(trainer.optimizer).__name__}


@pytest.mark.slow
def test_init_from_at_dp2_fills_the_fp32_masters_and_the_bf16_parameters(corpus, tmp_path,
                                                                         hf_source):
    """Catches: on the buffers engine (bf16 parameters, fp32 masters sharded over dp)
    ``init_from`` writing the source into the bf16 parameters only, so the first step
    overwrites them with the recipe's random masters, or each rank taking the wrong rows: the
    masters must equal the source's fp32 weights exactly, the parameters their bf16 roundings."""
    from bloomline.trainer.hf import import_hf
    from bloomline.trainer.parallel.local_processes import run_distributed

    _, weights = import_hf(hf_source)
    for rank in run_distributed(2, _init_from_at_dp2, str(corpus), str(tmp_path / "run"),
                                str(hf_source)):
        assert rank["engine"] == "DistributedOptimizer"
        for name, value in weights.items():
            assert torch.equal(rank["masters"][name], value.float()), name
            assert torch.equal(rank["params"][name], value.bfloat16()), name
