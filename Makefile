# Two commands do all set-up on a fresh machine:
#   make demo   creates .venv, installs tunebank, runs the main job on the embedded default
#   make test   creates .venv if needed, installs, runs lint, layer contracts and the whole test suite
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# The demo crawls DEMO_CRAWL into its own data dir, then optimizes DEMO_MODEL (which the crawl never saw) twice: the
# first run transfers from the crawled neighbours, the second is all hits. One OpenMP / PyTorch thread, so the cpu
# timings of kernels and eager stay meaningful on a busy 2-core machine.
DEMO_DIR   ?= .tunebank/demo
DEMO_CRAWL ?= bert_encoder-h64-s16-b1,lm_head-h64-v256-t32
DEMO_MODEL ?= gpt_decoder-h64-s16-b1
DEMO_ENV   := TUNEBANK_DATA_DIR=$(DEMO_DIR) OMP_NUM_THREADS=1

.PHONY: venv demo test lint mutate clean

venv: $(STAMP)

# torch is installed first, pinned by constraints.txt to the CPU wheel, so no dependency range can pull a CUDA build.
$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check -c constraints.txt torch
	$(BIN)/pip install --quiet --disable-pip-version-check -c constraints.txt -e '.[dev,server,gpu]'
	touch $(STAMP)

demo: venv
	@rm -rf $(DEMO_DIR)
	@$(DEMO_ENV) $(BIN)/tunebank db upgrade
	@t=$$(date +%s); $(DEMO_ENV) $(BIN)/tunebank crawl --models $(DEMO_CRAWL) --backend auto --budget 4 \
	  && echo "crawl: $$(( $$(date +%s) - t )) s"
	@t=$$(date +%s); $(DEMO_ENV) $(BIN)/tunebank optimize $(DEMO_MODEL) --out $(DEMO_DIR)/plan.tbplan \
	  && echo "optimize (transfer): $$(( $$(date +%s) - t )) s"
	@t=$$(date +%s); $(DEMO_ENV) $(BIN)/tunebank optimize $(DEMO_MODEL) --no-time \
	  && echo "optimize again (all hits): $$(( $$(date +%s) - t )) s"

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
