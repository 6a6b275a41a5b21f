# The Annotated S4: every target installs what it needs (a .venv at the root).
SHELL   := /bin/bash
PYTHON  ?= python3
VENV    := .venv
PY      := $(VENV)/bin/python
STAMP   := $(VENV)/.installed

export PYTHONHASHSEED := 0

.PHONY: install notebooks test unit book bench bench-quick clean

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

# Unit tests, then every chapter re-executed by nbval; fails if a generated
# notebook is stale.
test: $(STAMP)
	$(PY) tools/notebooks.py --check
	$(PY) -m pytest -p no:cacheprovider --nbval-lax --nbval-cell-timeout=900 \
		--durations=15 tests $(wildcard book/*.ipynb)

unit: $(STAMP)
	$(PY) -m pytest -p no:cacheprovider -q tests

# Build the site (executing every chapter; any cell error or Sphinx warning
# fails), then check it: no tracebacks, every image present, every link resolving.
book: $(STAMP)
	rm -rf _build/html
	$(VENV)/bin/jupyter-book build . --builder html -W --keep-going
	$(PY) tools/check_site.py _build/html

bench: $(STAMP)
	for b in benchmarks/bench_*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

bench-quick: $(STAMP)
	for b in benchmarks/bench_*.py; do echo "== $$b"; $(PY) $$b --quick || exit 1; done

clean:
	rm -rf _build benchmarks/results .pytest_cache
