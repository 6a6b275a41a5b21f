"""Comparing trained classifiers as small experiments.

A reference run is scored again with its answer for every held-out example
(`reevaluate_classifier`); two models that answered the same examples are
compared by McNemar's exact test on the examples where they disagree
(`mcnemar`); and a difference counts as established only when it is larger
than both the seeds' spread and the test set's noise (`verdict`).
"""

from __future__ import annotations

from math import comb

import numpy as np

from .runner import compare, held_out_items, kept_items, load_run, metrics_of_items
from .runs import command, locate


def reevaluate_classifier(name):
    """Reference run `name` scored again on its held-out examples (at float32
    matmul precision): the run (its config, history and recorded metrics), the
    recomputed metrics, and `right`, which examples it names correctly. Raises
    if the recomputed metrics differ from the recorded ones by more than
    float32 rounding explains (`measure.compare`): the run must be re-made."""
    directory = locate(name)
    model, data, run = load_run(directory)
    items, metrics = _reproduced(name, directory, model, data, run)
    return {**run, "recomputed": metrics, "right": items["right"]}


def _reproduced(name, directory, model, data, run):
    """(items, metrics) of the loaded run `name` on its held-out set; raises
    ValueError, naming the command that re-makes it, if the metrics differ
    from the recorded ones by more than float32 rounding explains."""
    items = held_out_items(directory, model, data)
    metrics = metrics_of_items(items, data)
    bad = compare(run["metrics"], metrics)
    if bad:
        differ = ", ".join(f"{k} {old} recorded, {new} now" for k, (old, new) in bad.items())
        raise ValueError(f"{name}: the code no longer reproduces its recorded metrics "
                         f"({differ}); re-make it with `make reference RUN={name}`, "
                         f"that is `{command(name)}`")
    return items, metrics


def mcnemar(right_a, right_b):
    """(b, c, p): the examples only A names correctly, only B, and the two-sided
    p-value of McNemar's exact test, 2 P(X <= min(b, c)) for X ~ Binomial(b + c, 1/2)."""
    right_a, right_b = np.asarray(right_a, bool), np.asarray(right_b, bool)
    if right_a.shape != right_b.shape:
        raise ValueError(f"the two models answered different examples: shapes "
                         f"{right_a.shape} and {right_b.shape}")
    b, c = int((right_a & ~right_b).sum()), int((~right_a & right_b).sum())
    n = b + c
    tail = sum(comb(n, k) for k in range(min(b, c) + 1))   # exact, in integers
    return b, c, min(1.0, 2 * tail / 2 ** n)


def mcnemar_pairings(pairings):
    """McNemar's test on every pairing, given as (runs compared, A right,
    B right): [(runs compared, b, c, p), ...]."""
    return [(runs_compared, *mcnemar(a, b)) for runs_compared, a, b in pairings]


def verdict(seeds_a, seeds_b, p, fixed_b=False):
    """Whether a difference between A and B is established, and by what.
    seeds_a, seeds_b: the accuracy of every seed; fixed_b: B is a
    deterministic baseline (one value, no seeds); p: the largest McNemar
    p-value over the pairings of runs."""
    if p >= 0.05:
        return "not established: within the test set's noise"
    if len(seeds_a) < 2 or (len(seeds_b) < 2 and not fixed_b):
        return "beyond the test set's noise; one seed, so the seeds' spread is unmeasured"
    if fixed_b:
        apart = min(seeds_a) > seeds_b[0] or max(seeds_a) < seeds_b[0]
    else:
        apart = abs(np.mean(seeds_a) - np.mean(seeds_b)) > max(np.ptp(seeds_a), np.ptp(seeds_b))
    if apart:
        return "established: larger than the seeds' spread and the test set's noise"
    return "not established: within the seeds' spread"


# --- The book's one procedure for comparing two models ------------------------
#
# A model's score is a mean over seeds of a mean over the same held-out items
# (digits, windows of text). Both levels are noisy: another seed draws another
# model, another test set draws other items. `compare_arms` puts an interval on
# the difference of the two models' scores by a two-level bootstrap, which
# resamples both levels as they were sampled: the seeds of each model with
# replacement, and the test items with replacement, the same items for both
# models (they answered the same test set, so the item noise is shared and
# partly cancels in the difference). A difference is established when its
# interval excludes zero. A page that draws conclusions from m comparisons
# gives each an interval at level 1 - alpha/m (Bonferroni), so that the chance
# of any false "established" on the page stays below alpha = 0.05.

ALPHA = 0.05


def _bootstrap_means(scores, item_weights, rng):
    """(n_boot,) bootstrap means of `scores` (seeds, items): seeds drawn with
    replacement, items weighted by `item_weights` (n_boot, items), the counts
    of each item in a resample of the items."""
    per_seed = scores @ item_weights.T / item_weights.shape[1]       # (seeds, n_boot)
    picks = rng.integers(0, len(scores), size=(item_weights.shape[0], len(scores)))
    return np.take_along_axis(per_seed.T, picks, axis=1).mean(axis=1)


def compare_arms(scores_a, scores_b, *, comparisons=1, alpha=ALPHA, n_boot=10_000, seed=0):
    """The difference of two models' mean scores, A - B, with its two-level
    bootstrap interval at level 1 - alpha / comparisons.

    scores_a (seeds_a, items), scores_b (seeds_b, items): each seed's score on
    each held-out item (1/0 for right/wrong, or a per-item loss), the same items
    in the same order for both. Returns a dict: difference, low, high, level,
    seeds (seeds_a, seeds_b), items, established (the interval excludes 0).
    """
    a = np.atleast_2d(np.asarray(scores_a, dtype=np.float64))
    b = np.atleast_2d(np.asarray(scores_b, dtype=np.float64))
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[1]:
        raise ValueError(f"scores_a and scores_b must be (seeds, items) on the same items, "
                         f"got shapes {a.shape} and {b.shape}")
    if not (isinstance(comparisons, int) and comparisons >= 1):
        raise ValueError(f"comparisons must be a positive int, got {comparisons!r}")
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must lie in (0, 1), got {alpha}")
    rng = np.random.default_rng(seed)
    items = a.shape[1]
    weights = rng.multinomial(items, np.full(items, 1 / items), size=n_boot).astype(np.float64)
    diffs = _bootstrap_means(a, weights, rng) - _bootstrap_means(b, weights, rng)
    level = 1 - alpha / comparisons
    low, high = np.quantile(diffs, [(1 - level) / 2, (1 + level) / 2])
    return {"difference": float(a.mean() - b.mean()), "low": float(low), "high": float(high),
            "level": level, "seeds": (len(a), len(b)), "items": items,
            "established": bool(low > 0 or high < 0)}


# --- Language models: per-window scores for `compare_arms` ------------------------

def reevaluate_language_model(name, *, seed=None, corpus_sha256=None, train_windows=512):
    """Next-step reference run `name` (a character language model) scored again
    on its held-out windows, at float32 matmul precision, as `compare_arms`
    needs it: the run (config, history, recorded metrics, the loaded `model`),
    the recomputed metrics, `window_bits` (n_test,), each held-out window's mean
    loss in bits per token, and `train_bits`, the mean loss in bits per token
    on its first `train_windows` training windows in eval mode (no dropout), to
    set beside the held-out loss. Raises ValueError if the recomputed metrics
    differ from the recorded ones by more than float32 rounding explains
    (naming the command that re-makes the run), or if the run's seed or corpus
    is not `seed` / `corpus_sha256` (when given)."""
    if not (isinstance(train_windows, int) and train_windows >= 1):
        raise ValueError(f"train_windows must be a positive int, got {train_windows!r}")
    directory = locate(name)
    model, data, run = load_run(directory)
    if data["y_test"] is not None:
        raise ValueError(f"{name} is not a next-step model (it has labels): "
                         f"use reevaluate_classifier")
    config = run["config"]
    if seed is not None and config["seed"] != seed:
        raise ValueError(f"{name} was trained with seed {config['seed']}, not {seed}")
    if corpus_sha256 is not None and config.get("corpus_sha256") != corpus_sha256:
        raise ValueError(f"{name} was trained on another corpus "
                         f"(sha256 {config.get('corpus_sha256')}, not {corpus_sha256})")
    items, metrics = _reproduced(name, directory, model, data, run)
    nll = np.asarray(items["nll"], np.float64)                      # (windows, tokens)
    train = kept_items(directory, model, data["x_train"][:train_windows])
    bits = 1 / np.log(2)
    return {**run, "model": model, "recomputed": metrics, "window_bits": nll.mean(1) * bits,
            "train_bits": float(np.asarray(train["nll"], np.float64).mean() * bits)}
