"""Re-evaluate a run directory from its checkpoint.

    python -m annotated_s4.evaluate reference_runs/digits64-s4

rebuilds the model from config.json, loads checkpoint.npz, recomputes the
test metrics on the test split and prints them as JSON; it exits with status 1
if one differs from metrics.json by more than the tolerance (1e-4), so that a
change to the code that moves a trained model's result is noticed.
"""

from __future__ import annotations

import argparse
import json
import sys

import jax
import numpy as np

from .checkpoint import load_checkpoint, read_run
from .cli import args_from_config, build_model, extra_metrics, load_dataset, test_metrics
from .train import evaluate

__all__ = ["TOLERANCE", "load_run", "evaluate_run", "complete_digits",
           "completion_accuracy", "compare", "main"]

TOLERANCE = 1e-4


def load_run(directory):
    """(model, data, run) of a run directory: the model built from its config
    with the checkpoint's weights, the dataset it was trained on, and the
    run's config/history/metrics dicts."""
    run = read_run(directory)
    config = run["config"]
    args = args_from_config(config, directory)
    data = load_dataset(args)
    if data.get("corpus_sha256", config.get("corpus_sha256")) != config.get("corpus_sha256"):
        raise ValueError(
            f"{directory} was trained on a different text (sha256 "
            f"{config['corpus_sha256'][:12]}...) than the package's corpus "
            f"({data['corpus_sha256'][:12]}...): evaluate it with the version of the "
            f"package it was trained with, or retrain it (make reference RUN=<name>)")
    model = build_model(args, data)
    load_checkpoint(directory, model)
    return model, data, run


def evaluate_run(directory):
    """The run's test metrics recomputed from its checkpoint, and the run:
    its config, history and recorded metrics, the loaded `model` and the
    `data` it was trained and tested on (the CLI's dataset dict)."""
    model, data, run = load_run(directory)
    evaluation = evaluate(model, data["x_test"], data["y_test"])
    metrics = test_metrics(evaluation, data)
    return {**metrics, **extra_metrics(data, model)}, {**run, "model": model, "data": data}


def complete_digits(model, digits, *, seed=0, temperature=1.0):
    """The 8x8 digits (n, 64) grey levels with their bottom half replaced by
    the next-pixel `model`'s completion of the top half, in RNN mode."""
    from .sample import generate

    digits = np.asarray(digits)
    half = digits.shape[1] // 2
    return np.asarray(generate(model, digits.shape[1], key=jax.random.PRNGKey(seed),
                               prefix=digits[:, :half], temperature=temperature))


def completion_accuracy(model, classifier, digits, labels, *, side=28, seed=0):
    """The fraction of `digits` whose top half, completed by `model`, the
    `classifier` (trained on digits upsampled to side x side) labels as the
    true digit; and the completed digits."""
    from .data import digit_pixels

    completed = complete_digits(model, digits, seed=seed)
    pixels = digit_pixels(completed.reshape(-1, 8, 8), side)
    return evaluate(classifier, pixels, np.asarray(labels))["accuracy"], completed


def compare(recorded, recomputed, tolerance=TOLERANCE):
    """{name: (recorded, recomputed)} of the metrics that differ by more than
    `tolerance`."""
    return {k: (recorded.get(k), v) for k, v in recomputed.items()
            if recorded.get(k) is None or abs(recorded[k] - v) > tolerance}


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m annotated_s4.evaluate",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("run", help="a run directory (config.json, checkpoint.npz, metrics.json)")
    p.add_argument("--tolerance", type=float, default=TOLERANCE)
    args = p.parse_args(argv)
    try:
        metrics, run = evaluate_run(args.run)
    except (FileNotFoundError, ValueError, TypeError) as e:
        raise SystemExit(f"error: {e}")
    print(json.dumps(metrics, indent=1))
    bad = compare(run["metrics"], metrics, args.tolerance)
    if bad:
        for k, (old, new) in bad.items():
            print(f"{args.run}: {k} was {old}, is now {new}", file=sys.stderr)
        name = args.run.rstrip("/").split("/")[-1]
        print(f"the code no longer reproduces this run: if the change is intended, "
              f"run `make reference RUN={name}`", file=sys.stderr)
        sys.exit(1)
    return metrics


if __name__ == "__main__":
    main()
