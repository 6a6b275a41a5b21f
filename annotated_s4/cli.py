"""The command line: one command, four subcommands.

    python -m annotated_s4 train --dataset digits --layer s4 --steps 800 --out runs/d64
    python -m annotated_s4 evaluate runs/d64
    python -m annotated_s4 sample runs/gen --n 4
    python -m annotated_s4 reference list|train|check [NAME ...]

(`annotated-s4`, the console script, is the same command.) `train` takes the
options of `annotated_s4.config.RunConfig` and those of the layer that
--layer names (its registered options class).
"""

from __future__ import annotations

import argparse
import json
import sys

import jax
import numpy as np

from . import _checks as checks
from . import reference
from .config import from_namespace
from .registry import parse_layer_options, resolve
from .registry import parser as run_parser
from .runner import evaluate_run, load_run, run
from .sample import generate

__all__ = ["COMMANDS", "build_parser", "main"]

_ERRORS = (ValueError, TypeError, FloatingPointError, FileNotFoundError)


def _train(args, layer_args=()):
    """Train: `args` holds the common options, `layer_args` the rest of the
    command line, the options of the layer that --layer names."""
    config = from_namespace(args, parse_layer_options(args.layer, list(layer_args)))
    result = run(resolve(config), cross_run=True)
    return {k: v for k, v in result.items() if k not in ("model", "history")}


def _evaluate(args):
    metrics, recorded = evaluate_run(args.run, cross_run=True)
    print(json.dumps(metrics, indent=1))
    bad = reference.compare(recorded["metrics"], metrics, args.tolerance)
    if bad:
        for k, (old, new) in bad.items():
            print(f"{args.run}: {k} was {old}, is now {new}", file=sys.stderr)
        name = args.run.rstrip("/").split("/")[-1]
        print(f"the code no longer reproduces this run: if the change is intended, "
              f"run `make reference RUN={name}`", file=sys.stderr)
        sys.exit(1)
    return metrics


def _sample(args):
    checks.positive_int(args.n, "--n")
    model, data, _ = load_run(args.run)
    x = np.asarray(data.x_test[:args.n])
    length = args.length or x.shape[1]
    prompt = x.shape[1] // 2 if args.prompt is None else args.prompt
    if not 0 <= prompt <= min(length, x.shape[1]):
        raise ValueError(f"--prompt must be in [0, {min(length, x.shape[1])}], got {prompt}")
    tokens = np.asarray(generate(model, length, key=jax.random.PRNGKey(args.seed),
                                 batch_size=len(x), prefix=x[:, :prompt] if prompt else None,
                                 temperature=args.temperature))
    vocab = data.vocab
    for row in tokens:
        print("".join(vocab[t] for t in row) if vocab else " ".join(map(str, row)))
    return tokens


def _reference(args):
    reference.execute(args)


COMMANDS = {"train": _train, "evaluate": _evaluate, "sample": _sample,
            "reference": _reference}


def build_parser():
    parser = argparse.ArgumentParser(prog="python -m annotated_s4",
                                     description="Train, evaluate and sample state space "
                                                 "models; re-make the book's reference runs.")
    sub = parser.add_subparsers(dest="command", required=True, help="what to do")
    train = run_parser(add_help=False)
    sub.add_parser("train", parents=[train], help="train a model into a run directory",
                   description=train.description, epilog=train.epilog,
                   formatter_class=train.formatter_class, allow_abbrev=False)
    evaluate = sub.add_parser("evaluate", help="re-evaluate a run directory from its "
                              "checkpoint; exit status 1 if a metric moved")
    evaluate.add_argument("run", help="a run directory (config.json, checkpoint.npz, "
                          "metrics.json)")
    evaluate.add_argument("--tolerance", type=float, default=None,
                          help="largest difference from metrics.json accepted, for every "
                               "metric (default: each metric's own, what float32 rounding "
                               "explains)")
    sample = sub.add_parser("sample", help="complete test sequences with a trained "
                            "next-step model, in RNN mode")
    sample.add_argument("run", help="the run directory of a next-token model (charlm, "
                        "digits-gen, mnist-small-gen)")
    sample.add_argument("--n", type=int, default=4, help="how many test sequences")
    sample.add_argument("--prompt", type=int, default=None,
                        help="tokens of each test sequence given as the prompt (default: "
                             "half of it)")
    sample.add_argument("--length", type=int, default=None,
                        help="tokens per sequence, prompt included (default: the test "
                             "sequences' length)")
    sample.add_argument("--temperature", type=float, default=1.0,
                        help="divides the log-probabilities (smaller is greedier)")
    sample.add_argument("--seed", type=int, default=0, help="seed of the draws")
    reference.add_arguments(sub.add_parser(
        "reference", help="list, re-make or check the book's reference runs",
        description=reference.__doc__.split("\n\n")[0]))
    return parser


def main(argv=None):
    """Entry point of `python -m annotated_s4` and of the `annotated-s4` script."""
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)  # train's rest: the layer's options
    if rest and args.command != "train":
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    try:
        return COMMANDS[args.command](*((args, rest) if args.command == "train" else (args,)))
    except _ERRORS as e:
        raise SystemExit(f"error: {e}")
