# Two entry points: `make demo` and `make test`. Both create/update the virtual environment first.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
EXTRAS ?= dev,postgres,dashboard,tracking   # CI adds ax, onnx (.ci/run)
# pytest-xdist processes for `make test`; each test file runs whole in one (module fixtures).
# One more than the cores: the multi-process tests spend much of their time waiting on their
# workers, sockets and polls (tests/load alone kept 1.1 of 2 cores busy, measured).
TEST_PROCS ?= $(shell $(PYTHON) -c 'import os; f = getattr(os, "sched_getaffinity", None); print((len(f(0)) if f else os.cpu_count() or 1) + 1)')

.PHONY: demo test lint venv clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[$(strip $(EXTRAS))]'
	@touch $(STAMP)

demo: $(STAMP)
	$(BIN)/mlrc demo

test: $(STAMP)
	$(BIN)/ruff check mlrc tests bench
	$(BIN)/ruff format --check mlrc tests bench
	$(BIN)/lint-imports
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir $(abspath $(VENV))/site
	$(BIN)/python -m pytest -q -n $(TEST_PROCS) --dist loadfile --no-loadscope-reorder --durations=25

lint: $(STAMP)
	$(BIN)/ruff check mlrc tests bench
	$(BIN)/ruff format --check mlrc tests bench

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
