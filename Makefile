# Two commands on a fresh machine: `make demo` and `make test`. Both create .venv and install what they need: the
# demo the core only (`make install`), the tests the `test` extra on top (`make install-test`: pytest, hypothesis,
# MLflow, TensorBoard, Syne Tune, moto, ...). Each install has its own stamp file, redone when pyproject.toml changes.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# The CPU build of torch, installed first; a bare `torch` requirement would pull a multi-GB CUDA build.
TORCH ?= torch==2.13.0

$(VENV)/.core-installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH)"
	$(PY) -m pip install -q -e .
	touch $@

$(VENV)/.test-installed: $(VENV)/.core-installed
	$(PY) -m pip install -q -e ".[test]"
	touch $@

install: $(VENV)/.core-installed

install-test: $(VENV)/.test-installed

# The main demo: a real architecture search (evolution over a CNN space on digits) on an embedded local Ray,
# then NAS-Bench-201's search protocol reproduced on the simulated executor.
demo: install
	$(VENV)/bin/nasplat run examples/quickstart.yaml --name quickstart-$$(date +%s)
	$(PY) benchmarks/nb201.py --runs 100 --datasets cifar10

# Everything, slow tests included, after the linter and the type checker: what CI runs (.ci/run). Hypothesis draws
# under the derandomized `ci` profile (tests/conftest.py); HYPOTHESIS_PROFILE=explore looks for new failures.
test: install-test lint
	$(PY) -m pytest -q

# The same without the tests marked slow (those over a minute).
test-fast: install-test
	$(PY) -m pytest -q -m "not slow"

# The linter and the type checker over the package, the trainers and the search spaces (settings: pyproject.toml).
lint: install-test
	$(VENV)/bin/ruff check nasplat trainers search_spaces
	$(VENV)/bin/mypy

.PHONY: install install-test demo test test-fast lint
