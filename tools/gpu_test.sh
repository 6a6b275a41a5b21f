#!/usr/bin/env bash
# The whole test suite on a machine whose Python already has JAX with CUDA:
# what `make test` runs (tools/notebooks.py --check, then pytest --nbval-lax
# over every chapter's notebook and every test, --dist loadfile), with one
# worker per core, writing a log (each test named as it ends: a run cut off
# by a time limit still says which passed) and a JUnit XML file; the benchmarks too if
# asked.
#
#     tools/gpu_test.sh [--out DIR] [--python PY] [--wheels DIR] [--workers N]
#                       [--bench | --bench-quick] [-- PYTEST_ARGS...]
#
#   --out DIR       where the log (pytest.log), each failure's report as it
#                   happens (failures.txt), junit.xml, the device's
#                   description (device.txt) and the benchmarks' output go
#                   (default: _build/gpu-test)
#   --python PY     the Python that has JAX (default: python3)
#   --wheels DIR    no network: if anything is missing, install every wheel
#                   in DIR as it is (--no-deps; tools/gpu_wheels.sh DIR
#                   downloads a consistent set, of which the optional debugpy
#                   and jedi may be left out)
#   --workers N     pytest-xdist workers (default: the number of cores)
#   --bench         afterwards, run every benchmarks/bench_*.py (full sweeps);
#   --bench-quick   or their --quick sweeps. On a GPU they write
#                   benchmarks/results/*_gpu.json, copied into DIR/bench.
#   -- ARGS         pytest arguments that replace the notebooks and tests
#                   (e.g. -- tests/test_attention.py)
#
# Nothing is installed into PY itself: a virtual environment DIR/venv that
# sees PY's packages (--system-site-packages) receives what is missing:
# nbval, ipykernel, jupytext, celluloid, mlxtend, pytest-xdist, jaxtyping (the
# package's shape annotations), beartype (their checker in the tests), and their
# dependencies, at the versions requirements.txt pins. The exit status is
# pytest's (that of the benchmarks if they fail after the tests passed).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUT=$ROOT/_build/gpu-test
PYTHON=python3
WHEELS=
WORKERS=$(nproc)
BENCH=
PYTEST_ARGS=()

usage() { sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit "${1:-0}"; }
die() { echo "gpu_test.sh: $*" >&2; exit 2; }

while [ $# -gt 0 ]; do
    case $1 in
        --out) OUT=${2:?--out needs a directory}; shift 2 ;;
        --python) PYTHON=${2:?--python needs an interpreter}; shift 2 ;;
        --wheels) WHEELS=${2:?--wheels needs a directory}; shift 2 ;;
        --workers) WORKERS=${2:?--workers needs a number}; shift 2 ;;
        --bench) BENCH=full; shift ;;
        --bench-quick) BENCH=quick; shift ;;
        -h|--help) usage ;;
        --) shift; PYTEST_ARGS=("$@"); break ;;
        *) echo "gpu_test.sh: unknown option $1" >&2; usage 2 ;;
    esac
done
[[ $WORKERS =~ ^[1-9][0-9]*$ ]] || die "--workers must be a positive whole number, got $WORKERS"
[ -z "$WHEELS" ] || [ -d "$WHEELS" ] || die "--wheels: no directory $WHEELS"
command -v "$PYTHON" >/dev/null || die "--python: no interpreter $PYTHON"
"$PYTHON" -c 'import jax' 2>/dev/null || die "$PYTHON cannot import jax: install JAX's CUDA build first"
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
[ -z "$WHEELS" ] || WHEELS=$(cd "$WHEELS" && pwd)
cd "$ROOT"

# --- A virtual environment over PY's packages, with what is missing ------------------
VENV=$OUT/venv
PY=$VENV/bin/python
if [ ! -x "$PY" ]; then
    if ! "$PYTHON" -m venv --system-site-packages "$VENV" 2>/dev/null; then
        rm -rf "$VENV"   # no ensurepip (Debian's python3-venv missing): a venv without pip
        "$PYTHON" -m venv --without-pip --system-site-packages "$VENV"
    fi
fi
# PY's own package directories (and the .pth files in them), after the venv's:
# --system-site-packages alone misses them where PY is itself a virtual
# environment.
"$PYTHON" -c 'import site; print("import site; [site.addsitedir(d) for d in %r]"
              % (site.getsitepackages() + [site.getusersitepackages()]))' \
    > "$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/_gpu_test_base.pth"
# The pip that installs into the venv: its own, PY's (pip >= 22.3 can target
# another interpreter), or the pip wheel from --wheels.
if "$PY" -m pip --version >/dev/null 2>&1; then
    PIP=("$PY" -m pip)
elif "$PYTHON" -m pip --version >/dev/null 2>&1; then
    PIP=("$PYTHON" -m pip --python "$PY")
else
    for pip_wheel in "${WHEELS:-/nonexistent}"/pip-*.whl; do break; done
    [ -f "$pip_wheel" ] || die "no pip: neither $PYTHON nor a pip wheel in --wheels has one"
    PIP=("$PY" "$pip_wheel/pip")
fi

# module -> distribution; each missing one is installed at requirements.txt's pin.
MODULES=(nbval:nbval ipykernel:ipykernel jupytext:jupytext celluloid:celluloid
         mlxtend:mlxtend xdist:pytest-xdist pytest:pytest nbformat:nbformat
         jaxtyping:jaxtyping beartype:beartype)
missing=()
for pair in "${MODULES[@]}"; do
    module=${pair%%:*} dist=${pair#*:}
    if ! "$PY" -c "import $module" 2>/dev/null; then
        pin=$(grep -iE "^${dist}==" requirements.txt || true)
        missing+=("${pin:-$dist}")
    fi
done
for module in flax optax numpy scipy matplotlib seaborn pandas sklearn PIL; do
    "$PY" -c "import $module" 2>/dev/null || die "$PYTHON lacks $module (the script installs \
only the test tools; install the scientific stack with JAX first)"
done
if [ ${#missing[@]} -gt 0 ] && [ -n "$WHEELS" ]; then
    # Offline: every wheel in DIR as it is (--no-deps). The set may leave out
    # what is optional (ipykernel's debugpy, IPython's jedi) or what would not
    # fit beside the tree; what is still missing is named, and its tests fail.
    wheels=()
    for w in "$WHEELS"/*.whl; do
        case ${w##*/} in pip-*) ;; *) wheels+=("$w") ;; esac
    done
    echo "installing into $VENV from $WHEELS: ${#wheels[@]} wheels, --no-deps"
    "${PIP[@]}" install -q --no-index --no-deps "${wheels[@]}"
    for pair in "${MODULES[@]}"; do
        "$PY" -c "import ${pair%%:*}" 2>/dev/null \
            || echo "warning: no ${pair#*:} in $WHEELS: what imports it will fail"
    done
elif [ ${#missing[@]} -gt 0 ]; then
    echo "installing into $VENV: ${missing[*]}"
    "${PIP[@]}" install -q "${missing[@]}"
fi
# The notebooks' kernel is this venv's Python (not a python3 kernel found elsewhere).
"$PY" -m ipykernel install --prefix "$VENV" --name python3 >/dev/null
export JUPYTER_PATH=$VENV/share/jupyter${JUPYTER_PATH:+:$JUPYTER_PATH}

# --- The device, the versions ----------------------------------------------------------
export PYTHONPATH=$ROOT${PYTHONPATH:+:$PYTHONPATH} PYTHONHASHSEED=0
# Each worker takes GPU memory as it needs it, so that all of them share one GPU.
export XLA_PYTHON_CLIENT_PREALLOCATE=false
export JAX_COMPILATION_CACHE_DIR=$OUT/jax_cache JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0 \
    JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES=0
# As `make test`: each reference run is re-evaluated once, its result shared by
# the pages and tests that score it (runner.held_out_items), starting empty.
export ANNOTATED_S4_EVAL_CACHE=$OUT/eval_cache
rm -rf "$ANNOTATED_S4_EVAL_CACHE"
"$PY" - <<'EOF' | tee "$OUT/device.txt"
import platform
import jax
from annotated_s4.timing import device_info

info = device_info()
print(f"devices: {jax.devices()}")
print(f"backend {info['platform']}, {info['device_count']} x {info['device_kind']}; "
      f"jax {info['jax']}, jaxlib {info['jaxlib']}"
      + (f", {info['cuda_plugin']}" if "cuda_plugin" in info else ""))
print(f"Python {platform.python_version()}; CPU {info['cpu']}, {info['cpu_cores']} cores")
if info["platform"] != "gpu":
    print("warning: JAX sees no GPU here; the tests run on the CPU")
EOF

# --- The tests, as `make test` runs them ----------------------------------------------
"$PY" tools/notebooks.py --check
if [ ${#PYTEST_ARGS[@]} -eq 0 ]; then
    PYTEST_ARGS=(book/*.ipynb tests)
fi
echo "pytest on ${WORKERS} workers; log: $OUT/pytest.log, JUnit XML: $OUT/junit.xml"
start=$SECONDS
status=0
# tools/pytest_failures.py writes each failure's traceback to failures.txt as it
# happens: a run cut short by a time limit keeps them.
: > "$OUT/failures.txt"
PYTHONPATH=$ROOT/tools:$PYTHONPATH "$PY" -m pytest -p no:cacheprovider -p pytest_failures \
    --failures-file "$OUT/failures.txt" -n "$WORKERS" --dist loadfile --nbval-lax \
    -v --nbval-cell-timeout=900 --durations=15 --junitxml="$OUT/junit.xml" \
    "${PYTEST_ARGS[@]}" 2>&1 | tee "$OUT/pytest.log" || status=$?
[ -f "$OUT/junit.xml" ] || die "pytest wrote no $OUT/junit.xml (status $status)"
"$PY" - "$OUT/junit.xml" "$((SECONDS - start))" <<'EOF' | tee -a "$OUT/device.txt"
import sys
import xml.etree.ElementTree as ET

root = ET.parse(sys.argv[1]).getroot()
suites = [root] if root.tag == "testsuite" else list(root)
count = {k: sum(int(s.get(k, 0)) for s in suites) for k in ("tests", "failures", "errors", "skipped")}
passed = count["tests"] - count["failures"] - count["errors"] - count["skipped"]
print(f"{count['tests']} tests: {passed} passed, {count['failures']} failed, "
      f"{count['errors']} errors, {count['skipped']} skipped, in {sys.argv[2]} s")
EOF

# --- The benchmarks, if asked -----------------------------------------------------------
if [ -n "$BENCH" ]; then
    # the benchmarks time first calls and compilations: no persistent cache
    unset JAX_COMPILATION_CACHE_DIR
    mkdir -p "$OUT/bench"
    run_benchmarks() {
        local b failed=0 quick=()
        [ "$BENCH" = full ] || quick=(--quick)
        for b in benchmarks/bench_*.py; do
            echo "== $b ${quick[*]}"
            "$PY" "$b" "${quick[@]}" || failed=1
        done
        return "$failed"
    }
    bench_status=0
    run_benchmarks 2>&1 | tee "$OUT/bench/bench.log" || bench_status=$?
    for f in benchmarks/results/*_gpu*; do
        [ ! -e "$f" ] || cp "$f" "$OUT/bench/"
    done
    [ "$status" -ne 0 ] || status=$bench_status
fi
exit "$status"
