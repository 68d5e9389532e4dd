# Two commands on a fresh machine: `make demo` (the pipeline end to end) and `make test` (the test suite).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: demo demo-s3 ui test test-fast test-parity lint sglang-env real-sglang bench bench-scale bench-fleet-scale clean

$(BIN)/.installed: requirements.txt requirements-dev.txt constraints.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -r requirements-dev.txt -c constraints.txt -e .
	touch $@

demo: $(BIN)/.installed  ## run eagle3_regen through Airflow on the sample datasets, results under var/storage
	bash tools/prerequisites.sh postgres
	$(BIN)/python tools/devstack.py demo

demo-s3: $(BIN)/.installed  ## the same, publishing to a local S3 API (moto server)
	bash tools/prerequisites.sh postgres
	$(BIN)/python tools/devstack.py demo --s3

ui: $(BIN)/.installed  ## Airflow's UI on http://127.0.0.1:8080 (admin/admin) with the simulator; Ctrl-C stops it
	bash tools/prerequisites.sh postgres
	$(BIN)/python tools/devstack.py ui

# One worker a core (tests/conftest.py says how work is split between them): the end-to-end tests start schedulers and
# real servers of their own, and more workers than cores starve their timing.
WORKERS ?= 2
test: $(BIN)/.installed lint sglang-env  ## everything: unit, DAG and end-to-end tests
	bash tools/prerequisites.sh postgres redis chromium prometheus
	$(BIN)/python -m pytest -n $(WORKERS)

test-fast: $(BIN)/.installed  ## the fast tier: no Airflow scheduler, no SGLang oracle, no crash points, no generated runs
	bash tools/prerequisites.sh prometheus
	$(BIN)/python -m pytest -n 4 -m "not e2e and not parity and not crashpoints and not generated"

test-parity: $(BIN)/.installed sglang-env  ## production parity: prompts and answers against SGLang's own code
	$(BIN)/python -m pytest -m parity

sglang-env:  ## .venv-sglang: SGLang 0.5.23's own code on CPU (requirements-sglang.txt), the tests' oracle; cached
	PYTHON=$(PYTHON) bash tools/sglang_env.sh

PROFILE ?= kimi-k2.5-mini
real-sglang: $(BIN)/.installed sglang-env  ## the real SGLang 0.5.23 server on CPU with the tiny model (PROFILE=qwen3.6); Ctrl-C stops it
	$(BIN)/python -m tools.real_sglang --profile $(PROFILE)

lint: $(BIN)/.installed
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports

PROMPTS ?= 1000000
SHAPE ?= production
ARGS ?=
bench-scale: $(BIN)/.installed  ## the DAG end to end on PROMPTS generated rows (SHAPE production|short); ARGS: --celery, --kill-at 0.5, ...
	bash tools/prerequisites.sh postgres redis
	$(BIN)/python bench/bench_scale.py --prompts $(PROMPTS) --shape $(SHAPE) --report var/bench/scale-$(PROMPTS)-$(SHAPE).json $(ARGS)

bench-fleet-scale: $(BIN)/.installed  ## one worker's generate path holding 64 endpoints x 256 slots in flight
	$(BIN)/python bench/bench_fleet_scale.py $(ARGS)

clean:
	rm -rf var .pytest_cache .ruff_cache
