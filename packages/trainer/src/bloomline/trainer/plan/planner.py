"""`trainer plan`: chosen ranks of a recipe at its full world size, built for real on meta
tensors (``rank_build``), with the activations, the formulas and the time model beside them.

Per rank, the model states (parameters, gradients, optimizer state, working copies) are read
off the rank as the trainer builds it; the activations are Korthikanti et al.'s per-layer
formula (``memory_formulas``) times the layers that rank really holds and the micro-batches
its schedule keeps in flight; the total is compared with the device's memory. Beside the built
model states stands the ZeRO formula's figure for the same stage, and their ratio: a ratio far
from 1 means the build and the formula disagree about what the trainer keeps, which is worth a
look before renting 384 GPUs. The step time, tokens/s, TFLOP/s per GPU and MFU are the time
model's (``time_model``), for the whole layout.

``search_run`` (``--search``) ranks the layouts of the same model that fit by the time model
(``search.py``), by the formulas only (a trace per candidate would take hours). With
``trace`` (the default of ``trainer plan``) each chosen rank also runs one training step on
fake tensors under torch's memory tracker (``traced_step``), whose peak decides ``fits``.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from dataclasses import asdict

from torch import device as torch_device

from bloomline.common.errors import UserError
from bloomline.trainer.parallel.zero_engine import uses_buffers_engine
from bloomline.trainer.plan.devices import DEVICES, Device, device
from bloomline.trainer.plan.memory_formulas import (
    Layout,
    activation_memory,
    micro_batches_in_flight,
    model_state_bytes,
    peak_total,
)
from bloomline.trainer.plan.rank_build import RankPlan, build_rank
from bloomline.trainer.plan.search import format_search, search
from bloomline.trainer.plan.time_model import step_time

__all__ = ["activation_breakdown", "format_plan", "formula_layout", "gpu_from_options",
           "plan_run", "plan_world", "search_run"]

_GIB = 2 ** 30


def plan_world(cfg, nodes: int = 0, gpus_per_node: int = 8) -> str | None:
    """Settle the world ``cfg`` is planned at: its ``parallel.world_size``, or with ``nodes``
    ``nodes x gpus_per_node`` set as ``parallel.world_size`` (tp and pp of the recipe kept, dp
    follows). Returns the line that says so when that replaces the recipe's world, else None.

    Raises:
        UserError: no world stated and no ``nodes``.
    """
    stated = cfg.parallel.world_size
    if not nodes:
        if not stated:
            raise UserError("no world to plan: set parallel.world_size in the recipe (or "
                            "override it), or give --nodes N (and --gpus-per-node)")
        return None
    if nodes < 0 or gpus_per_node < 1:
        raise UserError(f"--nodes {nodes} x --gpus-per-node {gpus_per_node}: expected at "
                        "least 1 GPU")
    world = nodes * gpus_per_node
    cfg.parallel.world_size = world
    if stated in (0, world):
        return None
    gpus = "1 GPU" if world == 1 else f"{world} GPUs"
    return (f"planning {gpus} (--nodes {nodes} x {gpus_per_node}; the recipe states "
            f"parallel.world_size {stated})")


def formula_layout(cfg, built: RankPlan, target: str = "cuda") -> Layout:
    """The formulas' description of the layout ``built`` was built with (its padded
    vocabulary, its sizes), for a run on ``target`` (``cuda`` or ``cpu``); the trainer's
    FSDP2 engine and fp32 model states. Activations are 2 bytes in bf16/fp16, 4 in fp32
    (``precision.dtype`` ``auto`` is bf16 on a GPU, what the CPU resolves it to on ``cpu``);
    the residual stream is fp32 with ``model.residual_fp32``. On a GPU the attention runs as
    a fused kernel (``model.attention`` auto -> flex, or sdpa) that keeps no [s, s] scores
    for backward; eager attention (the CPU's ``auto``) stores them."""
    from bloomline.trainer.model.attention import resolve_kernel
    from bloomline.trainer.precision import resolve_dtype

    parallel, model = cfg.parallel, cfg.model
    schedule = "gpipe" if parallel.pipeline_schedule == "gpipe" else "1f1b"
    precision = copy.deepcopy(cfg.precision)
    if target == "cuda" and precision.dtype == "auto":
        precision.dtype = "bf16"
    resolve_dtype(precision, torch_device(target))
    activation_bytes = 4 if precision.dtype == "fp32" else 2
    kernel = resolve_kernel(model.attention, torch_device(target))
    states = {}
    if uses_buffers_engine(dataclasses.replace(cfg, precision=precision), built.dp):
        # the distributed optimizer: compute-dtype parameters, fp32 gradient buffers, an fp32
        # master (the parameter itself in fp32) and Adam's moments sharded over dp
        states = {"param_bytes": 2 if precision.dtype == "bf16" else 4, "grad_bytes": 4,
                  "optimizer_bytes": 12 if precision.dtype == "bf16" else 8,
                  "fsdp_engine": False}
    return Layout(
        layers=model.num_layers, hidden=model.hidden_size, heads=model.num_heads,
        vocab=built.vocab_size, seq=cfg.data.seq_length, micro_batch=cfg.train.micro_batch_size,
        global_batch=cfg.train.global_batch_size, tp=built.tp, pp=built.pp, dp=built.dp,
        zero_stage=parallel.zero_stage, sequence_parallel=parallel.sequence_parallel,
        recompute=parallel.activation_checkpoint, schedule=schedule,
        ffn=model.ffn_hidden_size, stores_attention_scores=kernel == "eager",
        activation_bytes=activation_bytes,
        residual_bytes=4 if model.residual_fp32 else activation_bytes,
        dropout=bool(model.hidden_dropout or model.attention_dropout), **states)


def activation_breakdown(layout: Layout, built: RankPlan) -> dict[str, float]:
    """Activation bytes of ``built``'s rank by the formulas (``activation_memory``) for the
    blocks the rank really holds."""
    return activation_memory(layout, built.coords[0], len(built.layers))


# the formulas' kinds under the tracker's names, so that the two stand side by side
_FORMULA_AS_TRACED = {"parameter_workspace": "working", "recompute_workspace": "temporary"}


def plan_run(cfg, world_size: int, ranks: list[int], gpu: Device, trace: bool = True) -> dict:
    """The plan of ``ranks`` of a ``world_size`` run of ``cfg`` (loaded as ``trainer
    pretrain`` loads it) on ``gpu``: a JSON-ready dict (see ``trainer plan --json``).

    Per rank, ``formula_memory_bytes``: the model states read off the rank built on meta
    tensors plus the activation formulas; with ``trace``, ``traced_memory_bytes``: the peak of
    one training step of the rank on fake tensors under torch's memory tracker
    (``traced_step``), by kind as live at that moment. ``memory_bytes`` (and ``fits``) is
    the traced one when there is one, else the formula's."""
    from bloomline.trainer.plan.traced_step import trace_ranks

    for rank in ranks:
        if not 0 <= rank < world_size:
            raise UserError(f"--rank {rank}: outside a world of {world_size} processes")
    out_ranks, layout, flights = [], None, []
    for rank in ranks:
        built = build_rank(cfg, world_size, rank)
        layout = layout or formula_layout(cfg, built)
        formula_memory = {_FORMULA_AS_TRACED.get(kind, kind): int(value)
                          for kind, value in built.device_bytes.items()}
        for kind, value in activation_breakdown(layout, built).items():
            formula_memory[_FORMULA_AS_TRACED.get(kind, kind)] = int(value)
        formula_memory["total"] = int(peak_total(
            {("recompute_workspace" if k == "temporary" else k): v
             for k, v in formula_memory.items()}))
        formula = model_state_bytes(layout, built.coords[0])
        formula_states = math.fsum(formula.values())
        entry = {
            "rank": rank, "stage": built.coords[0], "coords": list(built.coords),
            "layers": [built.layers[0], built.layers[-1]] if built.layers else [],
            "holds": [name for name, has in (("embedding", built.has_embedding),
                                             ("final norm", built.has_final_norm),
                                             ("head", built.has_head)) if has],
            "local_parameters": built.local_parameters,
            "formula_memory_bytes": formula_memory, "host_bytes": built.host_bytes,
            "formula_model_state_bytes": int(formula_states),
            "model_states_built_over_formula": (built.model_state_bytes / formula_states
                                                if formula_states else None)}
        flights.append(micro_batches_in_flight(layout, built.coords[0]))
        out_ranks.append(entry)
    traced_steps = trace_ranks(cfg, world_size, ranks, "cuda", flights) if trace else []
    for entry, traced in zip(out_ranks, traced_steps, strict=False):
        entry["traced_memory_bytes"] = {**traced.at_peak, "total": traced.peak_bytes}
        entry["traced_micro_batches"] = traced.micro_batches
        entry["traced_over_formula"] = (traced.peak_bytes
                                        / entry["formula_memory_bytes"]["total"])
    for entry in out_ranks:
        memory = entry.get("traced_memory_bytes", entry["formula_memory_bytes"])
        entry.update({"memory_bytes": memory, "device_bytes": gpu.memory_bytes,
                      "fits": memory["total"] <= gpu.memory_bytes})
    timing = step_time(layout, gpu)
    return {"world_size": world_size, "layout": {"pp": layout.pp, "dp": layout.dp,
                                                 "tp": layout.tp},
            "device": asdict(gpu), "ranks": out_ranks, "traced": trace,
            "micro_batches": layout.micro_batches,
            "step_time_s": timing.step, "tokens_per_s": timing.tokens_per_s,
            "tflops_per_gpu": timing.tflops_per_gpu, "mfu": timing.mfu,
            "step_parts_s": {"compute": timing.compute, "tensor_parallel": timing.tensor_parallel,
                             "pipeline_p2p": timing.pipeline_p2p, "bubble": timing.bubble,
                             "data_parallel": timing.data_parallel}}


_KIND_ORDER = ("parameters", "working", "gradients", "optimizer", "activations", "logits",
               "temporary", "communication", "buffers", "other")


def format_plan(result: dict) -> str:
    """``plan_run``'s result as lines for a person."""
    gpu = result["device"]
    lay = result["layout"]
    lines = [f"{result['world_size']} x {gpu['name']} ({gpu['memory_bytes'] / _GIB:.0f} GiB): "
             f"pp{lay['pp']} x dp{lay['dp']} x tp{lay['tp']}, {result['micro_batches']} "
             "micro-batches per step on each pipeline"]
    for r in result["ranks"]:
        span = f"layers {r['layers'][0]}..{r['layers'][1]}" if r["layers"] else "no layers"
        lines.append(f"rank {r['rank']} (stage {r['stage']}, {span}"
                     + (f", {', '.join(r['holds'])}" if r["holds"] else "")
                     + f"): {r['local_parameters']:,} local parameters")
        formula, traced = r["formula_memory_bytes"], r.get("traced_memory_bytes")
        kinds = [k for k in _KIND_ORDER if formula.get(k) or (traced or {}).get(k)]
        lines.append(f"  {'GiB':<16}" + (f"{'traced':>9}" if traced else "")
                     + f"{'formula':>9}")
        for kind in kinds + ["total"]:
            row = f"  {kind:<16}"
            if traced is not None:
                row += _gib_cell(traced.get(kind))
            lines.append(row + _gib_cell(formula.get(kind)))
        verdict = "fits" if r["fits"] else "DOES NOT FIT"
        lines[-1] += (f"   of {r['device_bytes'] / _GIB:.0f}: {verdict}"
                      + (f" (traced / formula {r['traced_over_formula']:.2f})" if traced
                         else " (formula; not traced)"))
        ratio = r["model_states_built_over_formula"]
        built_states = sum(formula.get(k, 0) for k in
                           ("parameters", "working", "gradients", "optimizer"))
        lines.append(f"  model states: built {built_states / _GIB:.2f} GiB, ZeRO formula "
                     f"{r['formula_model_state_bytes'] / _GIB:.2f} GiB"
                     + (f", ratio {ratio:.2f}" if ratio else ""))
        if r["host_bytes"]:
            lines.append(f"  + {r['host_bytes'] / _GIB:.2f} GiB in host memory (offload)")
    parts = ", ".join(f"{k} {v:.1f}" for k, v in result["step_parts_s"].items())
    lines.append(f"time model: step {result['step_time_s']:.1f} s ({parts}); "
                 f"{result['tokens_per_s']:,.0f} tokens/s, {result['tflops_per_gpu']:.0f} "
                 f"TFLOP/s per GPU, MFU {100 * result['mfu']:.1f}% (assumptions: "
                 "docs/perf/plan-vs-published.md)")
    return "\n".join(lines)


def _gib_cell(value) -> str:
    return f"{value / _GIB:9.2f}" if value else f"{'-':>9}"


def gpu_from_options(name: str, settings: list[str]) -> Device:
    """``--gpu NAME`` with ``--gpu-set field=value`` overrides, as a Device; one-line errors."""
    overrides = {}
    for item in settings:
        field_name, sep, value = item.partition("=")
        if not sep:
            raise UserError(f"--gpu-set {item!r}: expected FIELD=VALUE")
        try:
            overrides[field_name] = (int(float(value)) if field_name in
                                     ("memory_bytes", "gpus_per_node") else float(value))
        except ValueError:
            raise UserError(f"--gpu-set {item!r}: {value!r} is not a number") from None
    try:
        return device(name, **overrides)
    except KeyError:
        raise UserError(f"--gpu {name}: unknown device; known: {', '.join(DEVICES)}") from None
    except TypeError:
        fields = ", ".join(f for f in Device.__dataclass_fields__ if f != "name")
        raise UserError(f"--gpu-set: unknown field in {settings}; fields: {fields}") from None


def search_run(cfg, world_size: int, gpu: Device) -> tuple[str, dict]:
    """``--search``: rank 0 of the recipe built (its layout checked, its padded vocabulary),
    then every layout of the model on ``world_size`` GPUs ranked (``search.search``): the
    text for a person and a JSON-ready dict."""
    base = formula_layout(cfg, build_rank(cfg, world_size, 0))
    result = search(base, world_size, gpu)
    keys = ("tp", "pp", "dp", "zero_stage", "micro_batch", "recompute", "sequence_parallel")
    top = [{**{k: getattr(c.layout, k) for k in keys}, "worst_stage": c.worst_stage,
            "memory_bytes": int(c.memory_bytes), "step_time_s": c.time.step,
            "tokens_per_s": c.time.tokens_per_s, "tflops_per_gpu": c.time.tflops_per_gpu,
            "mfu": c.time.mfu} for c in result.ranked[:5]]
    data = {"world_size": world_size, "device": asdict(gpu), "fitting": len(result.ranked),
            "top": top, "dropped": dict(result.dropped), "recipe_rank": result.given_rank}
    return format_search(result, base, world_size, gpu), data
