"""``trainer``: pretrain, generate, export-hf, verify-checkpoint, upgrade-checkpoint, evaluate,
config, plot, plan.

Each command imports the trainer modules it uses inside its function: they load torch (a few
seconds), which ``trainer --help``, a mistyped option and the ``--nproc`` launcher's own
process do without."""

from __future__ import annotations

import json
import os
import sys

import typer

from bloomline.common.errors import UserError, exit_on_user_error
from bloomline.common.stop_signals import StoppedError, StopSignals, Terminated
from bloomline.dataprep.cli_app import command_line_app
from bloomline.dataprep.tokenizer import TOKENIZER_SPEC_HELP

app = command_line_app("trainer", "bloomline-trainer",
                       help="Train the BLOOM-recipe GPT on samples prepared by dataprep.")


@app.command("pretrain", context_settings={"allow_extra_args": True,
                                           "ignore_unknown_options": True})
def pretrain(
    ctx: typer.Context,
    config: str = typer.Option(None, help="TOML recipe (see configs/); defaults otherwise."),
    resume: str = typer.Option(None, help="auto, none or a checkpoint folder "
                               "(= checkpoint.resume)."),
    nproc: int = typer.Option(0, help="Start this many processes on this node (torchrun's "
                              "--nproc-per-node) and train in all of them; 0: this process "
                              "(or the ones torchrun started)."),
    nnodes: int = typer.Option(1, help="With --nproc: number of nodes, each running this same "
                               "command."),
    rdzv_endpoint: str = typer.Option("", help="With --nnodes > 1: HOST:PORT of the first node, "
                                      "where the nodes meet (c10d rendezvous)."),
    max_restarts: int = typer.Option(0, help="After a rank dies, restart all ranks from the "
                                     "newest checkpoint, up to this many times (torchrun's "
                                     "--max-restarts); without --nproc: one process."),
) -> None:
    """Train a model from a recipe. Extra arguments override the recipe: section.key=value
    (e.g. train.train_samples=2000 optimizer.lr=1e-3)."""
    overrides = list(ctx.args)
    if not nproc and (nnodes != 1 or rdzv_endpoint):
        raise UserError("--nnodes and --rdzv-endpoint go with --nproc (processes per node)")
    if max_restarts < 0:
        raise UserError(f"--max-restarts {max_restarts}: must be 0 or more")
    if max_restarts:
        nproc = nproc or 1  # restarts need torchrun's agent to watch the process
    if nproc:
        # torch-heavy: imported by the command that needs it (module docstring)
        from bloomline.trainer.parallel.launch import launch

        _check_before_launch(config, resume, overrides, nproc, nnodes, max_restarts)

        forwarded = ([f"--config={config}"] if config is not None else []) + (
            [f"--resume={resume}"] if resume is not None else []) + overrides
        launch(nproc, forwarded, nnodes=nnodes, rdzv_endpoint=rdzv_endpoint,
               max_restarts=max_restarts)
        return
    # torch-heavy: imported by the command that needs it (module docstring)
    from bloomline.trainer.loop import Trainer
    from bloomline.trainer.parallel import world_info
    from bloomline.trainer.run_spec import load_run

    if resume is not None:
        overrides.append(f"checkpoint.resume={resume}")

    def log(line: str) -> None:  # flushed: a run logs to files (SLURM, nohup), block-buffered
        print(line, flush=True)

    rank, _, world_size = world_info()
    spec = load_run(config, overrides, world_size, rank, log=log if rank == 0 else None)
    import torch.distributed as dist

    from bloomline.trainer.survival.preemption import StoppedBeforeTrainingError, exit_preempted

    try:
        state = Trainer(spec, log=log).run()
    except StoppedBeforeTrainingError as stopped:
        # nothing trained, nothing lost: the preempted run's exit (a requeue starts it again)
        if dist.is_initialized():
            dist.destroy_process_group()
        print(f"stopped: {stopped}", file=sys.stderr, flush=True)
        exit_preempted()
    except UserError:
        # every rank refuses together (rank 0's verdict is broadcast): leave no process group
        # for interpreter exit, where gloo's threads can abort ("terminate called without an
        # active exception") after the one-line error
        if dist.is_initialized():
            dist.destroy_process_group()
        raise
    except Exception as error:
        from bloomline.trainer.parallel.peer_failure import peer_failure

        cause = peer_failure(error) if world_size > 1 else ""
        if not cause:
            raise  # a bug here: its traceback
        # another rank failed first and says why in its own line: one line here, not gloo's
        # traceback; os._exit: the broken process group can hang or abort an orderly exit
        print(f"rank {rank}: stopped: another process of the run ended during a collective "
              f"({cause}); its own error says why", file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(1)
    if dist.is_initialized():
        dist.destroy_process_group()
    if state.stopped:  # a signal or train.max_wallclock: saved, to be continued
        exit_preempted()


def _check_before_launch(config: str | None, resume: str | None, overrides: list[str],
                         nproc: int, nnodes: int, max_restarts: int) -> None:
    """The launcher loads and validates the config (every field's range, the rules between
    fields, the layout of ``nproc`` x ``nnodes`` processes) before it starts any: an error is
    printed once, by this process, instead of by every rank (and again at every restart).

    With restarts: every restart runs the same command, and only ``checkpoint.resume=auto``
    continues from the newest checkpoint. A fixed folder would start each restart from that
    folder again (and ``none`` from scratch), throwing away the steps since, so the
    combination is refused rather than converted: "PATH, then auto" would be a third meaning
    of the setting, and "auto" alone ignores PATH while the run folder has no checkpoint yet."""
    # torch-heavy: imported by the command that needs it (module docstring)
    from bloomline.trainer.config import load_trainer_config
    from bloomline.trainer.run_spec import load_run

    overrides = overrides + ([f"checkpoint.resume={resume}"] if resume is not None else [])
    # the combination first: it is wrong whatever the folder holds (settling inspects it)
    setting = load_trainer_config(config, overrides).checkpoint.resume
    if max_restarts and setting != "auto":
        start = "scratch" if setting == "none" else setting
        raise UserError(f"--max-restarts {max_restarts} with checkpoint.resume {setting}: every "
                        f"restart would start again from {start}; use --resume auto (run once "
                        "without restarts to get a first checkpoint in train.run_dir)")
    world = nproc * nnodes if nproc >= 1 and nnodes >= 1 else None  # else launch() says why
    load_run(config, overrides, world)


def _load_for_inference(checkpoint: str, command: str):
    """The checkpoint ``command`` reads (a run folder's newest: ``path_kind.py``), its
    config and its model."""
    # torch-heavy: imported by the command that needs it (module docstring)
    from bloomline.trainer.checkpoint import load_checkpoint, load_config_of
    from bloomline.trainer.checkpoint.path_kind import checkpoint_to_read
    from bloomline.trainer.config import Config
    from bloomline.trainer.model import build_model

    path = checkpoint_to_read(checkpoint, command, lambda line: typer.echo(line, err=True))
    cfg = load_config_of(path, Config)
    model = build_model(cfg.model, "cpu", seed=None)
    load_checkpoint(path, model)
    return path, cfg, model


@app.command("generate")
def generate(
    checkpoint: str = typer.Argument(..., help="A checkpoint folder (RUN/checkpoints/step_N), "
                                    "or a run folder: its latest checkpoint."),
    prompt: str = typer.Option(..., help="Text to continue."),
    max_new_tokens: int = typer.Option(48, help="Tokens to generate."),
    temperature: float = typer.Option(0.0, help="0: greedy; > 0: sample."),
    top_k: int = typer.Option(0, help="Sample among the k most likely (0: all)."),
    top_p: float = typer.Option(1.0, help="Sample within this probability mass."),
    tokenizer: str = typer.Option(
        None, help=f"Tokenizer: {TOKENIZER_SPEC_HELP} (default: the checkpoint's copy in "
        "CHECKPOINT/tokenizer/, else data.tokenizer of its config)."),
    seed: int = typer.Option(0, help="Sampling seed."),
) -> None:
    """Continue a prompt with a checkpoint (a sanity check of what the model learned)."""
    # torch-heavy: imported by the command that needs it (module docstring)
    from bloomline.trainer.checkpoint import inference_tokenizer
    from bloomline.trainer.data import load_run_tokenizer
    from bloomline.trainer.generate import (
        check_sampling_options,
        continuation_text,
        generate_ids,
    )

    check_sampling_options(max_new_tokens, temperature, top_k, top_p)  # before any loading
    path, cfg, model = _load_for_inference(checkpoint, "generate")
    cfg.data.tokenizer = inference_tokenizer(path, cfg.data.tokenizer, tokenizer)
    if not cfg.data.tokenizer:
        raise UserError(f"{checkpoint}: its config has no data.tokenizer; pass --tokenizer")
    tok = load_run_tokenizer(cfg.data)
    prompt_ids = [int(i) for i in tok.encode_batch([prompt])[0]]
    ids = generate_ids(model, prompt_ids, max_new_tokens, temperature, top_k, top_p,
                       tok.special_ids.get("eod"), seed, vocab_size=tok.vocab_size,
                       unassigned_ids=tok.unassigned_ids())
    typer.echo(prompt + continuation_text(tok, prompt_ids, ids))


@app.command("export-hf")
def export_hf_command(
    checkpoint: str = typer.Argument(..., help="A checkpoint folder, or a run folder: its "
                                    "latest checkpoint."),
    out_dir: str = typer.Argument(..., help="Output folder (transformers BLOOM format)."),
    overwrite: bool = typer.Option(False, help="Replace an existing output folder."),
    tokenizer: str = typer.Option(
        None, help=f"Tokenizer to export with the model: {TOKENIZER_SPEC_HELP} (default: the "
        "checkpoint's copy in CHECKPOINT/tokenizer/, else data.tokenizer of its config)."),
) -> None:
    """Write a checkpoint as a transformers BloomForCausalLM (config.json + safetensors) with
    its tokenizer as files AutoTokenizer loads (tokenizer.json + tokenizer_config.json)."""
    # torch-heavy: imported by the command that needs it (module docstring)
    from bloomline.trainer.checkpoint import inference_tokenizer
    from bloomline.trainer.data import load_run_tokenizer
    from bloomline.trainer.hf import export_hf

    path, cfg, model = _load_for_inference(checkpoint, "export-hf")
    cfg.data.tokenizer = inference_tokenizer(path, cfg.data.tokenizer, tokenizer)
    tok = load_run_tokenizer(cfg.data)
    # SIGTERM, like Ctrl-C, unwinds through the export's cleanup: no partial folder is left
    with StopSignals():
        try:
            out = export_hf(model.state_dict(), cfg.model, out_dir, tokenizer=tok,
                            overwrite=overwrite)
        except Terminated:
            raise StoppedError(f"export-hf: stopped by SIGTERM; removed the partial export "
                               f"of {out_dir} (nothing was written)") from None
    if tok is None:
        typer.echo(f"wrote {out_dir} (model only: the checkpoint's config has no "
                   "data.tokenizer; pass --tokenizer to export one)")
    else:
        files = sorted(p.name for p in out.iterdir() if p.name.startswith("tokenizer"))
        typer.echo(f"wrote {out_dir} (model and {tok.kind} tokenizer {tok.name}: "
                   f"{', '.join(files)})")


@app.command("verify-checkpoint")
def verify_checkpoint_command(
    checkpoint: str = typer.Argument(..., help="A checkpoint folder (RUN/checkpoints/step_N)."),
) -> None:
    """Check a checkpoint against its manifest (sizes, sha256, parsable state files), then
    read DCP's pickles as a load would (DCP's classes only) without loading the model. Exit 0
    when intact; 1 with one line per problem (or the refused pickle) otherwise."""
    # torch-heavy: imported by the command that needs it (module docstring)
    from bloomline.trainer.checkpoint.manifest import describe_checkpoint, verify_checkpoint
    from bloomline.trainer.checkpoint.path_kind import refuse_non_checkpoint

    refuse_non_checkpoint(checkpoint, "verify-checkpoint")
    problems = verify_checkpoint(checkpoint)
    if problems:
        for problem in problems[:-1]:  # in order; the last one is the UserError's line
            typer.echo(f"error: {checkpoint}: {problem}", err=True)
        raise UserError(f"{checkpoint}: {problems[-1]}")
    files, size, step = describe_checkpoint(checkpoint)
    typer.echo(f"ok: {checkpoint}: {files} files, {size} bytes, step {step}")


@app.command("upgrade-checkpoint")
def upgrade_checkpoint_command(
    checkpoint: str = typer.Argument(..., help="A checkpoint folder written before manifests "
                                     "(it has rng.pt, no manifest.json)."),
    out_dir: str = typer.Argument(..., help="New folder: the same checkpoint in today's "
                                  "format (resume it with checkpoint.resume=OUT_DIR)."),
) -> None:
    """Convert a checkpoint of the format before manifests (bloomline until 2026-11-25), which
    today's loads refuse, into today's: the same tensors, generator states, step and config,
    with a manifest. The old folder is left as it is."""
    # torch-heavy: imported by the command that needs it (module docstring)
    from bloomline.trainer.checkpoint.legacy import upgrade_checkpoint
    from bloomline.trainer.checkpoint.manifest import describe_checkpoint

    target = upgrade_checkpoint(checkpoint, out_dir)
    files, size, step = describe_checkpoint(target)
    typer.echo(f"ok: {target}: {files} files, {size} bytes, step {step}; resume it with "
               f"checkpoint.resume={target}")


@app.command("evaluate")
def evaluate_command(
    checkpoint: str = typer.Argument(..., help="A checkpoint folder (RUN/checkpoints/step_N), "
                                    "or a run folder: its latest checkpoint."),
    split: str = typer.Option(None, help="valid, test (a share of data.split) or all (the "
                              "whole corpus); default: valid on the run's corpus (or a copy), "
                              "all on another corpus given with --data."),
    samples: int = typer.Option(None, help="Samples of the blend and of each dataset at most "
                                "(default: the run's train.eval_samples)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of the table."),
    data: str = typer.Option(None, help="The corpus folder to read instead of the "
                             "checkpoint's data.corpus: a copy of it, or any corpus of the "
                             "run's tokenizer (each dataset scored on its own, the blend by "
                             "size); its index is built or found in DATA/.index."),
) -> None:
    """Loss and perplexity of a checkpoint on a split of its run's data (or of another corpus
    of its tokenizer): each dataset's own split and the blend, in this process, with the
    run's precision and micro-batch size. What is scored is said in one line on stderr."""
    import json

    # torch-heavy: imported by the command that needs it (module docstring)
    from bloomline.trainer.evaluate_command import evaluate_checkpoint

    checked: list[str] = []  # said once it succeeded: a refusal stays one line
    result, step, scored = evaluate_checkpoint(checkpoint, split, samples, corpus=data,
                                               log=checked.append)
    for line in (*checked, scored.note):
        typer.echo(line, err=True)
    if as_json:
        typer.echo(json.dumps({"checkpoint": checkpoint, "step": step, **result.to_json(),
                               "corpus": scored.corpus, "runs_corpus": scored.runs_corpus},
                              indent=1))
        return
    what = "the whole corpus" if scored.split == "all" else f"{scored.split} split"
    typer.echo(f"{checkpoint} (step {step}), {what}:")
    typer.echo(result.table())


@app.command("config", context_settings={"allow_extra_args": True,
                                         "ignore_unknown_options": True})
def config_command(
    ctx: typer.Context,
    config: str = typer.Option(None, help="TOML recipe (see configs/); defaults otherwise."),
    resume: str = typer.Option(None, help="As pretrain's --resume (= checkpoint.resume)."),
    doc: bool = typer.Option(False, "--doc", help="List every key: type, default, allowed "
                             "values and what it does (with --config: also its value)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of TOML / text."),
) -> None:
    """Print the config `trainer pretrain` would run with the same --config and
    section.key=value arguments: the settled run spec (TOML: renamed keys applied, defaults
    filled, paths absolute, the model of a checkpoint to resume or checkpoint.init_from
    adopted, the vocabulary and precision resolved, every rule checked), or with --doc every
    key. A bad key or value fails with pretrain's one-line error."""
    # torch-heavy: imported by the command that needs it (module docstring)
    from bloomline.trainer.config_doc import config_json, config_toml, key_docs
    from bloomline.trainer.run_spec import load_run

    overrides = list(ctx.args) + ([f"checkpoint.resume={resume}"] if resume is not None else [])
    given = config is not None or bool(overrides)
    # the spec pretrain would run (its world: parallel.world_size, else the layout's smallest);
    # the tokenizer is read only to size a vocabulary of 0
    cfg = (load_run(config, overrides, check_tokenizer=False).config
           if given or not doc else None)
    if doc:
        typer.echo(key_docs(cfg, as_json))
    else:
        typer.echo(config_json(cfg) if as_json else config_toml(cfg), nl=False)
@app.command("plot")
def plot_command(
    run_dir: str = typer.Argument(..., help="A run folder (train.run_dir)."),
    output: str = typer.Option(None, help="Output .png file (default: RUN/plot.png, redrawn "
                               "each time)."),
    overwrite: bool = typer.Option(False, help="Replace an existing --output PNG."),
) -> None:
    """PNG of a run's curves from its metrics.jsonl: loss (train, valid, per dataset),
    learning rate, gradient norm, throughput and MFU, with rollbacks and skipped steps marked.
    Needs the plot extra: pip install 'bloomline-trainer[plot]'."""
    # matplotlib (the plot extra) and the records reader: only this command needs them
    from bloomline.trainer.reporting.plot import plot_run

    result = plot_run(run_dir, output, overwrite)
    marks = [f"{len(result[key])} {key}" for key in ("rollbacks", "spikes", "skipped")
             if result[key]]
    typer.echo(f"wrote {result['out']}: {result['train_records']} train records (steps "
               f"{result['first_step']}-{result['last_step']}), {result['valid_records']} "
               f"valid" + (f", {', '.join(marks)}" if marks else ""))
    if result["bad_lines"]:
        typer.echo(f"note: skipped {len(result['bad_lines'])} lines of metrics.jsonl that did "
                   f"not parse (line {result['bad_lines'][0]} first: a record cut short by a "
                   "killed process)", err=True)


# the most the interpreter may take to exit once a command is done (joining threads, atexit)
@app.command("plan", context_settings={"allow_extra_args": True,
                                       "ignore_unknown_options": True})
def plan_command(
    ctx: typer.Context,
    config: str = typer.Option(..., help="TOML recipe (see configs/)."),
    gpu: str = typer.Option("a100-80gb", help="Device: a100-40gb, a100-80gb, h100-80gb, h200."),
    gpu_set: list[str] = typer.Option([], "--gpu-set", help="Override a device field, e.g. "
                                      "network_bytes_per_s=6.25e9 (repeatable)."),
    nodes: int = typer.Option(0, help="Plan this many nodes (x --gpus-per-node) instead of "
                              "the recipe's parallel.world_size; its tp and pp are kept, dp "
                              "follows."),
    gpus_per_node: int = typer.Option(8, help="GPUs per node (with --nodes)."),
    rank: list[int] = typer.Option([], "--rank", help="A rank to build (repeatable; default: "
                                   "the first, a middle and the last)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
    search: bool = typer.Option(False, "--search", help="Rank every layout of the model on "
                                "these GPUs that fits (tp, pp, dp, ZeRO stage, micro-batch, "
                                "recomputation, sp) by predicted speed; show the top five."),
    trace: bool = typer.Option(True, "--trace/--no-trace", help="Run one training step of "
                               "each rank on fake tensors under torch's memory tracker (the "
                               "default; seconds per rank) or give the formulas only."),
) -> None:
    """Dry run of a recipe at its full world size (parallel.world_size, or --nodes), without
    the hardware: chosen ranks built as `trainer pretrain` builds them, under a fake process
    group (layers, embedding/head placement, vocabulary shards); one training step of each
    traced on fake tensors with torch's memory tracker, its peak by kind against the device
    beside the formulas'; and the time model's step time, tokens/s, TFLOP/s per GPU and MFU.
    With --search: the layouts that fit, fastest first, and where the recipe's own ranks."""
    # torch-heavy: imported by the command that needs it (module docstring)
    from bloomline.trainer.config import load_trainer_config
    from bloomline.trainer.plan.planner import (
        format_plan,
        gpu_from_options,
        plan_run,
        plan_world,
    )

    device = gpu_from_options(gpu, gpu_set)
    cfg = load_trainer_config(config, list(ctx.args))
    note = plan_world(cfg, nodes, gpus_per_node)  # the recipe's world, or --nodes in its place
    world = cfg.parallel.world_size
    if note and not as_json:
        typer.echo(note)
    if search:
        from bloomline.trainer.plan.planner import search_run

        text, result = search_run(cfg, world, device)
        typer.echo(json.dumps({**result, "note": note}, indent=1) if as_json else text)
        return
    ranks = rank or sorted({0, world // 2, world - 1})
    result = plan_run(cfg, world, ranks, device, trace=trace)
    typer.echo(json.dumps({**result, "note": note}, indent=1) if as_json
               else format_plan(result))


EXIT_DEADLINE_SECONDS = 30.0


def main() -> None:
    """The process's entry point (``trainer``, ``python -m bloomline.trainer``). Whatever the
    command's outcome, the process then ends within ``EXIT_DEADLINE_SECONDS``: a thread or
    child that would keep it alive past that (a bug: the loop stops its loader workers and
    waits for its saves) gets every thread's stack dumped to stderr and the process ends with
    exit code 1, instead of a job that printed its error and hangs until its time limit.
    Called in-process (tests), it arms nothing."""
    try:
        if "TORCHELASTIC_ERROR_FILE" in os.environ:  # a torchrun worker: tell the launcher too
            # torch-heavy: imported by the command that needs it (module docstring)
            from bloomline.trainer.parallel.launch import report_user_errors

            exit_on_user_error(lambda: report_user_errors(app))
        else:
            exit_on_user_error(app)
    finally:
        if _is_process_entry():
            import faulthandler

            faulthandler.dump_traceback_later(EXIT_DEADLINE_SECONDS, exit=True)


def _is_process_entry() -> bool:
    """Whether this process was started to run ``main`` (and ends when it returns)."""
    import sys

    entry = sys.modules.get("__main__")
    spec = getattr(entry, "__spec__", None)
    if spec is not None:  # python -m bloomline.trainer
        return spec.name == "bloomline.trainer.__main__"
    return getattr(entry, "main", None) is main  # the console script imports and calls it
