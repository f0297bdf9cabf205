# The two front doors. Each creates (or reuses) .venv and installs what it needs.
#   make demo   build a small corpus offline and run the pipeline end to end on it
#   make test   run the whole test suite

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
DEMO   := build/demo
# A stamp per requirements file: reinstall only when a pin changes.
STAMP     := $(VENV)/.installed-dev
STAMP_CMP := $(VENV)/.installed-compat

.PHONY: demo test lint bench-tokenize bench-tokenize-cluster bench-readers bench-build-index bench-inspect bench-train bench-step-parts bench-parallel bench-checkpoint gpu-check clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(STAMP): requirements-dev.txt packages/*/pyproject.toml packages/tools/pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -r requirements-dev.txt
	touch $@

# Optional oracles (megatron-core) for the compatibility tests; a failure to install them
# only makes those tests skip.
$(STAMP_CMP): requirements-compat.txt | $(STAMP)
	$(BIN)/python -m pip install --quiet -r requirements-compat.txt \
		|| echo "warning: optional compatibility oracles not installed; their tests will skip"
	touch $@

test: $(STAMP) $(STAMP_CMP)
	$(BIN)/python -m pytest -q

lint: $(STAMP)
	$(BIN)/ruff check .

demo: $(STAMP)
	$(BIN)/dataprep demo-corpus $(DEMO)/raw --overwrite
	$(BIN)/dataprep train-tokenizer $(DEMO)/raw --vocab-size 8000 --output $(DEMO)/tokenizer/demo --overwrite
	$(BIN)/dataprep tokenize $(DEMO)/raw --tokenizer $(DEMO)/tokenizer/demo.model \
		--output $(DEMO)/corpus/demo --overwrite
	$(BIN)/dataprep build-index $(DEMO)/corpus --seq-length 256 --train-samples 20000 \
		--valid-samples 200 --split 98,2
	rm -rf $(DEMO)/run
	$(BIN)/trainer pretrain --config configs/tiny-cpu.toml train.run_dir=$(DEMO)/run
	$(BIN)/trainer generate $(DEMO)/run/checkpoints/step_00000300 --prompt "The history of" \
		--max-new-tokens 32
	$(BIN)/trainer export-hf $(DEMO)/run/checkpoints/step_00000300 $(DEMO)/hf --overwrite
	$(BIN)/trainer plot $(DEMO)/run
	@echo "demo: token files in $(DEMO)/corpus, run (metrics.jsonl, summary.json, plot.png, tensorboard/, checkpoints/) in $(DEMO)/run, transformers export in $(DEMO)/hf"

bench-tokenize: $(STAMP)
	$(BIN)/python -m benchmarks.tokenize

bench-tokenize-cluster: $(STAMP)
	$(BIN)/python -m benchmarks.tokenize_cluster

bench-readers: $(STAMP)
	$(BIN)/python -m benchmarks.readers

# megatron-core (the baseline it compares against) comes with the compatibility oracles
bench-build-index: $(STAMP) $(STAMP_CMP)
	$(BIN)/python -m benchmarks.build_index

# inspect-data summary/verify on bench-build-index's ~1B-token corpus (generated if missing)
bench-inspect: $(STAMP)
	$(BIN)/python -m benchmarks.inspect

# transformers (the baseline it compares against) comes with the compatibility oracles; the
# loader part uses the demo corpus, which the benchmark makes with dataprep when it is missing
bench-train: $(STAMP) $(STAMP_CMP)
	$(BIN)/python -m benchmarks.train

# where bench-train's step spends its time: matmul-only ceiling, in-situ cost of each other part
bench-step-parts: $(STAMP)
	$(BIN)/python -m benchmarks.step_parts

# ZeRO memory and bytes per rank, pipeline bubbles: CPU processes on gloo (GPU throughput of the
# 350M/1.3B recipes: benchmarks/gpu_throughput.sh, on a machine with GPUs)
bench-parallel: $(STAMP)
	$(BIN)/python -m benchmarks.parallel

# checkpoint stall: sync save vs async (DCP async_save + manifest), against disk and copy limits
bench-checkpoint: $(STAMP)
	$(BIN)/python -m benchmarks.checkpoint

# what CPU cannot check (flex backward, bf16 350m, NCCL dp2/tp2, throughput vs plan); no GPU: exit 2
gpu-check: $(STAMP)
	$(BIN)/python -m benchmarks.gpu_check

clean:
	rm -rf build $(VENV)
