"""Comparing trained classifiers as small experiments.

A reference run is scored again with its answer for every held-out example
(`reevaluate_classifier`); two models that answered the same examples are
compared by McNemar's exact test on the examples where they disagree
(`mcnemar`). Whether a difference is established is decided by the book's
one procedure, `compare_arms`: two models scored item by item over several
seeds (classifiers, or language models through `reevaluate_language_model`)
are compared by Welch's interval on their seeds' means, and, where the items
are independent draws, by a paired interval over the items as well.
"""

from __future__ import annotations

import math
from math import comb

import numpy as np
from scipy import stats

from . import _checks
from .measure import RECORDED_BATCH
from .runner import (compare, held_out_items, kept_items, load_model, load_run,
                     metrics_of_items, read_config)
from .datasets import RECALL_TASKS
from .runs import command, locate


def reevaluate_classifier(name):
    """Reference run `name` scored again on its held-out examples (at float32
    matmul precision): the run (its config, history and recorded metrics, the
    loaded `model`), the recomputed metrics, and `right`, which examples it
    names correctly. Raises if the recomputed metrics differ from the recorded
    ones by more than float32 rounding explains (`measure.compare`): the run
    must be re-made."""
    directory = locate(name)
    model, data, run = load_run(directory)
    items, metrics = reproduced(name, directory, model, data, run)
    return {**run, "model": model, "recomputed": metrics, "right": items["right"]}


AT_LENGTHS_TOKENS = 2 ** 16   # tokens a batch of `at_lengths` (64 sequences of 1,024)


def at_lengths(name, lengths, n=512, seed_offset=2):
    """Recall run `name` tested at other lengths: for each L in `lengths`, n
    fresh sequences of L tokens drawn by the run's task generator with its
    vocabulary and the seed seed_data + `seed_offset` (its training and test
    sets use seed_data and seed_data + 1), scored on their answers by the
    run's model with its layers built for length L (`load_run`'s `length`),
    in batches of at most RECORDED_BATCH sequences and AT_LENGTHS_TOKENS
    tokens (at least one sequence): fewer, longer sequences a batch as L
    grows, so that memory (attention's L x L scores above all) stays bounded,
    but not so few that a recurrent scan runs many short batches one after
    another. An item's statistics do not depend on its batch.
    Returns {L: (n, answers) bool array of right answers}, (n,) for one answer.
    """
    directory = locate(name)
    _, data, run = load_run(directory)
    config = read_config(run["config"], directory)
    if not data.recall:
        raise ValueError(f"{name} is not a recall task (dataset {config.dataset!r})")
    task = RECALL_TASKS[config.dataset]
    n = _checks.positive_int(n, "n")
    right = {}
    for L in lengths:
        L = _checks.positive_int(L, "length")
        x, y = task(np.random.default_rng(config.seed_data + seed_offset), n, seq_len=L,
                    vocab_size=config.vocab_size)
        batch = max(1, min(RECORDED_BATCH, AT_LENGTHS_TOKENS // L))
        right[L] = kept_items(directory, load_model(directory, config, data, L), x, y,
                              batch)["right"]
    return right


def reproduced(name, directory, model, data, run, batch_size=RECORDED_BATCH):
    """(items, metrics) of the loaded run `name` on its held-out set (scored in
    batches of `batch_size`); raises ValueError, naming the command that
    re-makes it, if the metrics differ from the recorded ones by more than
    float32 rounding explains."""
    items = held_out_items(directory, model, data, batch_size)
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


# --- The book's one procedure for comparing two models ------------------------
#
# A model's score is a mean over seeds of a mean over the same held-out items
# (digits, windows of text). The seeds are the experiment's replicates: each is
# an independent training run, while the items are one fixed test set that
# every run reads. So `compare_arms` reduces each seed to its mean over the
# items and compares the two models' seed means with Welch's t interval. A
# difference is established when its interval excludes zero and each arm has
# at least five seeds (the last rule, below). A page that draws
# conclusions from m comparisons gives each an interval at level 1 - alpha/m
# (Bonferroni), so that the chance of any false "established" among those m
# comparisons (the ones the page counts) is nominally below alpha = 0.05.
# Nominally: the bound holds if each interval keeps its level. Welch's interval
# keeps it, or errs on the safe side, when the seed means are roughly normal and
# the two models' spreads are within a factor of about two of each other (with
# equal spreads and equal seed counts it is a little wider than it needs to
# be). With very unequal spreads and few seeds it is somewhat liberal: with 3
# seeds a side, normal seed means and one spread 4 to 10 times the other, it
# calls a difference between identical models "established" about 1.3 to 1.8
# times as often as its level allows at the Bonferroni tails (level 1 - 0.05/6).
#
# Hence the procedure's last rule: a difference is *established* only when its
# interval excludes zero and every arm that has seeds has at least
# MIN_SEEDS = 5 of them. With fewer, the interval is still reported (and
# `excludes_zero` says on which side it lies), but no conclusion is drawn:
# three seeds cannot check the normality the interval assumes, and with
# unequal spreads they leave it liberal, as above.

ALPHA = 0.05
MIN_SEEDS = 5


def compare_arms(scores_a, scores_b, *, comparisons=1, alpha=ALPHA, b_fixed=False,
                 items_independent=False):
    """The difference of two models' mean scores, A - B, with its Welch t
    interval on the seeds' means, at level 1 - alpha / comparisons.

    scores_a (seeds_a, items), scores_b (seeds_b, items): each seed's score on
    each held-out item (1/0 for right/wrong, or a per-item loss), the same items
    in the same order for both; at least 2 seeds a side. Returns a dict:
    difference, low, high, level, df (the Welch-Satterthwaite degrees of
    freedom), seeds (seeds_a, seeds_b), items, excludes_zero (the interval
    excludes 0), established (it excludes 0 and each arm that has seeds has
    at least MIN_SEEDS of them: the book draws no conclusion from fewer).

    b_fixed: B is deterministic (one row: a model that gives the same answers
    whatever the seed, such as an SVM); the interval is then A's one-sample t
    interval around B's score, with seeds_a - 1 degrees of freedom.
    items_independent: the items are independent draws (separate test digits,
    not overlapping windows of one text); the test set's own sampling noise is
    then measured too, by the paired t interval over the items of
    d_j = (A's mean over seeds on item j) - (B's), at the same level, returned
    as items_low, items_high, and a difference is established only when both
    intervals exclude 0 on the same side: other seeds would reproduce it, and
    so would another test set.

    Each seed is reduced to its mean over the items, m_i, and the interval is
    difference +- t(df, (1 + level) / 2) * se, with se^2 = s_a^2/n_a + s_b^2/n_b
    from the seed means' sample variances and df = se^4 / sum_k (s_k^2/n_k)^2
    / (n_k - 1). Why the seeds and not the items: the seeds are the unit of
    replication. The items are shared, so their own difficulty moves every
    seed mean alike and cancels in the difference; what is left of them (how
    one run fares on one item) is already in each seed's mean, hence in the
    seeds' spread. Resampling items as if they were independent would
    understate the noise twice over: the items need not be independent (the
    held-out windows of a language model start at random points of one text
    and overlap), and with a handful of seeds a bootstrap of the seeds
    underestimates their variance by the factor (n - 1) / n and has normal
    rather than t tails: with 3 seeds a side and the seeds' spread larger
    than the items' noise, such a bootstrap calls several times more
    differences between identical models "established" than its level
    allows (tests/test_evidence.py simulates that case). With few seeds the
    t interval is wide, and that is the honest width. It is conditional on
    the test set: it says whether other seeds would reproduce the difference
    on these items, not whether it holds on other text.
    """
    a = np.atleast_2d(np.asarray(scores_a, dtype=np.float64))
    b = np.atleast_2d(np.asarray(scores_b, dtype=np.float64))
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[1]:
        raise ValueError(f"scores_a and scores_b must be (seeds, items) on the same items, "
                         f"got shapes {a.shape} and {b.shape}")
    b_fixed = _checks.flag(b_fixed, "b_fixed")
    items_independent = _checks.flag(items_independent, "items_independent")
    if b_fixed and len(b) != 1:
        raise ValueError(f"scores_b must hold one row when b_fixed (a deterministic model), "
                         f"got {len(b)}")
    for name, arm in (("scores_a", a), ("scores_b", b)):
        if not (name == "scores_b" and b_fixed) and len(arm) < 2:
            raise ValueError(f"{name} must hold at least 2 seeds (rows), got {len(arm)}: "
                             f"one seed says nothing about the seeds' spread")
        if not np.isfinite(arm).all():
            raise ValueError(f"{name} must be finite")
    comparisons = _checks.positive_int(comparisons, "comparisons")
    alpha = _checks.number(alpha, "alpha", low=0.0, high=1.0, low_open=True, high_open=True)
    ma, mb = a.mean(axis=1), b.mean(axis=1)                       # each seed's mean
    va = ma.var(ddof=1) / len(ma)                                 # squared standard errors
    vb = 0.0 if b_fixed else mb.var(ddof=1) / len(mb)
    se = math.sqrt(va + vb)
    if b_fixed:
        df = float(len(ma) - 1)
    elif se == 0:                 # every seed alike: no spread to spread the interval
        df = float(len(ma) + len(mb) - 2)
    else:
        df = _welch_df(va, vb, len(ma), len(mb))
    level = 1 - alpha / comparisons
    difference = float(ma.mean() - mb.mean())
    low, high = _t_interval(difference, se, df, level)
    excludes_zero = bool(low > 0 or high < 0)
    result = {"difference": difference, "low": low, "high": high, "level": level, "df": df,
              "seeds": (len(a), 1 if b_fixed else len(b)), "items": a.shape[1]}
    if items_independent:
        d = a.mean(axis=0) - b.mean(axis=0)                       # per item, seeds averaged
        items_low, items_high = _t_interval(difference, d.std(ddof=1) / math.sqrt(len(d)),
                                            len(d) - 1.0, level)
        result.update(items_low=items_low, items_high=items_high)
        excludes_zero = bool((low > 0 and items_low > 0) or (high < 0 and items_high < 0))
    enough_seeds = len(a) >= MIN_SEEDS and (b_fixed or len(b) >= MIN_SEEDS)
    result.update(excludes_zero=excludes_zero, established=excludes_zero and enough_seeds)
    return result


def describe(result, scale=100, unit=" points", digits=1):
    """One line for a `compare_arms` result: the difference, its interval over
    the seeds (and over the items, where measured) and the verdict (an
    interval that excludes 0 with too few seeds is said so). Values
    are multiplied by `scale` (100: accuracies in percentage points) and
    printed with `digits` decimals and `unit` after the difference."""
    f = lambda v: f"{scale * v:+.{digits}f}"
    line = (f"{f(result['difference'])}{unit}, {result['level']:.1%} interval over seeds "
            f"[{f(result['low'])}, {f(result['high'])}]")
    if "items_low" in result:
        line += f", over sequences [{f(result['items_low'])}, {f(result['items_high'])}]"
    if result["established"]:
        return line + ": established"
    if result["excludes_zero"]:
        return line + f": excludes 0, but fewer than {MIN_SEEDS} seeds a side: not established"
    return line + ": not established"


def comparison_table(decided, scale=100, digits=1, unit="points"):
    """The `compare_arms` results `decided` (what -> result) as one table: the
    seeds a side ("fixed" for a deterministic B), A - B and its interval over
    the seeds (times `scale`: 100 for accuracies in points; `unit` names what
    the differences are in), the interval over
    the test set's items where measured, and the verdicts: whether the
    intervals exclude 0, and whether the difference is established."""
    f = lambda v: f"{scale * v:+.{digits}f}"
    with_items = any("items_low" in r for r in decided.values())
    columns = ["comparison", "seeds", f"A - B ({unit})", "seeds' interval"]
    columns += ["test set's interval"] * with_items + ["excludes 0", "established"]
    rows = []
    for what, r in decided.items():
        b_seeds = "fixed" if r["seeds"][1] == 1 else r["seeds"][1]
        row = [what, f"{r['seeds'][0]} vs {b_seeds}", f(r["difference"]),
               f"[{f(r['low'])}, {f(r['high'])}]"]
        if with_items:
            row.append(f"[{f(r['items_low'])}, {f(r['items_high'])}]" if "items_low" in r else "")
        rows.append(row + ["yes" if r["excludes_zero"] else "no",
                           "yes" if r["established"] else "no"])
    return Table(columns, rows, right=(columns[2], "seeds' interval", "test set's interval"))


def _welch_df(va, vb, n_a, n_b):
    """The Welch-Satterthwaite degrees of freedom of two squared standard errors
    va, vb of means of n_a and n_b values (numbers, or arrays of them)."""
    return (va + vb) ** 2 / (va ** 2 / (n_a - 1) + vb ** 2 / (n_b - 1))


def welch_false_exclusions(sd_ratio, level, *, seeds=(3, 3), draws=200_000, rng=None):
    """How often `compare_arms`' interval at `level` excludes zero between two
    arms that do not differ: the fraction of `draws` simulated pairs of normal
    seed means, seeds[0] of them with standard deviation `sd_ratio` and seeds[1]
    with 1, whose Welch interval excludes 0 (`compare_arms`' interval, for all
    the draws at once). `rng`: a numpy Generator (default: seed 0)."""
    rng = np.random.default_rng(0) if rng is None else rng
    n_a, n_b = seeds
    a, b = rng.normal(0, sd_ratio, (draws, n_a)), rng.normal(0, 1, (draws, n_b))
    va, vb = a.var(1, ddof=1) / n_a, b.var(1, ddof=1) / n_b
    half = stats.t.ppf((1 + level) / 2, _welch_df(va, vb, n_a, n_b)) * np.sqrt(va + vb)
    return float(np.mean(np.abs(a.mean(1) - b.mean(1)) > half))


def _t_interval(center, se, df, level):
    """center -/+ the (1 + level) / 2 quantile of Student's t with df degrees of freedom, times se."""
    half = float(stats.t.ppf((1 + level) / 2, df)) * se
    return center - half, center + half


# --- Language models: per-window scores for `compare_arms` ------------------------

def reevaluate_language_model(name, *, seed=None, corpus_sha256=None, train_windows=512):
    """Next-step reference run `name` (a character language model) scored again
    on its held-out windows, at float32 matmul precision, as `compare_arms`
    needs it: the run (config, history, recorded metrics, the loaded `model`),
    the recomputed metrics, `window_bits` (n_test,), each held-out window's mean
    loss in bits per token, `token_bits` (n_test, tokens), the loss in bits of
    each token of each held-out window (token i of window w is
    `test_tokens[w, i]`, predicted from `test_tokens[w, :i]`: the model shifts
    its input right, a start token first), `test_tokens`, those windows, and
    `train_bits`, the mean loss in bits per token on its first `train_windows`
    training windows in eval mode (no dropout), to set beside the held-out
    loss. Raises ValueError if the recomputed metrics
    differ from the recorded ones by more than float32 rounding explains
    (naming the command that re-makes the run), or if the run's seed or corpus
    is not `seed` / `corpus_sha256` (when given).

    Both sets of windows are scored in batches of min(RECORDED_BATCH,
    train_windows), so that one compiled program scores both (and every run of
    the same architecture): an item's statistics do not depend on its batch."""
    if not (isinstance(train_windows, int) and train_windows >= 1):
        raise ValueError(f"train_windows must be a positive int, got {train_windows!r}")
    directory = locate(name)
    model, data, run = load_run(directory)
    if data.task != "generate":
        raise ValueError(f"{name} is not a next-step model (it has labels): "
                         f"use reevaluate_classifier")
    config = run["config"]
    if seed is not None and config["seed"] != seed:
        raise ValueError(f"{name} was trained with seed {config['seed']}, not {seed}")
    if corpus_sha256 is not None and config.get("corpus_sha256") != corpus_sha256:
        raise ValueError(f"{name} was trained on another corpus "
                         f"(sha256 {config.get('corpus_sha256')}, not {corpus_sha256})")
    batch = min(RECORDED_BATCH, train_windows)
    items, metrics = reproduced(name, directory, model, data, run, batch)
    nll = np.asarray(items["nll"], np.float64)                      # (windows, tokens)
    train = kept_items(directory, model, data.x_train[:train_windows], batch_size=batch)
    bits = 1 / np.log(2)
    return {**run, "model": model, "recomputed": metrics, "window_bits": nll.mean(1) * bits,
            "token_bits": nll * bits, "test_tokens": np.asarray(data.x_test),
            "train_bits": float(np.asarray(train["nll"], np.float64).mean() * bits)}


# --- Families of runs: their shared recipe and their tables ------------------------

def recipe(config):
    """A run's recorded options (config.json), its layer's options flattened in
    and its seed left out: what two seeds of one experiment share."""
    options = {k: v for k, v in config.items() if k not in ("layer_options", "seed")}
    return options | dict(config.get("layer_options") or {})


def same_recipe(configs, *, except_for=()):
    """The options that every run's config in `configs` (name -> config) shares,
    as `recipe` gives them; ValueError naming the option and two runs where
    they differ in anything but the options `except_for` and the seed."""
    if not configs:
        raise ValueError("configs: no runs to compare")
    except_for = set(except_for)
    (first, base), *rest = ((name, recipe(c)) for name, c in configs.items())
    for name, options in rest:
        differ = sorted(k for k in set(base) | set(options)
                        if k not in except_for and base.get(k) != options.get(k))
        if differ:
            raise ValueError(f"configs: {first} and {name} differ in {differ}, not only in "
                             f"{sorted(except_for) or 'their seed'}")
    return {k: v for k, v in base.items() if k not in except_for}


class Table:
    """Rows for the reader: a Markdown table in a notebook (`_repr_markdown_`),
    the same text elsewhere. Columns named in `right` are right-aligned."""

    def __init__(self, columns, rows, right=()):
        self.columns = list(columns)
        self.rows = [[str(cell) for cell in row] for row in rows]
        if any(len(row) != len(self.columns) for row in self.rows):
            raise ValueError(f"rows: each row needs {len(self.columns)} cells, one per column")
        self.right = set(right)

    def _repr_markdown_(self):
        rule = ["---:" if c in self.right else "---" for c in self.columns]
        lines = [self.columns, rule, *self.rows]
        return "\n".join("| " + " | ".join(line) + " |" for line in lines)

    __str__ = __repr__ = _repr_markdown_
