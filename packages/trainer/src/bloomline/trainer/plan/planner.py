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
(``search.py``). Not here yet: a traced training step under fake tensors with memory tracking
(the activations are the formula's, not measured).
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict
from pathlib import Path

from bloomline.common.errors import UserError
from bloomline.trainer.plan.devices import DEVICES, Device, device
from bloomline.trainer.plan.memory_formulas import (
    Layout,
    activation_bytes_per_layer,
    micro_batches_in_flight,
    model_state_bytes,
)
from bloomline.trainer.plan.rank_build import RankPlan, build_rank
from bloomline.trainer.plan.search import format_search, search
from bloomline.trainer.plan.time_model import step_time

__all__ = ["activation_breakdown", "format_plan", "formula_layout", "gpu_from_options",
           "plan_run", "search_run", "stated_world"]

_WORLD = re.compile(r"^#\s*world size:\s*(\d+)(.*)$", re.MULTILINE)
_GIB = 2 ** 30


def stated_world(path: str | Path) -> tuple[int, list[str]] | None:
    """(world size, layout overrides) from a recipe's ``# world size: N`` comment, or None
    when it states none. The overrides are the ``parallel.*=value`` words of that statement,
    which may continue over the comment lines that follow it."""
    text = Path(path).read_text(encoding="utf-8")
    found = _WORLD.search(text)
    if found is None:
        return None
    rest = text[found.start():].split("\n\n", 1)[0]
    return int(found.group(1)), re.findall(r"parallel\.\w+=\w+", rest)


def formula_layout(cfg, built: RankPlan) -> Layout:
    """The formulas' description of the layout ``built`` was built with (its padded
    vocabulary, its sizes); the trainer's FSDP2 engine and fp32 model states. On a GPU the
    attention runs as a fused kernel (``model.attention`` auto -> flex, or sdpa) that keeps
    no [s, s] scores for backward; only ``eager`` stores them."""
    parallel = cfg.parallel
    schedule = "gpipe" if parallel.pipeline_schedule == "gpipe" else "1f1b"
    return Layout(
        layers=cfg.model.num_layers, hidden=cfg.model.hidden_size, heads=cfg.model.num_heads,
        vocab=built.vocab_size, seq=cfg.data.seq_length, micro_batch=cfg.train.micro_batch_size,
        global_batch=cfg.train.global_batch_size, tp=built.tp, pp=built.pp, dp=built.dp,
        zero_stage=parallel.zero_stage, sequence_parallel=parallel.sequence_parallel,
        recompute=parallel.activation_checkpoint, schedule=schedule,
        ffn=cfg.model.ffn_hidden_size, stores_attention_scores=cfg.model.attention == "eager")


def activation_breakdown(layout: Layout, built: RankPlan) -> dict[str, float]:
    """Activation bytes of ``built``'s rank: the formula per layer, times the blocks the rank
    holds and the micro-batches its first stage keeps in flight (model_state_bytes' kinds
    aside, the same kinds as ``memory_formulas.rank_memory``)."""
    stage = built.coords[0]
    in_flight = micro_batches_in_flight(layout, stage)
    out = {"activations": in_flight * len(built.layers) * activation_bytes_per_layer(layout),
           "recompute_workspace": (activation_bytes_per_layer(layout, "none")
                                   if layout.recompute == "full" else 0.0)}
    per_logit = 2.0 if layout.tp == layout.pp == 1 else 10.0
    out["logits"] = (per_logit * layout.seq * layout.micro_batch * layout.vocab / layout.tp
                     if built.has_head else 0.0)
    return out


def plan_run(cfg, world_size: int, ranks: list[int], gpu: Device) -> dict:
    """The plan of ``ranks`` of a ``world_size`` run of ``cfg`` (loaded as ``trainer
    pretrain`` loads it) on ``gpu``: a JSON-ready dict (see ``trainer plan --json``)."""
    for rank in ranks:
        if not 0 <= rank < world_size:
            raise UserError(f"--rank {rank}: outside a world of {world_size} processes")
    out_ranks, layout = [], None
    for rank in ranks:
        built = build_rank(cfg, world_size, rank)
        layout = layout or formula_layout(cfg, built)
        memory = {kind: int(value) for kind, value in built.device_bytes.items()}
        memory.update({k: int(v) for k, v in activation_breakdown(layout, built).items()})
        memory["total"] = sum(memory.values())
        formula = model_state_bytes(layout, built.coords[0])
        formula_states = math.fsum(formula.values())
        out_ranks.append({
            "rank": rank, "stage": built.coords[0], "coords": list(built.coords),
            "layers": [built.layers[0], built.layers[-1]] if built.layers else [],
            "holds": [name for name, has in (("embedding", built.has_embedding),
                                             ("final norm", built.has_final_norm),
                                             ("head", built.has_head)) if has],
            "local_parameters": built.local_parameters,
            "memory_bytes": memory, "host_bytes": built.host_bytes,
            "formula_model_state_bytes": int(formula_states),
            "model_states_built_over_formula": (built.model_state_bytes / formula_states
                                                if formula_states else None),
            "device_bytes": gpu.memory_bytes, "fits": memory["total"] <= gpu.memory_bytes})
    timing = step_time(layout, gpu)
    return {"world_size": world_size, "layout": {"pp": layout.pp, "dp": layout.dp,
                                                 "tp": layout.tp},
            "device": asdict(gpu), "ranks": out_ranks,
            "micro_batches": layout.micro_batches,
            "step_time_s": timing.step, "tokens_per_s": timing.tokens_per_s,
            "tflops_per_gpu": timing.tflops_per_gpu, "mfu": timing.mfu,
            "step_parts_s": {"compute": timing.compute, "tensor_parallel": timing.tensor_parallel,
                             "pipeline_p2p": timing.pipeline_p2p, "bubble": timing.bubble,
                             "data_parallel": timing.data_parallel}}


def format_plan(result: dict) -> str:
    """``plan_run``'s result as lines for a person."""
    gpu = result["device"]
    lay = result["layout"]
    lines = [f"{result['world_size']} x {gpu['name']} ({gpu['memory_bytes'] / _GIB:.0f} GiB): "
             f"pp{lay['pp']} x dp{lay['dp']} x tp{lay['tp']}, {result['micro_batches']} "
             "micro-batches per step on each pipeline"]
    for r in result["ranks"]:
        mem = r["memory_bytes"]
        span = f"layers {r['layers'][0]}..{r['layers'][1]}" if r["layers"] else "no layers"
        lines.append(f"rank {r['rank']} (stage {r['stage']}, {span}"
                     + (f", {', '.join(r['holds'])}" if r["holds"] else "")
                     + f"): {r['local_parameters']:,} local parameters")
        for kind, value in mem.items():
            if kind != "total":
                lines.append(f"  {kind:<20}{value / _GIB:8.2f} GiB")
        ratio = r["model_states_built_over_formula"]
        built_states = mem["total"] - _activation_total(mem)
        lines.append(f"  {'total':<20}{mem['total'] / _GIB:8.2f} GiB of "
                     f"{r['device_bytes'] / _GIB:.0f}: "
                     + ("fits" if r["fits"] else "DOES NOT FIT")
                     + f"   (model states: built {built_states / _GIB:.2f} GiB, ZeRO formula "
                     f"{r['formula_model_state_bytes'] / _GIB:.2f} GiB"
                     + (f", ratio {ratio:.2f})" if ratio else ")"))
        if r["host_bytes"]:
            lines.append(f"  + {r['host_bytes'] / _GIB:.2f} GiB in host memory (offload)")
    parts = ", ".join(f"{k} {v:.1f}" for k, v in result["step_parts_s"].items())
    lines.append(f"time model: step {result['step_time_s']:.1f} s ({parts}); "
                 f"{result['tokens_per_s']:,.0f} tokens/s, {result['tflops_per_gpu']:.0f} "
                 f"TFLOP/s per GPU, MFU {100 * result['mfu']:.1f}% (assumptions: "
                 "docs/perf/plan-vs-published.md)")
    return "\n".join(lines)


def _activation_total(memory: dict) -> int:
    return sum(memory.get(k, 0) for k in ("activations", "recompute_workspace", "logits"))


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
