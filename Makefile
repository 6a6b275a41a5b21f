# The Annotated S4: every target installs what it needs (a .venv at the root).
SHELL   := /bin/bash
# The book is built and tested with Python 3.12 and 3.13. PYTHON=... chooses one;
# otherwise the newest of the two found on the PATH (or under pyenv) is used.
SUPPORTED_PYTHONS := 3.13 3.12
ifeq ($(origin PYTHON), undefined)
PYTHON  := $(shell for v in $(SUPPORTED_PYTHONS); do \
	for p in python$$v $$(ls -d $${PYENV_ROOT:-$$HOME/.pyenv}/versions/$$v.*/bin/python$$v 2>/dev/null | sort -rV); do \
	$$p -c 'import sys' 2>/dev/null && { echo $$p; exit 0; }; done; done)
endif
VENV    := .venv
PY      := $(VENV)/bin/python
STAMP   := $(VENV)/.installed

export PYTHONHASHSEED := 0

.PHONY: install notebooks test test-tf32 unit book browser-tools lab bench bench-quick reference clean

# The virtual environment and the pinned dependencies; redone only when the
# requirements or the package metadata change.
$(STAMP): requirements.txt pyproject.toml
	@test -n "$(PYTHON)" || { echo "no Python $(SUPPORTED_PYTHONS) found: install one, or name it with PYTHON=..."; exit 1; }
	@$(PYTHON) -c 'import sys; v = "%d.%d" % sys.version_info[:2]; assert v in "$(SUPPORTED_PYTHONS)".split(), \
		f"$(PYTHON) is Python {v}; the book needs one of $(SUPPORTED_PYTHONS)"'
	@# a .venv made by another Python is made again
	@if [ -x $(PY) ] && [ "$$($(PY) -c 'import sys; print(sys.version_info[:2])')" != \
		"$$($(PYTHON) -c 'import sys; print(sys.version_info[:2])')" ]; then rm -rf $(VENV); fi
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@# --no-compile: pip would byte-compile every file of every package (two thirds of
	@# its time); Python compiles the modules that are imported, once, on first import
	$(PY) -m pip install -q --no-compile -r requirements.txt
	$(PY) -m pip install -q --no-compile --no-deps -e .
	touch $(STAMP)

install: $(STAMP)

# Regenerate the Colab notebooks (book/NN_*.ipynb) from the MyST chapters.
notebooks: $(STAMP)
	$(PY) tools/notebooks.py

# Unit tests and every chapter re-executed by nbval, spread over TEST_WORKERS
# processes (pytest-xdist; a notebook's cells stay together, in order); fails
# if a generated notebook is stale. Every test's and cell's time is written to
# _build/test-times.xml (JUnit XML), the slowest 15 to the terminal. Each process allocates GPU memory as it
# needs it, so that several can share one GPU.
TEST_WORKERS ?= 2

# JAX's persistent compilation cache, for the tests and the book only (not the
# benchmarks, which time first calls): the unit tests compile many identical small
# programs, and the book executes the programs the notebooks' tests compiled. It
# lives under _build, on this machine only (its entries are native code).
JAX_CACHE := JAX_COMPILATION_CACHE_DIR=$(CURDIR)/_build/jax_cache \
	JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0 JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES=0

# The chapters' re-evaluations of reference runs (runner.held_out_items), kept for
# the rest of one `make test` (several pages score the same runs) and for the
# `make book` after it; `make test` starts with it empty, so that it re-evaluates
# every run once. Each result is filed under a digest of the run, the package's
# source, the libraries and the device.
EVAL_CACHE := ANNOTATED_S4_EVAL_CACHE=$(CURDIR)/_build/eval_cache

test: $(STAMP) browser-tools
	$(PY) tools/notebooks.py --check
	rm -rf _build/eval_cache
	$(JAX_CACHE) $(EVAL_CACHE) XLA_PYTHON_CLIENT_PREALLOCATE=false $(PY) -m pytest -p no:cacheprovider \
		-n $(TEST_WORKERS) --dist loadfile --nbval-lax --nbval-cell-timeout=900 \
		--durations=15 --junitxml=_build/test-times.xml $(wildcard book/*.ipynb) tests

# `make test` as an NVIDIA GPU of compute capability >= 8.0 would run it, on any
# machine: float32 matrix products round their operands to TensorFloat-32, as JAX
# does there at its default matmul precision (annotated_s4/precision.py).
test-tf32: export ANNOTATED_S4_EMULATE_TF32 := 1
test-tf32: test

unit: $(STAMP)
	$(JAX_CACHE) $(PY) -m pytest -p no:cacheprovider -q tests

# Build the site, then check it: no tracebacks, every image present, every link
# resolving, no Markdown table left as raw text (check_site.py); then in headless
# Chromium at 1280 and 390 px (check_browser.py): formulas typeset whole, nothing
# clipped, listings scrolling, the navigation opening. Chapters are executed through
# jupyter-cache (_build/.jupyter_cache): after an edit, only the chapters whose
# code changed run again. The cache is dropped when the package, the reference
# runs or the pins are newer than the last complete build, so that every chapter then
# re-executes; a fresh clone has no cache. Any cell error or Sphinx warning fails.
CACHE_STAMP := _build/.book-built

# The browser check's tools: Chromium from the system's packages, and MathJax 3
# from npm (unpacked under _build, so the pages render offline during the check).
MATHJAX := _build/mathjax/es5/tex-chtml.js

browser-tools: $(MATHJAX)
	@command -v chromium >/dev/null || command -v chromium-browser >/dev/null || \
		{ apt-get update -q && apt-get install -y -q chromium; }

$(MATHJAX):
	mkdir -p _build/mathjax
	cd _build && npm pack -q mathjax@3.2.2 && tar xzf mathjax-3.2.2.tgz -C mathjax \
		--strip-components=1 && rm mathjax-3.2.2.tgz
	test -f $(MATHJAX)

book: $(STAMP) browser-tools
	rm -rf _build/html
	@if [ ! -e $(CACHE_STAMP) ] || [ -n "$$(find annotated_s4 reference_runs requirements.txt \
		-newer $(CACHE_STAMP) -print -quit)" ]; then \
		echo "no complete build since the package last changed: executing every chapter"; \
		rm -rf _build/.jupyter_cache _build/.doctrees; fi
	$(JAX_CACHE) $(EVAL_CACHE) $(VENV)/bin/jupyter-book build . --builder html -W --keep-going
	$(PY) tools/check_site.py _build/html
	$(PY) tools/check_browser.py _build/html --mathjax _build/mathjax
	touch $(CACHE_STAMP)

# Re-create the trained reference runs under reference_runs/ (all, or RUN=name);
# `python -m annotated_s4 reference list` prints the command of each.
reference: $(STAMP)
	$(PY) -m annotated_s4 reference train $(RUN)

# Read and run the chapters interactively: JupyterLab from the .venv, with
# jupytext, so that the MyST chapters (book/*.md) open as notebooks.
LAB_STAMP := $(VENV)/.lab-installed
LAB_SETTINGS := $(VENV)/share/jupyter/lab/settings/overrides.json

$(LAB_STAMP): $(STAMP)
	$(PY) -m pip install -q jupyterlab==4.6.6
	mkdir -p $(dir $(LAB_SETTINGS))
	echo '{"@jupyterlab/docmanager-extension:plugin": {"defaultViewers": {"markdown": "Jupytext Notebook", "myst": "Jupytext Notebook"}}}' > $(LAB_SETTINGS)
	touch $(LAB_STAMP)

lab: $(LAB_STAMP)
	$(VENV)/bin/jupyter lab book

bench: $(STAMP)
	for b in benchmarks/bench_*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

bench-quick: $(STAMP)
	for b in benchmarks/bench_*.py; do echo "== $$b"; $(PY) $$b --quick || exit 1; done

clean:
	rm -rf _build benchmarks/results .pytest_cache
