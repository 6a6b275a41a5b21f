#!/usr/bin/env bash
# Download the wheels that tools/gpu_test.sh installs on a GPU machine whose
# Python 3.12 already has JAX with CUDA and the scientific stack, so that they
# can be carried to a machine without network:
#
#     tools/gpu_wheels.sh [DIR]          # default DIR: wheels-py312
#     tools/gpu_test.sh --wheels DIR ...  # on the GPU machine
#
# What is downloaded: the test tools pinned in requirements.txt (nbval,
# ipykernel, jupytext, celluloid, mlxtend), jaxtyping (which the package
# imports) and beartype, with every dependency of theirs,
# less what the GPU machine is assumed to have (BASE below, with all of its own
# dependencies, at whatever versions it has), plus pip (to install with where the machine's Python has
# none). The dependencies are resolved by pip for CPython 3.12 on manylinux
# x86_64 (`pip install --dry-run --report`), then each wheel is downloaded with
# `pip download --no-deps` at the version the resolution chose. At the end
# every requirement of every downloaded wheel is checked to be met by another
# downloaded wheel or by BASE, and the set's size is printed.
#
# Needs network (PyPI) and pip >= 22.2; PYTHON=... names the Python whose pip
# runs (default python3; any version: the target is set by the options).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DIR=${1:-wheels-py312}
PYTHON=${PYTHON:-python3}
# The packages the GPU machine's Python already had (see the README, "On a GPU").
BASE=(jax jaxlib flax optax numpy scipy matplotlib seaborn pandas scikit-learn pillow
      pytest pytest-xdist execnet)
EXTRA=(nbval ipykernel jupytext celluloid mlxtend jaxtyping beartype)
TARGET=(--only-binary=:all: --python-version 3.12 --implementation cp
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64
        --platform manylinux2014_x86_64 --platform any)

# "name==version" of each name as requirements.txt pins it (the name alone if unpinned).
pins() {
    local name line
    for name in "$@"; do
        line=$(grep -iE "^${name}==" "$ROOT/requirements.txt" || true)
        echo "${line:-$name}"
    done
}

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
mkdir -p "$DIR"

resolve() {  # resolve() REPORT REQUIREMENT...: what pip would install for the target
    local report=$1
    shift
    "$PYTHON" -m pip install -q --dry-run --ignore-installed "${TARGET[@]}" \
        --target "$WORK/target" --report "$report" "$@"
}

# BASE unpinned: the GPU machine has versions of its own (its JAX is its CUDA build).
mapfile -t extra_pins < <(pins "${EXTRA[@]}")
echo "resolving for CPython 3.12, manylinux x86_64: ${extra_pins[*]}"
resolve "$WORK/base.json" "${BASE[@]}"
resolve "$WORK/extra.json" "${extra_pins[@]}"

# The wheels to fetch: the resolution's packages that BASE's resolution lacks, and pip.
mapfile -t wanted < <("$PYTHON" - "$WORK/base.json" "$WORK/extra.json" <<'EOF'
import json, re, sys

def packages(path):
    norm = lambda n: re.sub(r"[-_.]+", "-", n).lower()
    return {norm(i["metadata"]["name"]): i["metadata"]["version"]
            for i in json.load(open(path))["install"]}

base, extra = packages(sys.argv[1]), packages(sys.argv[2])
for name in sorted(set(extra) - set(base)):
    print(f"{name}=={extra[name]}")
EOF
)
wanted+=("pip==$("$PYTHON" -m pip --version | cut -d' ' -f2)")
echo "downloading ${#wanted[@]} wheels into $DIR"
"$PYTHON" -m pip download -q --no-deps "${TARGET[@]}" -d "$DIR" "${wanted[@]}"

# Every requirement of every wheel in DIR, for Python 3.12 on Linux x86_64,
# is met by a wheel in DIR or is a package of BASE (or one of its dependencies).
"$PYTHON" - "$DIR" "$WORK/base.json" <<'EOF'
import json, pathlib, re, sys, zipfile

try:
    from packaging.requirements import Requirement
except ImportError:  # pip carries its own copy
    from pip._vendor.packaging.requirements import Requirement

norm = lambda n: re.sub(r"[-_.]+", "-", n).lower()
directory = pathlib.Path(sys.argv[1])
base = {norm(i["metadata"]["name"]) for i in json.load(open(sys.argv[2]))["install"]}
env = {"python_version": "3.12", "python_full_version": "3.12.3", "sys_platform": "linux",
       "platform_system": "Linux", "platform_machine": "x86_64", "os_name": "posix",
       "implementation_name": "cpython", "platform_python_implementation": "CPython",
       "extra": ""}
wheels, requires = {}, {}
for wheel in sorted(directory.glob("*.whl")):
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        lines = z.read(meta).decode().splitlines()
    field = lambda key: [l.split(":", 1)[1].strip() for l in lines if l.startswith(key + ":")]
    name = norm(field("Name")[0])
    wheels[name] = field("Version")[0]
    requires[name] = [Requirement(r) for r in field("Requires-Dist")]
missing = []
for name, reqs in requires.items():
    for r in reqs:
        if r.marker is not None and not r.marker.evaluate(env):
            continue
        dep = norm(r.name)
        if dep in wheels:
            if wheels[dep] not in r.specifier:
                missing.append(f"{name} needs {r}, the set has {dep} {wheels[dep]}")
        elif dep not in base:
            missing.append(f"{name} needs {r}: neither in the set nor in the base")
size = sum(w.stat().st_size for w in directory.glob("*.whl"))
print(f"{len(wheels)} wheels, {size / 2**20:.1f} MiB in {directory}")
if missing:
    sys.exit("inconsistent set:\n  " + "\n  ".join(missing))
print("consistent: every requirement is met by the set or by the base packages")
EOF
