# Two commands on a fresh machine: `make demo` and `make test`. Both create .venv first.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# pytest workers (pytest-xdist, one test file per worker at a time); 0 runs the suite in one process
TEST_WORKERS ?= 2

.PHONY: demo test lint bench venv app-venvs clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e ".[dev,openai-agents,a2a,derive-tests]"
	touch $(STAMP)

venv: $(STAMP)

## Each framework test app's own virtualenv, in the user's cache (tests/APP/requirements.txt;
## rebuilt when that file changes: frameworks pin OpenTelemetry versions the project's
## .venv cannot hold, e.g. google-adk pins opentelemetry <= 1.44, the project >= 1.45)
app-venvs:
	PY=$(PY) bash scripts/app-venv --all

## Run the demo: embedded store, simulated agents, dashboard on http://127.0.0.1:8501
demo: $(STAMP)
	$(BIN)/handoffs demo $(ARGS)

## Lint (ruff, pinned), type-check (mypy, pinned), the layer contracts (import-linter), then
## the whole test suite
## (installs Debian's chromium for the browser tests and prometheus for promtool if missing,
## and builds the framework test apps' venvs when their requirements changed)
test: $(STAMP) app-venvs
	bash scripts/ensure-chromium
	bash scripts/ensure-promtool
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports
	$(BIN)/pytest -n $(TEST_WORKERS) --dist loadfile $(ARGS)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports

bench: $(STAMP)
	for b in bench/*.py; do $(BIN)/python $$b || exit 1; done

clean:
	rm -rf $(VENV) handoffs-data .pytest_cache
