# The two commands of the README, and the tools behind them.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
DATA   := .data/.fetched

.PHONY: setup demo test lint bench report clean

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --disable-pip-version-check -c constraints.txt -e '.[dev]'
	touch $(STAMP)

$(DATA): scripts/fetch-datasets | $(STAMP)
	PYTHON=$(BIN)/python scripts/fetch-datasets
	touch $(DATA)

setup: $(STAMP) $(DATA)  ## create .venv with pinned dependencies (CPU torch) and fetch the datasets

# The demo's data (RAND HIE) ships in statsmodels: it needs no fetched dataset.
demo: $(STAMP)  ## the end-to-end demo on the embedded default (report in ./labeldp-demo)
	$(BIN)/labeldp demo

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

test: setup lint  ## lint, type-check and run every test (starts Postgres if it is down)
	scripts/ensure-postgres
	$(BIN)/pytest

bench: setup  ## mechanism benchmarks; writes bench/results/
	$(BIN)/python -m bench.mechanisms
	$(BIN)/python -m bench.bench_training
	$(BIN)/python -m bench.bench_label_service
	$(BIN)/python -m bench.bench_scale
	$(BIN)/python -m bench.bench_api_latency

report: setup  ## the experiments' sweep (resumable; ~6 h on 2 cores) and bench/REPORT.md
	$(BIN)/python -m bench.report

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
