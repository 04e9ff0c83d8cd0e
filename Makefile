# Two commands do all set-up on a fresh machine:
#   make demo   creates .venv, installs tunebank, runs the main job on the embedded default
#   make test   creates .venv if needed, installs, runs lint, layer contracts and the whole test suite
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
DEMO_MODEL ?= zoo:gpt_decoder

.PHONY: venv demo test lint mutate clean

venv: $(STAMP)

# torch is installed first, pinned by constraints.txt to the CPU wheel, so no dependency range can pull a CUDA build.
$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check -c constraints.txt torch
	$(BIN)/pip install --quiet --disable-pip-version-check -c constraints.txt -e '.[dev,server,gpu]'
	touch $(STAMP)

demo: venv
	$(BIN)/tunebank inspect $(DEMO_MODEL)

lint: venv
	$(BIN)/ruff check .
	$(BIN)/lint-imports

test: lint
	$(BIN)/pytest

# Planted bugs (tools/mutants.py), one at a time in a copy of the tree: prints killed / survived. Not part of test.
mutate: venv
	$(BIN)/python tools/mutate.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis
