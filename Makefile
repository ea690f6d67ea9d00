# One venv for everything. torch==2.13.0 is installed first, on its own: it is the CPU
# build available locally, and any other torch request would pull a multi-GB CUDA build.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup test test-all test-gpu lint format demo demo-setup demo-task bench bench-gpu clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

test: setup  ## the default suite (what CI runs)
	$(PY) -m pytest

# The attention page's browser test needs Chromium (Debian's package); it skips without one.
CHROMIUM := $(firstword $(shell command -v chromium chromium-browser 2>/dev/null))

test-all: setup  ## everything, slow tests included (installs the bench extra and Chromium for them)
	$(PY) -m pip install --quiet -e '.[test,bench]'  # the benchmark scripts' peers (HF Trainer: accelerate)
	@if [ -z "$(CHROMIUM)" ]; then \
		echo "installing chromium (apt-get) for the attention page's browser test"; \
		SUDO=$$([ "$$(id -u)" = 0 ] || echo sudo); \
		$$SUDO apt-get update -qq && $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; \
	fi
	TFORMER_REQUIRE_BROWSER=1 $(PY) -m pytest -m ""

# On a machine with a CUDA GPU and a CUDA build of torch (`make` installs the CPU wheel: see
# docs/gpu.md for installing beside your own torch): the device-aware tests on the GPU, and the
# GPU-only ones. Where torch sees no GPU the GPU-only tests are skipped, each with its reason.
test-gpu: setup  ## the device tests on CUDA, and the GPU-only tests
	$(PY) -m pytest --device cuda -m "gpu or device"

lint: setup
	$(VENV)/bin/ruff check src tests benchmarks

format: setup
	$(VENV)/bin/ruff format src tests benchmarks

# The main job: train on your own data. Here the data is real text this machine already has:
# English -> German user-interface messages from its gettext catalogs (examples/en_de.jsonl,
# 40 lines, where there are none), built once into data/ (only that file: the other data sets are
# the benchmarks'). The whole demo takes DEMO_SECONDS from a fresh clone: the venv (the package
# alone, not the test tools), the data, the training and the translation; the training gets what
# is left once the rest is counted (DEMO_AFTER: seconds kept for the translation), and its budget
# covers its own test and saving. The run's last lines say whether its model learned (its test
# BLEU against copying the source).
DEMO_SECONDS ?= 600
DEMO_AFTER ?= 30
DEMO_STAMP := $(VENV)/.installed-demo

$(DEMO_STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e .
	touch $(DEMO_STAMP)

demo-setup:  # the package alone, unless `make setup` (the test tools too) is already done
	@if [ ! -f $(STAMP) ] || [ pyproject.toml -nt $(STAMP) ]; then $(MAKE) --no-print-directory $(DEMO_STAMP); fi

demo:  ## the main job: train an English->German model on real text, then translate with it
	@start=$$(date +%s); \
	$(MAKE) --no-print-directory demo-setup || exit 1; \
	[ -s data/en_de.jsonl ] || $(PY) benchmarks/data/build_datasets.py --out data --only en_de || echo "(no catalogs here: using examples/en_de.jsonl)"; \
	run=runs/demo-en-de-$$(date +%Y%m%d-%H%M%S); data=data/en_de.jsonl; [ -s $$data ] || data=examples/en_de.jsonl; \
	spent=$$(( $$(date +%s) - start )); \
	minutes=$$($(PY) -c "print(round(($(DEMO_SECONDS) - $(DEMO_AFTER) - $$spent) / 60, 2))"); \
	echo "make demo: $$spent s of setup; training for $$minutes minutes, $(DEMO_SECONDS) s in all"; \
	$(VENV)/bin/tformer train --data $$data --max-minutes $$minutes --out $$run && \
	echo "translating examples/demo_inputs.txt with $$run:" && \
	$(VENV)/bin/tformer generate $$run --file examples/demo_inputs.txt --beam-size 4 && \
	echo "make demo: $$(( $$(date +%s) - start )) s in all"

demo-task: setup  ## a built-in synthetic task instead: learn to reverse sequences (about a minute)
	$(VENV)/bin/tformer train --task reverse

bench: setup
	$(VENV)/bin/tformer bench

# The GPU checks in one run of a few minutes (benchmarks/gpu_check.sh says what): the device tests,
# `tformer bench --device cuda --tf32`, a one-minute timed run. PY= names a Python whose torch is
# a CUDA build (the venv's is the CPU wheel); outputs in gpu-check/.
bench-gpu:  ## the GPU checks: device tests, the GPU benchmark (MFU, TF32, compiled), a timed run
	PY=$${PY:-python3} benchmarks/gpu_check.sh gpu-check

clean:
	rm -rf $(VENV) build dist src/*.egg-info .pytest_cache .hypothesis .ruff_cache
