# Common commands. `make test` and `make demo` work on a fresh machine (they create .venv).
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
SHARED ?= ../shared/data

.PHONY: setup test test-all lint format demo bench-train bench-encode bench-eval bench-objectives bench-gpu bench-backbones bench-lora-memory gpu-check gpu-check-dry gpu-pack clean

# The stamp is written only after every install step succeeded: `python -m venv` creates
# bin/activate first, so a target on it would count a failed install as done.
STAMP := $(VENV)/.installed

$(STAMP): pyproject.toml constraints.txt
	$(PY) -m venv $(VENV)
	# The CPU build of torch first: a plain `torch` requirement would pull a multi-GB CUDA build.
	$(BIN)/pip install -q torch==2.13.0
	# the versions the suite last passed with: a new release upstream does not break a clean run
	$(BIN)/pip install -q -e '.[dev]' -c constraints.txt
	touch $(STAMP)

setup: $(STAMP)

test: setup
	$(BIN)/python -m pytest -q

test-all: setup
	$(BIN)/python -m pytest -q -m ''

lint: setup
	$(BIN)/ruff check src tests bench
	$(BIN)/ruff format --check src tests bench

format: setup
	$(BIN)/ruff format src tests bench
	$(BIN)/ruff check --fix src tests bench

# The main job on offline defaults: all-MiniLM-L6-v2 (packaged), CLS pooling, the shared wiki
# sentences; prints STS-B dev before and after training. Each run replaces the last demo's
# outputs (a demo is reproduced in minutes), so `make demo` can be run again.
DEMO_ARGS := --train.overwrite=true
demo: setup
	$(BIN)/cselab train demo-minilm $(DEMO_ARGS)

bench-train: setup
	$(BIN)/python bench/bench_train.py --throughput
	$(BIN)/python bench/bench_train.py --throughput --peer-glibc-retain --runs "" --no-eval --out docs/results/train_benchmark_equal_alloc.md

bench-encode: setup
	$(BIN)/python bench/bench_encode.py

bench-eval: setup
	$(BIN)/python bench/bench_eval.py

bench-objectives: setup
	$(BIN)/python bench/bench_objectives.py --seeds 1 2 3 --timing-rounds 0 --results-dir docs/results/objectives_runs
	$(BIN)/python bench/bench_objectives.py --report-only --seeds 1 2 3 --results-dir docs/results/objectives_runs --out docs/results/objectives_table.md

bench-gpu: setup
	$(BIN)/python bench/bench_gpu.py

bench-backbones: setup
	$(BIN)/python bench/bench_backbones.py

bench-lora-memory: setup
	$(BIN)/python bench/bench_lora_memory.py --out docs/results/lora_memory.md

# On a machine with a CUDA GPU: ~10 minutes, no network (the data folder is copied from
# $(SHARED) first; on a GPU machine without it, carry a folder made by --prepare and pass DATA=).
GPU_DATA ?= /tmp/cselab-gpu-data
gpu-check: setup
	test -d $(GPU_DATA) || $(BIN)/python bench/gpu_check.py --prepare $(GPU_DATA)
	$(BIN)/python bench/gpu_check.py --data $(GPU_DATA) --out gpu_check.md

# What an offline GPU machine needs, in the ignored .gpu/: the workplace's pack (data, tokenizer,
# wheels) and this venv's versions of the Hugging Face stack the carried transformers imports.
# Then, there: bash .gpu/run.sh --quick --budget SECONDS
gpu-pack: setup
	bash ../shared/gpu/prepare.sh
	$(BIN)/python bench/gpu_wheels.py .gpu/whl
	du -sh .gpu

# The same sequence on the CPU with tiny shapes (what CI runs through tests/test_gpu_check.py).
gpu-check-dry: setup
	$(BIN)/python bench/gpu_check.py --dry-run --out gpu_check_dry.md

clean:
	rm -rf outputs .pytest_cache .ruff_cache
