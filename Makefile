# The Annotated S4: every target installs what it needs (a .venv at the root).
SHELL   := /bin/bash
PYTHON  ?= python3
VENV    := .venv
PY      := $(VENV)/bin/python
STAMP   := $(VENV)/.installed

export PYTHONHASHSEED := 0

.PHONY: install notebooks test unit book bench bench-quick reference clean

# The virtual environment and the pinned dependencies; redone only when the
# requirements or the package metadata change.
$(STAMP): requirements.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -r requirements.txt
	$(PY) -m pip install -q --no-deps -e .
	touch $(STAMP)

install: $(STAMP)

# Regenerate the Colab notebooks (book/NN_*.ipynb) from the MyST chapters.
notebooks: $(STAMP)
	$(PY) tools/notebooks.py

# Unit tests and every chapter re-executed by nbval, spread over TEST_WORKERS
# processes (pytest-xdist; a notebook's cells stay together, in order); fails
# if a generated notebook is stale. Each process allocates GPU memory as it
# needs it, so that several can share one GPU.
TEST_WORKERS ?= 2

test: $(STAMP)
	$(PY) tools/notebooks.py --check
	XLA_PYTHON_CLIENT_PREALLOCATE=false $(PY) -m pytest -p no:cacheprovider \
		-n $(TEST_WORKERS) --dist loadfile --nbval-lax --nbval-cell-timeout=900 \
		--durations=15 $(wildcard book/*.ipynb) tests

unit: $(STAMP)
	$(PY) -m pytest -p no:cacheprovider -q tests

# Build the site (executing every chapter; any cell error or Sphinx warning
# fails), then check it: no tracebacks, every image present, every link resolving.
book: $(STAMP)
	rm -rf _build/html
	$(VENV)/bin/jupyter-book build . --builder html -W --keep-going
	$(PY) tools/check_site.py _build/html

# Re-create the trained reference runs under reference_runs/ (all, or RUN=name);
# `python -m annotated_s4.reference list` prints the command of each.
reference: $(STAMP)
	$(PY) -m annotated_s4.reference train $(RUN)

bench: $(STAMP)
	for b in benchmarks/bench_*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

bench-quick: $(STAMP)
	for b in benchmarks/bench_*.py; do echo "== $$b"; $(PY) $$b --quick || exit 1; done

clean:
	rm -rf _build benchmarks/results .pytest_cache
