# One venv for everything. torch==2.13.0 is installed first, on its own: it is the CPU
# build available locally, and any other torch request would pull a multi-GB CUDA build.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup test test-all lint format demo bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

test: setup  ## the default suite (what CI runs)
	$(PY) -m pytest

test-all: setup  ## everything, slow tests included
	$(PY) -m pytest -m ""

lint: setup
	$(VENV)/bin/ruff check src tests benchmarks

format: setup
	$(VENV)/bin/ruff format src tests benchmarks

demo: setup  ## the main job: train a model on the reverse task and show that it learned
	$(VENV)/bin/tformer train --task reverse

bench: setup
	$(VENV)/bin/tformer bench

clean:
	rm -rf $(VENV) build dist src/*.egg-info .pytest_cache .hypothesis .ruff_cache
