"""The book's reference runs: re-made and checked.

Each run is one command of the command line (`python -m annotated_s4 train`),
listed in the table `runs.RUNS`; its directory holds config.json,
history.json, metrics.json and a pickle-free checkpoint.npz.

    python -m annotated_s4 reference train [NAME ...]  # = make reference [RUN=NAME]
    python -m annotated_s4 reference check [NAME ...]  # re-evaluate committed runs
    python -m annotated_s4 reference list              # what each run is for, its command

`check` exits with status 1 if a run's metrics are no longer reproduced by
the code, within the tolerance that float32 rounding explains
(`measure.compare`), naming the run and the command that retrains it.
A run's metrics include those that another run's model computes
(`runner.cross_run_metrics`: the digit generator's completions, read by the
784-step classifier).

The pages reach the runs through this module: it also gives the names of
`runs` (the table, `locate`) and of `completion` (the completed digits).
"""

from __future__ import annotations

import os
import sys
import time

from .completion import (COMPLETION_CLASSIFIERS, complete_digits, completion_accuracy,
                         completions_on_a_boundary)
from .registry import parse
from .runner import compare, cross_run_metrics, evaluate_run, run
from .runs import (CHARLM_SEEDS, MANIFEST, MEMORY_LENGTHS, MNIST_SEEDS, OPTIM_SEEDS,
                   PURPOSES, RAW_URL, ROOT, RUNS, SYNTHETIC_SEEDS, _names, available,
                   command, locate, manifest, run_dir, write_manifest)

__all__ = ["ROOT", "RUNS", "PURPOSES", "MEMORY_LENGTHS", "SYNTHETIC_SEEDS", "MNIST_SEEDS",
           "CHARLM_SEEDS", "OPTIM_SEEDS", "MANIFEST", "RAW_URL",
           "COMPLETION_CLASSIFIERS", "run_dir", "command", "available", "manifest",
           "write_manifest", "locate", "complete_digits", "completion_accuracy",
           "completions_on_a_boundary", "cross_run_metrics", "reevaluate", "compare", "train",
           "check", "add_arguments", "execute"]


def reevaluate(directory):
    """`runner.evaluate_run` of a run directory with its cross-run metrics:
    (recomputed metrics, run); the metrics carry their tolerances (`compare`)."""
    return evaluate_run(directory, cross_run=True)


# --- Training and checking ----------------------------------------------


def train(names=(), root=None, log=print):
    """Train the runs `names` (default: all) from scratch into their directories."""
    for name in _names(names):
        out = run_dir(name, root)
        for f in ("checkpoint.npz", "metrics.json", "history.json", "config.json"):
            if os.path.exists(os.path.join(out, f)):
                os.remove(os.path.join(out, f))
        log(f"== {name}: {command(name)}")
        start = time.perf_counter()
        run(parse(RUNS[name] + ["--out", out]), log=log, cross_run=True)
        log(f"== {name}: {time.perf_counter() - start:.0f} s")
    if root is None:
        write_manifest()


def check(names=(), root=None, log=print):
    """Re-evaluate runs from their checkpoints; returns {name: differences}
    for the runs whose recorded metrics the code no longer reproduces."""
    failed = {}
    for name in _names(names) if names else available(root):
        metrics, recorded = reevaluate(run_dir(name, root))
        bad = compare(recorded["metrics"], metrics)
        log(f"{name}: " + ("ok" if not bad else f"differs {bad}"))
        if bad:
            failed[name] = bad
    return failed


def add_arguments(parser):
    """The options of `python -m annotated_s4 reference`."""
    parser.add_argument("action", choices=["train", "check", "list"],
                        help="train: re-make runs; check: re-evaluate them against their "
                             "metrics.json; list: print what each is for and its command")
    parser.add_argument("names", nargs="*", metavar="NAME",
                        help=f"runs (default: all): {', '.join(RUNS)}")
    return parser


def execute(args):
    """Carry out parsed `reference` options (`add_arguments`)."""
    try:
        if args.action == "list":
            for name in _names(args.names):
                print(f"# {name}: {PURPOSES[name]}\n{command(name)}")
        elif args.action == "train":
            train(args.names)
        else:
            failed = check(args.names)
            if failed:
                for name in failed:
                    print(f"{name}: the code no longer reproduces its metrics; if the "
                          f"change is intended, run `make reference RUN={name}`",
                          file=sys.stderr)
                sys.exit(1)
    except (ValueError, FileNotFoundError) as e:
        raise SystemExit(f"error: {e}")
