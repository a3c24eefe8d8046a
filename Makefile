# Two commands on a fresh clone: `make run` and `make test`. Everything else is optional.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
CONFIG ?=

.PHONY: run test lint typecheck check chat bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e .
	touch $@

$(VENV)/.installed-test: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $@ $(VENV)/.installed

run: $(VENV)/.installed
	$(BIN)/switchboard run $(if $(CONFIG),--config $(CONFIG))

chat: $(VENV)/.installed
	$(BIN)/switchboard chat $(if $(CONFIG),--config $(CONFIG))

check: $(VENV)/.installed
	$(BIN)/switchboard check $(if $(CONFIG),--config $(CONFIG))

lint: $(VENV)/.installed-test
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(VENV)/.installed-test
	$(BIN)/mypy

# the browser tests drive Debian's Chromium (never a downloaded browser build)
CHROMIUM ?= /usr/bin/chromium
$(CHROMIUM):
	@if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		apt-get update -qq && apt-get install -y -qq chromium >/dev/null; \
	else echo "the browser tests need Chromium at $(CHROMIUM): apt-get install chromium"; fi

# two pytest workers (pytest-xdist): the suite mostly waits on sockets, timers and subprocesses,
# so two halve its time on two cores; TEST_WORKERS=0 runs it in one process
TEST_WORKERS ?= 2
test: $(VENV)/.installed-test | $(CHROMIUM)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/python -m pytest -n $(TEST_WORKERS)

$(VENV)/.installed-bench: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[test,bench]'
	touch $@ $(VENV)/.installed $(VENV)/.installed-test

bench: $(VENV)/.installed-bench
	@command -v wrk >/dev/null || echo "note: wrk not found (apt-get install wrk); using the aiohttp load generator"
	$(BIN)/python -m bench $(BENCH_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
