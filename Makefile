# Two commands on a fresh machine: `make demo` and `make test`. Both create .venv and install what they need.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# The CPU build of torch; a bare `torch` requirement would pull a multi-GB CUDA build.
TORCH ?= torch==2.13.0

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH)"
	$(PY) -m pip install -q -e ".[test]"
	touch $@

install: $(VENV)/.installed

# The main demo: a real architecture search (evolution over a CNN space on digits) on an embedded local Ray,
# then NAS-Bench-201's search protocol reproduced on the simulated executor.
demo: install
	$(VENV)/bin/nasplat run examples/quickstart.yaml --name quickstart-$$(date +%s)
	$(PY) benchmarks/nb201.py --runs 100 --datasets cifar10

test: install
	$(PY) -m pytest -q

.PHONY: install demo test
