#!/usr/bin/env bash
# Training throughput of the 350M and 1.3B recipes on this machine's GPUs: tokens/s and MFU.
#
# For each recipe (configs/350m.toml, configs/1b3.toml), `trainer pretrain` runs under
# torchrun over all visible GPUs (--nproc-per-node = their count, passed as
# parallel.world_size: the recipe's tp and pp, data parallel over the rest, unless overridden;
# the recipe's own world may be another) for STEPS optimizer steps at the recipe's
# micro-batch, global batch and sequence length, on the demo corpus (built here offline with
# the dataprep commands of `make demo` when build/demo/corpus has no token files; the
# recipe's model vocabulary of 50304 covers the demo tokenizer's 8000; split 98,2,0: the
# recipes' 1/1000 test share of the small demo corpus holds no sample). No evaluation, no
# activation stats, no TensorBoard; the run folder goes to a temporary directory that is deleted
# afterwards (the trainer writes a final checkpoint: ~16 GB for 1.3B, so keep the disk free).
# From the run's metrics.jsonl it prints the median over the logged windows after the first
# WARMUP steps (compilation, allocator warm-up) of: tokens/s (global and per GPU), step time,
# peak memory, the logged `mfu`, and the MFU recomputed as tokens/s x the model's FLOPs per
# token (ModelConfig.flops_per_token, Megatron's count with attention) / (GPUs x the peak
# in run_info.json): the per-GPU MFU, a cross-check of the logged field.
#
# Usage: benchmarks/gpu_throughput.sh [section.key=value ...]   (overrides for both recipes)
#   STEPS=12 WARMUP=4 LOG=2 CONFIGS="configs/350m.toml configs/1b3.toml" NGPU=<all>
#   GBS=<recipe's> KEEP=0 (1 keeps the run folders under build/gpu_throughput)
#   RESULTS=<file>: also append one JSON line per recipe to it (what `make gpu-check` reads)
#   PY=<.venv/bin/python>: the Python to run with (torchrun and dataprep run as its modules,
#     so a system Python whose scripts live elsewhere works too)
#   DEVICE=cpu: a dry run of the plumbing on CPU processes (gloo; NGPU processes, default 2)
# On a machine without an NVIDIA GPU (no nvidia-smi, no GPU listed, or a torch without CUDA)
# it says so and exits with status 2 without running anything (unless DEVICE=cpu).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="${PY:-$ROOT/.venv/bin/python}"
DEVICE="${DEVICE:-cuda}"
STEPS="${STEPS:-12}"
WARMUP="${WARMUP:-4}"
LOG="${LOG:-2}"
CONFIGS="${CONFIGS:-configs/350m.toml configs/1b3.toml}"
KEEP="${KEEP:-0}"
RESULTS="${RESULTS:-}"
DEMO="$ROOT/build/demo"

no_gpu() {
    echo "gpu_throughput.sh: $1: this benchmark needs NVIDIA GPUs and was not run." >&2
    echo "  (CPU measurements: make bench-train, make bench-parallel)" >&2
    exit 2
}

[ -x "$PY" ] || { echo "gpu_throughput.sh: no $PY: run make test (or make demo) first to build the environment, or set PY" >&2; exit 1; }
device_args=()
if [ "$DEVICE" = cpu ]; then
    NGPU="${NGPU:-2}"
    device_args=(train.device=cpu)
else
    command -v nvidia-smi >/dev/null 2>&1 || no_gpu "nvidia-smi not found"
    visible=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)
    [ "${visible:-0}" -gt 0 ] || no_gpu "nvidia-smi lists no GPU"
    cuda=$("$PY" -c 'import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)')
    [ "$cuda" -gt 0 ] || no_gpu "torch $("$PY" -c 'import torch; print(torch.__version__)') of $PY sees no CUDA device (a CPU build?)"
    NGPU="${NGPU:-$cuda}"
fi

# the demo corpus, offline (the sample indices are built by the trainer)
if ! ls "$DEMO"/corpus/*.idx >/dev/null 2>&1; then
    echo "building the demo corpus in $DEMO ..."
    "$PY" -m bloomline.dataprep.cli demo-corpus "$DEMO/raw" --overwrite
    "$PY" -m bloomline.dataprep.cli train-tokenizer "$DEMO/raw" --vocab-size 8000 --output "$DEMO/tokenizer/demo" --overwrite
    "$PY" -m bloomline.dataprep.cli tokenize "$DEMO/raw" --tokenizer "$DEMO/tokenizer/demo.model" \
        --output "$DEMO/corpus/demo" --overwrite
fi

OUT="$ROOT/build/gpu_throughput"
mkdir -p "$OUT"
echo "# gpu_throughput.sh $(date -u +%Y-%m-%dT%H:%MZ) at $(git rev-parse --short HEAD 2>/dev/null || echo '?'); $NGPU $DEVICE device(s):"
[ "$DEVICE" = cpu ] || nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader | sed 's/^/#   /'
"$PY" -c 'import torch; print(f"#   torch {torch.__version__}, CUDA {torch.version.cuda}")'

status=0
for config in $CONFIGS; do
    name=$(basename "$config" .toml)
    run=$(mktemp -d "$OUT/$name.XXXX")
    gbs="${GBS:-$("$PY" -c "import tomllib,sys; print(tomllib.load(open(sys.argv[1],'rb'))['train']['global_batch_size'])" "$config")}"
    echo "== $name: $STEPS steps, global batch $gbs, $NGPU GPU(s); log $run/train.log"
    if ! "$PY" -m torch.distributed.run --standalone --nproc-per-node "$NGPU" -m bloomline.trainer pretrain \
            --config "$config" \
            data.corpus="$DEMO/corpus" data.tokenizer="$DEMO/tokenizer/demo.model" \
            train.run_dir="$run" train.global_batch_size="$gbs" parallel.world_size="$NGPU" \
            train.train_samples=$((STEPS * gbs)) train.log_interval="$LOG" \
            train.eval_interval=0 checkpoint.interval=0 checkpoint.resume=none \
            schedule.warmup=0 data.split=98,2,0 \
            monitor.activation_stats_interval=0 monitor.tensorboard=false \
            ${device_args[@]+"${device_args[@]}"} "$@" >"$run/train.log" 2>&1; then
        echo "$name: the run failed; the end of its log:"
        tail -n 30 "$run/train.log"
        status=1
        continue
    fi
    RESULTS="$RESULTS" "$PY" - "$run" "$NGPU" "$WARMUP" "$config" "$gbs" <<'EOF'
import json, os, statistics, sys
from pathlib import Path

from bloomline.trainer.config import load_trainer_config

run, ngpu, warmup = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
train = [r for r in records if r.get("kind") == "train"]
kept = [r for r in train if r["step"] > warmup] or train[-1:]
info = json.loads((run / "run_info.json").read_text())
cfg = load_trainer_config(str(run / "config.toml"), [])  # the run's resolved config
seq = kept[-1]["seq_length"]
flops = cfg.model.flops_per_token(seq)


def med(key):
    return statistics.median(r[key] for r in kept)


tokens = med("tokens_per_s")
mfu = tokens * flops / (ngpu * info["peak_flops"])
print(f"{run.name.split('.')[0]}: {info['parameters'] / 1e6:,.0f}M parameters, {info['layout']}, "
      f"L {seq}; median of {len(kept)} windows after step {warmup}: "
      f"{tokens:,.0f} tokens/s ({tokens / ngpu:,.0f} per GPU), step {med('step_time_s'):.2f} s, "
      f"peak memory {med('memory_gb'):.1f} GB; MFU {100 * mfu:.1f}% "
      f"({flops / 1e9:.2f} GFLOP/token, peak {info['peak_flops'] / 1e12:.0f} TFLOP/s per GPU; "
      f"metrics.jsonl mfu field {100 * med('mfu'):.1f}%)")
if os.environ.get("RESULTS"):
    with open(os.environ["RESULTS"], "a") as out:
        out.write(json.dumps({
            "config": sys.argv[4], "gpus": ngpu, "global_batch_size": int(sys.argv[5]),
            "seq_length": seq, "windows": len(kept), "tokens_per_s": tokens,
            "step_time_s": med("step_time_s"), "memory_gb": med("memory_gb"), "mfu": mfu,
            "logged_mfu": med("mfu")}) + "\n")
EOF
    if [ "$KEEP" != 1 ]; then rm -rf "$run"; fi
done
exit $status
