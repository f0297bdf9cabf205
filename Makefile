# The front doors. Each creates (or reuses) .venv and installs what it needs.
#   make demo        build a small corpus offline and run the pipeline end to end on it
#   make test        run the whole test suite (what CI runs: .ci/run)
#   make test-fast   the edit loop: the suite without the tests marked slow (those that start
#                    processes or take more than ~2 s)

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
DEMO   := build/demo
# A stamp per requirements file: reinstall only when a pin changes.
STAMP     := $(VENV)/.installed-dev
STAMP_CMP := $(VENV)/.installed-compat

.PHONY: demo test test-fast wheelhouse lint bench-tokenize bench-tokenize-cluster bench-readers bench-build-index bench-inspect bench-train bench-step-parts bench-parallel bench-checkpoint bench-snapshot bench-document-masks gpu-check clean

# bloomline needs Python 3.11+ (tomllib, and the pinned numpy, typer, matplotlib and the newest
# torch have left 3.10): an older one is refused here in one line rather than deep in pip
PYTHON_OK = $(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null \
	|| { echo "bloomline needs Python 3.11 or newer; $(PYTHON) is $$($(PYTHON) --version 2>&1 || echo missing): run make PYTHON=python3.11 (or newer)" >&2; exit 2; }

$(BIN)/python:
	@$(PYTHON_OK)
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

# the edit loop: every test but the `slow` ones (pyproject.toml: they start processes, the
# multi-process gloo runs, the CLI in a subprocess, the README blocks, the GPU check's dry
# runs, or take more than ~2 s); make test runs them all
test-fast: $(STAMP) $(STAMP_CMP)
	$(BIN)/python -m pytest -q -m "not slow"

# make test-compat TORCH=2.11.0: the smoke subset (pytest -m compat) under another torch, in a
# venv of its own (build/venv-torch-TORCH, reused) holding requirements-dev.txt with only its
# torch pin replaced. A torch other than the pinned CPU build comes from PyPI as a CUDA build
# (GBs of nvidia-* wheels); it runs on CPU all the same.
.PHONY: test-compat
ifneq ($(filter test-compat,$(MAKECMDGOALS)),)
ifeq ($(strip $(TORCH)),)
$(error TORCH is required: make test-compat TORCH=2.11.0 (a torch version, e.g. 2.11.0 or 2.15.0))
endif
endif
COMPAT_VENV  := build/venv-torch-$(TORCH)
COMPAT_REQ   := build/requirements-torch-$(TORCH).txt
COMPAT_STAMP := $(COMPAT_VENV)/.installed-dev

# requirements-dev.txt without its torch line: every other pin stays as it is
$(COMPAT_REQ): requirements-dev.txt
	@mkdir -p $(@D)
	grep -v '^torch==' requirements-dev.txt > $@

$(COMPAT_VENV)/bin/python:
	@$(PYTHON_OK)
	$(PYTHON) -m venv $(COMPAT_VENV)
	$@ -m pip install --quiet --upgrade pip

$(COMPAT_STAMP): $(COMPAT_REQ) packages/*/pyproject.toml | $(COMPAT_VENV)/bin/python
	$(COMPAT_VENV)/bin/python -m pip install --quiet "torch==$(TORCH)" -r $(COMPAT_REQ)
	touch $@

test-compat: $(COMPAT_STAMP)
	$(COMPAT_VENV)/bin/python -c "import torch; print('torch', torch.__version__)"
	$(COMPAT_VENV)/bin/python -m pytest -q -m compat

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
# loader part uses the demo corpus, which the benchmark makes with dataprep when it is missing;
# at dp 2 (gloo processes) the ZeRO-1/2 buffers engine beside fsdp2's (--skip-dp: without)
bench-train: $(STAMP) $(STAMP_CMP)
	$(BIN)/python -m benchmarks.train

# where bench-train's step spends its time: matmul-only ceiling, in-situ cost of each other part
bench-step-parts: $(STAMP)
	$(BIN)/python -m benchmarks.step_parts

# ZeRO memory and bytes per rank, pipeline bubbles, the ZeRO-1/2 engines side by side (step
# time, collective calls per step): CPU processes on gloo (GPU throughput of the 350M/1.3B
# recipes: benchmarks/gpu_throughput.sh, on a machine with GPUs)
bench-parallel: $(STAMP)
	$(BIN)/python -m benchmarks.parallel

# checkpoint stall: sync save vs async (DCP async_save + manifest), against disk and copy limits
bench-checkpoint: $(STAMP)
	$(BIN)/python -m benchmarks.checkpoint

bench-snapshot: $(STAMP)
	$(BIN)/python -m benchmarks.snapshot

# document masking's cost: get_batch with and without document ids, the step's ids and masked
# bias / BlockMask against its attention
bench-document-masks: $(STAMP)
	$(BIN)/python -m benchmarks.document_masks

# what CPU cannot check (flex backward, bf16 350m beside the plan, NCCL dp2/tp2, throughput vs
# plan); no GPU: exit 2. On a GPU machine the command is `python3 -m benchmarks.gpu_check` with
# the machine's own Python (offline, from wheelhouse/); this target runs it with .venv's.
gpu-check: $(STAMP)
	$(BIN)/python -m benchmarks.gpu_check

# wheelhouse/ for `python3 -m benchmarks.gpu_check` on a GPU machine without network: the
# bloomline wheels of this checkout and its pinned runtime dependencies (torch excepted) as
# binary wheels for the GPU machine's Python and platform; copy the folder into the checkout there
WHEELHOUSE     ?= wheelhouse
WHEEL_PYTHON   ?= 3.12
WHEEL_PLATFORM ?= manylinux_2_28_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 linux_x86_64
wheelhouse: $(STAMP)
	rm -rf $(WHEELHOUSE) && mkdir -p $(WHEELHOUSE) build
	$(BIN)/python -m benchmarks.gpu_checks.wheelhouse wheels $(WHEELHOUSE)
	$(BIN)/python -m benchmarks.gpu_checks.wheelhouse requirements > build/wheelhouse-requirements.txt
	$(BIN)/python -m pip download --quiet --dest $(WHEELHOUSE) --only-binary=:all: \
		--python-version $(WHEEL_PYTHON) $(addprefix --platform ,$(WHEEL_PLATFORM)) \
		-r build/wheelhouse-requirements.txt
	$(BIN)/python -m benchmarks.gpu_checks.wheelhouse record $(WHEELHOUSE)
	@echo "wheelhouse: $$(ls $(WHEELHOUSE)/*.whl | wc -l) wheels for Python $(WHEEL_PYTHON), $$(du -sh $(WHEELHOUSE) | cut -f1)"

clean:
	rm -rf build $(VENV)
