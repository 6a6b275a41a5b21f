"""The book's reference runs: the table of them (runs.toml, read into `RUNS`:
each run's name, what it is for and the command-line options that make it)
and where each one's files are (`locate`).

Each run is one command of the command line (`python -m annotated_s4 train`,
`command(name)`); its directory, reference_runs/<name>, holds config.json,
history.json, metrics.json and a pickle-free checkpoint.npz.

The runs live in the repository, not in the installed package. Where the
package was installed without them (Colab's pip install), `locate(name)`
downloads a run's files from the repository into the download cache and
checks each against the SHA-256 that the package's manifest
(`annotated_s4/reference_runs.json`, rewritten by `reference.train`) records.
"""

from __future__ import annotations

import json
import os
import shlex
import tomllib

from .checkpoint import RUN_FILES

__all__ = ["ROOT", "TABLE", "RUNS", "PURPOSES", "read_table", "MEMORY_LENGTHS", "SYNTHETIC_SEEDS",
           "SELECTIVE_SEEDS", "INDUCTION_SEEDS", "MQAR_SEEDS", "MNIST_SEEDS", "INIT_SEEDS", "CONSTANT_SEEDS", "CHARLM_SEEDS", "OPTIM_SEEDS",
           "MANIFEST", "RAW_URL", "RESULTS_MANIFEST", "run_dir", "command", "available",
           "manifest", "write_manifest", "locate", "results_manifest", "write_results_manifest",
           "locate_result"]

_REPOSITORY = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROOT = os.path.join(_REPOSITORY, "reference_runs")
MANIFEST = os.path.join(os.path.dirname(os.path.abspath(__file__)), "reference_runs.json")
# Where `locate` downloads from: the repository of _config.yml, at its branch
# (a test keeps the two in agreement).
RAW_URL = "https://raw.githubusercontent.com/annotated-s4/annotated-s4-book/main/"
# The benchmark results the repository commits, and their checksums.
RESULTS_DIR = "benchmarks/results"
RESULTS_MANIFEST = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "benchmark_results.json")

# The table of runs, one entry per run, with its name, what it is for, and the
# command-line options that make it (the output directory is added): runs.toml,
# beside this module.
TABLE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "runs.toml")


def read_table(path=TABLE):
    """(runs, purposes): name -> the run's options (a list of arguments), and
    name -> what the run is for, in the table's order."""
    with open(path, "rb") as f:
        entries = tomllib.load(f)["run"]
    runs, purposes = {}, {}
    for entry in entries:
        if set(entry) != {"name", "purpose", "options"}:
            raise ValueError(f"{path}: each run has a name, a purpose and options, got {entry}")
        if entry["name"] in runs:
            raise ValueError(f"{path}: run {entry['name']} is listed twice")
        runs[entry["name"]] = shlex.split(entry["options"])
        purposes[entry["name"]] = entry["purpose"]
    return runs, purposes


RUNS, PURPOSES = read_table()

# The seeds and lengths of the table's families of runs, as the pages iterate
# over them (tests/test_reference.py checks that every member is in the table).
OPTIM_SEEDS = (0, 1, 2)            # optim-{recipe,decay,fullrate}[-seedK]
MNIST_SEEDS = (0, 1, 2)            # mnist-<layer>[-seedK]
INIT_SEEDS = (0, 1, 2, 3, 4)      # init-{mnist,pmnist}-{hippo,gaussian}[-seedK], dense-mnist-{hippo,gaussian}[-seedK]
CONSTANT_SEEDS = (0, 1, 2, 3, 4)  # memory1024-const-{s4,s4-random}[-seedK]
CHARLM_SEEDS = (0, 1, 2)           # charlm-<layer>[-seedK]
SYNTHETIC_SEEDS = (0, 1, 2)        # {induction-head,associative-recall}-<layer>[-seedK]
NOSHIFT_SEEDS = (0, 1, 2, 3, 4)    # {induction-head,associative-recall}-h3[-noshift][-seedK]
SELECTIVE_SEEDS = (0, 1, 2, 3, 4)  # selective-copying-<layer>[-seedK]
INDUCTION_SEEDS = (0, 1, 2, 3, 4)  # induction64-<layer>[-seedK]
MQAR_SEEDS = (0, 1, 2, 3, 4)       # mqar-<layer>[-seedK]
MEMORY_LENGTHS = (64, 256, 1024, 4096)   # memory<L>-<layer>


def seeded(name, seed):
    """The name of seed `seed`'s member of the family whose seed-0 run is `name`."""
    return name if seed == 0 else f"{name}-seed{seed}"


def family(name, seeds):
    """The runs of the family `name` (its seed-0 run), one per seed, in order."""
    names = [seeded(name, s) for s in seeds]
    missing = [n for n in names if n not in RUNS]
    if missing:
        raise ValueError(f"seeds: no reference run named {missing}")
    return names


def run_dir(name, root=None):
    return os.path.join(root or ROOT, name)


def command(name):
    """The shell command that (re)creates run `name`."""
    return " ".join(["python -m annotated_s4 train", *RUNS[name], "--out",
                     f"reference_runs/{name}"])


def _names(names):
    unknown = sorted(set(names) - set(RUNS))
    if unknown:
        raise ValueError(f"no reference run named {unknown}; the runs are {sorted(RUNS)}")
    return list(names) or list(RUNS)


def available(root=None):
    """The names of the finished runs under `root` (metrics.json, written last,
    is there)."""
    return [n for n in RUNS if os.path.exists(os.path.join(run_dir(n, root), "metrics.json"))]


def manifest(root=None):
    """{run: {file: sha256}} of the finished runs under `root`."""
    from .data import file_sha256

    return {name: {f: file_sha256(os.path.join(run_dir(name, root), f)) for f in RUN_FILES}
            for name in available(root)}


def write_manifest(root=None, path=MANIFEST):
    """Record the finished runs' checksums in the package's manifest."""
    with open(path, "w") as f:
        json.dump(manifest(root), f, indent=1, sort_keys=True)
        f.write("\n")


def results_manifest(names, root=None):
    """{file: sha256} of the benchmark results `names` under
    <root>/benchmarks/results (root: the repository)."""
    from .data import file_sha256

    folder = os.path.join(root or _REPOSITORY, RESULTS_DIR)
    return {name: file_sha256(os.path.join(folder, name)) for name in names}


def write_results_manifest(names, root=None, path=RESULTS_MANIFEST):
    """Record the committed benchmark results' checksums in the package, so
    that a page can load them where the repository is not (`locate_result`)."""
    with open(path, "w") as f:
        json.dump(results_manifest(names, root), f, indent=1, sort_keys=True)
        f.write("\n")


def locate_result(name, root=None, url=RAW_URL):
    """The path of benchmark result `name` (benchmarks/results/<name>, written
    by a script of benchmarks/): the repository's file when it is there, else
    a copy downloaded from `url` into the download cache, checked against the
    SHA-256 that the package's results manifest records."""
    from .data import cache_dir, fetch

    local = os.path.join(root or _REPOSITORY, RESULTS_DIR, name)
    if os.path.exists(local):
        return local
    with open(RESULTS_MANIFEST) as f:
        sums = json.load(f)
    if name not in sums:
        raise FileNotFoundError(f"benchmark result {name} is neither at {local} nor in the "
                                f"manifest {RESULTS_MANIFEST} (known: {sorted(sums)})")
    return fetch(name, os.path.join(cache_dir(), "benchmark_results"),
                 [f"{url}{RESULTS_DIR}/"], sums[name])


def locate(name, root=None, url=RAW_URL):
    """The directory of run `name`: the repository's reference_runs/<name> when
    it is there, else a copy downloaded from `url` into the download cache
    (`data.cache_dir()`), every file checked against the manifest's SHA-256."""
    from .data import cache_dir, fetch

    _names([name])
    local = run_dir(name, root)
    if all(os.path.exists(os.path.join(local, f)) for f in RUN_FILES):
        return local
    with open(MANIFEST) as f:
        sums = json.load(f).get(name)
    if sums is None:
        raise FileNotFoundError(f"reference run {name} is neither at {local} nor in the "
                                f"manifest {MANIFEST}: train it with `make reference "
                                f"RUN={name}`")
    directory = os.path.join(cache_dir(), "reference_runs", name)
    for f in RUN_FILES:
        fetch(f, directory, [f"{url}reference_runs/{name}/"], sums[f])
    return directory
