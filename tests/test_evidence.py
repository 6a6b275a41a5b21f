"""Comparisons of trained models: McNemar's exact test, a
reference run scored again with its answer for every example, and the
interval on the difference of two models' seed means (compare_arms)."""

import numpy as np
import pytest
from scipy import stats
from scipy.stats import binomtest

from annotated_s4 import evidence


@pytest.mark.parametrize("b, c", [(0, 0), (3, 3), (14, 7), (7, 14), (33, 14), (0, 9),
                                  (263, 11), (120, 97)])
def test_mcnemar_is_the_exact_binomial_test(b, c):
    right_a = np.array([True] * b + [False] * c + [True] * 5 + [False] * 4)
    right_b = np.array([False] * b + [True] * c + [True] * 5 + [False] * 4)
    got_b, got_c, p = evidence.mcnemar(right_a, right_b)
    assert (got_b, got_c) == (b, c)
    expected = binomtest(min(b, c), b + c, 0.5).pvalue if b + c else 1.0
    assert p == pytest.approx(expected, rel=1e-9, abs=1e-300)


def test_mcnemar_refuses_answers_to_different_examples():
    with pytest.raises(ValueError, match="different examples"):
        evidence.mcnemar(np.ones(10, bool), np.ones(9, bool))


def test_mcnemar_pairings_keeps_the_names():
    a, b = np.array([1, 1, 0], bool), np.array([0, 1, 1], bool)
    assert evidence.mcnemar_pairings([("x vs y", a, b)]) == [("x vs y", 1, 1, 1.0)]


def test_a_reference_classifier_is_scored_again_digit_by_digit():
    from flax import nnx

    scored = evidence.reevaluate_classifier("digits64-s4")
    right = scored["right"]
    assert right.dtype == bool and right.ndim == 1
    assert isinstance(scored["model"], nnx.Module)          # loaded once, for the caller to reuse
    assert right.mean() == pytest.approx(scored["metrics"]["test_accuracy"], abs=1e-4)


def test_a_run_the_code_no_longer_reproduces_is_named(monkeypatch):
    real_load = evidence.load_run

    def drifted(directory):
        model, data, run = real_load(directory)
        run["metrics"] = {**run["metrics"], "test_accuracy": 0.5}
        return model, data, run

    monkeypatch.setattr(evidence, "load_run", drifted)
    with pytest.raises(ValueError, match="digits64-s4: the code no longer reproduces"):
        evidence.reevaluate_classifier("digits64-s4")


def test_a_classifier_whose_weights_moved_is_named_with_its_command(monkeypatch):
    """A code change that moves the result (here: a 64 x 64 weight matrix scaled
    by 1.01) fails the re-evaluation, naming the run and the command that
    re-makes it; float32 rounding alone does not (the test above)."""
    import jax
    from flax import nnx

    real_load = evidence.load_run

    def moved(directory):
        model, data, run = real_load(directory)
        params = nnx.state(model, nnx.Param)
        first = next(p for p in jax.tree.leaves(params) if p.shape == (64, 64))
        nnx.update(model, jax.tree.map(lambda p: p * 1.01 if p is first else p, params))
        return model, data, run

    monkeypatch.setattr(evidence, "load_run", moved)
    with pytest.raises(ValueError, match=r"digits64-s4: the code no longer reproduces .*"
                                         r"make reference RUN=digits64-s4.*annotated_s4 train"):
        evidence.reevaluate_classifier("digits64-s4")


# --- compare_arms: Welch's t interval on the seeds' means ---------------------------

def test_compare_arms_is_welchs_interval_on_the_seed_means():
    """The interval is Welch's t interval on each seed's mean over the items,
    as scipy computes it from the seed means directly."""
    rng = np.random.default_rng(0)
    a = rng.normal(1.0, 0.3, (3, 200)) + rng.normal(0, 0.02, (3, 1))
    b = rng.normal(1.03, 0.3, (4, 200)) + rng.normal(0, 0.05, (4, 1))
    out = evidence.compare_arms(a, b, comparisons=3)
    welch = stats.ttest_ind(a.mean(1), b.mean(1), equal_var=False)
    ci = welch.confidence_interval(confidence_level=1 - 0.05 / 3)
    assert out["difference"] == pytest.approx(a.mean() - b.mean())
    assert (out["low"], out["high"]) == pytest.approx((ci.low, ci.high))
    assert out["df"] == pytest.approx(welch.df)
    assert out["seeds"] == (3, 4) and out["items"] == 200


def test_compare_arms_against_a_deterministic_model_is_a_one_sample_interval():
    """b_fixed: B has one row and no spread (an SVM answers alike for every
    seed), so the interval is A's one-sample t interval around B's score."""
    rng = np.random.default_rng(1)
    a = (rng.random((3, 300)) < rng.uniform(0.9, 0.95, (3, 1))).astype(float)
    b = (rng.random((1, 300)) < 0.9).astype(float)
    out = evidence.compare_arms(a, b, comparisons=7, b_fixed=True)
    ci = stats.ttest_1samp(a.mean(1), b.mean()).confidence_interval(confidence_level=1 - 0.05 / 7)
    assert (out["low"], out["high"], out["df"], out["seeds"]) == (
        pytest.approx(ci.low - b.mean()), pytest.approx(ci.high - b.mean()), 2.0, (3, 1))


def test_independent_items_add_the_test_sets_own_noise():
    """items_independent: the paired t interval over the items of the
    seed-averaged difference, as scipy gives it; a difference every seed
    reproduces (0.3 points) is still not established when 1,000 test items
    cannot resolve it, and is once 4,000 can."""

    def arms(items):
        """A right on the first 80.3% of the items, B on the first 80%; in each,
        one seed loses a right answer and another gains one."""
        a, b = (np.tile(np.arange(items) < share * items, (3, 1)).astype(float)
                for share in (0.803, 0.800))
        for arm in (a, b):
            arm[1, 0], arm[2, -1] = 0.0, 1.0
        return a, b

    a, b = arms(1000)
    out = evidence.compare_arms(a, b, items_independent=True)
    ci = stats.ttest_1samp(a.mean(0) - b.mean(0), 0).confidence_interval(0.95)
    assert (out["items_low"], out["items_high"]) == (pytest.approx(ci.low), pytest.approx(ci.high))
    seeds_only = evidence.compare_arms(a, b)
    assert seeds_only["excludes_zero"] and out["low"] > 0 and out["items_low"] < 0
    assert not out["excludes_zero"]
    assert evidence.compare_arms(*arms(4000), items_independent=True)["excludes_zero"]


def test_compare_arms_lets_the_shared_items_difficulty_cancel():
    """Both models read the same items: making some items harder for both
    moves neither the difference nor its interval."""
    rng = np.random.default_rng(4)
    a, b = rng.normal(1.0, 0.1, (3, 300)), rng.normal(1.01, 0.1, (3, 300))
    harder = rng.exponential(1.0, 300)
    plain, shifted = evidence.compare_arms(a, b), evidence.compare_arms(a + harder, b + harder)
    for key in ("difference", "low", "high"):
        assert shifted[key] == pytest.approx(plain[key])


def test_compare_arms_sees_seed_noise_that_item_noise_hides():
    """Seeds that scatter widely make a difference of means uncertain even on
    many items; the same difference with agreeing seeds is established."""
    rng = np.random.default_rng(1)
    items = 5000

    def arm(means):
        return np.stack([rng.random(items) < m for m in means])

    steady = evidence.compare_arms(arm([0.96, 0.961, 0.959, 0.96, 0.962]),
                                   arm([0.94, 0.941, 0.939, 0.94, 0.942]))
    assert steady["established"] and steady["low"] > 0
    scattered = evidence.compare_arms(arm([0.99, 0.90, 0.99, 0.92, 0.98]),
                                      arm([0.96, 0.90, 0.97, 0.92, 0.93]))
    assert not scattered["established"] and scattered["low"] < 0 < scattered["high"]


def test_compare_arms_bonferroni_widens_the_interval():
    rng = np.random.default_rng(2)
    a, b = rng.random((3, 800)) < 0.9, rng.random((3, 800)) < 0.88
    one = evidence.compare_arms(a, b)
    seven = evidence.compare_arms(a, b, comparisons=7)
    assert seven["level"] == pytest.approx(1 - 0.05 / 7)
    assert seven["low"] < one["low"] and seven["high"] > one["high"]


@pytest.mark.parametrize("seed_sd", [0.01, 0.02])
def test_compare_arms_keeps_its_error_rate_with_three_seeds(seed_sd):
    """Two identical models, three seeds a side, whose seeds scatter (sd
    `seed_sd` in the seed's mean) more than the 256 shared items' noise does
    (sd 0.05 per item, 0.003 in a seed's mean), the regime of a small language
    model. A false "established" must come no more often than the level
    allows, up to Monte-Carlo error: at 95%, and at the level a page comparing
    six pairs uses, 1 - 0.05/6. (A two-level percentile bootstrap of the seeds
    and the items fails this: resampling three seeds underestimates their
    spread, and it called 11-16% of these very nulls established at 95%, 5-8%
    at 1 - 0.05/6, where Welch's interval calls 3% and 0.2-0.4%.) With equal
    spreads and equal counts Welch's interval is a little conservative (for
    normal seed means and three seeds a side its exact rate is about 3.6% at
    95%), so the rate may fall below the level, not far below it."""
    rng = np.random.default_rng(3)
    nulls, items, seeds = 1000, 256, 3
    false = {1: 0, 6: 0}
    for _ in range(nulls):
        difficulty = rng.normal(1.8, 0.3, items)                   # the shared text
        runs = (difficulty + rng.normal(0, seed_sd, (2 * seeds, 1))
                + rng.normal(0, 0.05, (2 * seeds, items)))
        for m in false:
            false[m] += evidence.compare_arms(runs[:seeds], runs[seeds:],
                                              comparisons=m)["excludes_zero"]
    for m, count in false.items():
        nominal = 0.05 / m * nulls                                  # expected false count
        mc = 3 * np.sqrt(nominal * (1 - 0.05 / m))                  # 3 Monte-Carlo sd
        assert count <= nominal + mc, (m, count, nominal)
    assert false[1] >= 0.3 * 0.05 * nulls, false                   # not grossly conservative


def test_a_difference_is_established_only_with_five_seeds_a_side():
    """However far the interval lies from zero, fewer than MIN_SEEDS = 5 seeds
    in an arm that has seeds draw no conclusion; a deterministic B needs none."""
    rng = np.random.default_rng(4)
    far = lambda seeds, p: (rng.random((seeds, 400)) < p).astype(float)   # noqa: E731
    three = evidence.compare_arms(far(3, 0.95), far(3, 0.5))
    assert three["excludes_zero"] and three["low"] > 0.3 and not three["established"]
    assert evidence.describe(three).endswith("fewer than 5 seeds a side: not established")
    assert not evidence.compare_arms(far(5, 0.95), far(4, 0.5))["established"]
    five = evidence.compare_arms(far(5, 0.95), far(5, 0.5))
    assert five["excludes_zero"] and five["established"] and evidence.MIN_SEEDS == 5
    fixed = evidence.compare_arms(far(5, 0.95), far(1, 0.5), b_fixed=True)
    assert fixed["established"]
    assert not evidence.compare_arms(far(3, 0.95), far(1, 0.5), b_fixed=True)["established"]


@pytest.mark.parametrize("kwargs, error, match", [
    ({"scores_a": np.ones((2, 5)), "scores_b": np.ones((2, 6))}, ValueError, "same items"),
    ({"scores_a": np.ones((1, 5)), "scores_b": np.ones((3, 5))}, ValueError, "scores_a .*2 seeds"),
    ({"scores_a": np.ones((3, 5)), "scores_b": np.ones(5)}, ValueError, "scores_b .*2 seeds"),
    ({"scores_a": np.full((2, 5), np.nan), "scores_b": np.ones((2, 5))}, ValueError,
     "scores_a must be finite"),
    ({"scores_a": np.ones((2, 5)), "scores_b": np.ones((2, 5)), "comparisons": 0}, ValueError,
     "comparisons"),
    ({"scores_a": np.ones((2, 5)), "scores_b": np.ones((2, 5)), "comparisons": 1.0}, TypeError,
     "comparisons"),
    ({"scores_a": np.ones((2, 5)), "scores_b": np.ones((2, 5)), "alpha": 1.5}, ValueError, "alpha"),
    ({"scores_a": np.ones((2, 5)), "scores_b": np.ones((2, 5)), "b_fixed": True}, ValueError,
     "scores_b must hold one row"),
    ({"scores_a": np.ones((2, 5)), "scores_b": np.ones((1, 5)), "b_fixed": 1}, TypeError,
     "b_fixed"),
    ({"scores_a": np.ones((2, 5)), "scores_b": np.ones((2, 5)), "items_independent": "yes"},
     TypeError, "items_independent"),
])
def test_compare_arms_refuses_bad_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        evidence.compare_arms(**kwargs)


# --- language models: per-window scores ---------------------------------------------

def test_a_reference_language_model_is_scored_again_window_by_window():
    """The windows' mean losses average to the recorded bits per character, and
    the model fits training windows better than held-out ones (eval mode)."""
    scored = evidence.reevaluate_language_model("tnn-charlm", seed=0, train_windows=16)
    bits = scored["window_bits"]
    assert bits.ndim == 1 and bits.size == 512          # the held-out windows
    assert bits.mean() == pytest.approx(scored["metrics"]["test_bits_per_char"], abs=1e-4)
    assert 0 < scored["train_bits"] < 8


def test_a_reference_language_models_token_losses_line_up_with_its_windows():
    """token_bits holds each held-out token's loss: (windows, tokens), the
    windows' tokens beside it, each row averaging to its window's loss; token i
    is x[i] predicted from x[:i], so the first token of a window, predicted from
    the start token alone, costs more than the others on average."""
    scored = evidence.reevaluate_language_model("tnn-charlm", seed=0, train_windows=16)
    bits, x = scored["token_bits"], scored["test_tokens"]
    assert bits.shape == x.shape == (512, scored["config"]["seq_len"])
    np.testing.assert_allclose(bits.mean(1), scored["window_bits"], rtol=1e-12)
    assert (bits >= 0).all() and bits[:, 0].mean() > bits[:, 1:].mean() + 1


@pytest.mark.parametrize("kwargs, match", [
    ({"seed": 1}, "seed 0, not 1"),
    ({"corpus_sha256": "0" * 64}, "another corpus"),
    ({"train_windows": 0}, "train_windows"),
])
def test_reevaluate_language_model_refuses_a_run_that_is_not_the_one_asked(kwargs, match):
    with pytest.raises(ValueError, match=match):
        evidence.reevaluate_language_model("tnn-charlm", **kwargs)


def test_reevaluate_language_model_refuses_a_classifier():
    with pytest.raises(ValueError, match="not a next-step model"):
        evidence.reevaluate_language_model("digits64-s4")


def test_a_language_model_the_code_no_longer_reproduces_is_named(monkeypatch):
    real_load = evidence.load_run

    def drifted(directory):
        model, data, run = real_load(directory)
        run["metrics"] = {**run["metrics"], "test_loss": 0.5}
        return model, data, run

    monkeypatch.setattr(evidence, "load_run", drifted)
    with pytest.raises(ValueError, match=r"tnn-charlm: the code no longer reproduces.*"
                                         r"make reference RUN=tnn-charlm"):
        evidence.reevaluate_language_model("tnn-charlm")


def test_at_lengths_draws_the_task_again_and_builds_the_layers_for_the_length():
    """At the training length with the test set's seed, at_lengths answers the
    run's own held-out sequences: its accuracy is the recorded one. At a longer
    length the attention run, whose layers refuse inputs longer than they were
    built for, is rebuilt for it (the same weights) and answers every sequence."""
    from annotated_s4.runner import load_run
    from annotated_s4.runs import locate

    name = "induction-head-attention"                      # chapter 7's, 30 tokens
    run = evidence.reevaluate_classifier(name)
    L = run["config"]["seq_len"]
    right = evidence.at_lengths(name, [L], n=len(run["right"]), seed_offset=1)[L]
    np.testing.assert_array_equal(right, run["right"])
    longer = evidence.at_lengths(name, [2 * L], n=64)[2 * L]
    assert longer.shape == (64,) and longer.dtype == bool
    model, data, _ = load_run(locate(name))
    with pytest.raises(ValueError, match="max_len"):
        model.model(np.zeros((1, 2 * L), np.int32))
    with pytest.raises(ValueError, match="length"):
        evidence.at_lengths(name, [0])
    with pytest.raises(ValueError, match="not a recall task"):
        evidence.at_lengths("digits64-s4", [64])


def test_describe_prints_the_difference_its_intervals_and_the_verdict():
    rng = np.random.default_rng(0)
    a = (rng.random((5, 200)) < 0.9).astype(float)
    b = (rng.random((5, 200)) < 0.5).astype(float)
    r = evidence.compare_arms(a, b, comparisons=2, items_independent=True)
    line = evidence.describe(r)
    assert line.startswith(f"{100 * r['difference']:+.1f} points, 97.5% interval over seeds [")
    assert f"over sequences [{100 * r['items_low']:+.1f}, " in line
    assert line.endswith(": established") and r["established"]
    same = evidence.describe(evidence.compare_arms(a, a[::-1]), scale=1, unit="", digits=3)
    assert "over sequences" not in same and same.endswith(": not established")


def test_same_recipe_returns_what_the_runs_share_and_names_a_difference():
    config = {"lr": 0.01, "steps": 100, "seed": 0, "layer_options": {"init": "hippo", "N": 64}}
    other = {**config, "seed": 3, "layer_options": {"init": "gaussian", "N": 64}}
    shared = evidence.same_recipe({"a": config, "b": other}, except_for={"init"})
    assert shared == {"lr": 0.01, "steps": 100, "N": 64}    # layer options flattened in
    with pytest.raises(ValueError, match=r"a and b differ in \['init'\]"):
        evidence.same_recipe({"a": config, "b": other})
    with pytest.raises(ValueError, match=r"differ in \['lr'\]"):
        evidence.same_recipe({"a": config, "b": {**config, "lr": 0.02}})
    with pytest.raises(ValueError, match="configs"):
        evidence.same_recipe({})


def test_a_table_is_markdown_with_one_cell_per_column():
    table = evidence.Table(["model", "accuracy"], [["S4", 0.9], ["S4D", 0.8]], right=["accuracy"])
    assert table._repr_markdown_().splitlines() == [
        "| model | accuracy |", "| --- | ---: |", "| S4 | 0.9 |", "| S4D | 0.8 |"]
    with pytest.raises(ValueError, match="rows"):
        evidence.Table(["model", "accuracy"], [["S4"]])


def test_comparison_table_shows_each_result_and_its_verdict():
    rng = np.random.default_rng(0)
    a, b = rng.random((5, 50)) + 0.5, rng.random((5, 50))
    decided = {"A vs B": evidence.compare_arms(a, b, items_independent=True),
               "A vs a fixed B": evidence.compare_arms(a, b[:1], b_fixed=True)}
    lines = evidence.comparison_table(decided)._repr_markdown_().splitlines()
    assert "A - B (points)" in lines[0] and "test set's interval" in lines[0] and len(lines) == 4
    r = decided["A vs B"]
    assert lines[2].startswith(f"| A vs B | 5 vs 5 | {100 * r['difference']:+.1f} | "
                               f"[{100 * r['low']:+.1f}, {100 * r['high']:+.1f}] | ")
    assert lines[2].endswith("| yes | yes |")
    assert "| 5 vs fixed |" in lines[3] and "|  | yes |" in lines[3]   # no items' interval


def test_welch_false_exclusions_is_compare_arms_interval_on_every_draw():
    # the same draws, one at a time through compare_arms: the same exclusions
    ratio, level, draws = 2.4, 1 - 0.05 / 9, 300
    rate = evidence.welch_false_exclusions(ratio, level, draws=draws,
                                           rng=np.random.default_rng(5))
    rng = np.random.default_rng(5)
    a, b = rng.normal(0, ratio, (draws, 3)), rng.normal(0, 1, (draws, 3))
    by_hand = np.mean([evidence.compare_arms(a[i][:, None], b[i][:, None],
                                             alpha=1 - level)["excludes_zero"]
                       for i in range(draws)])
    assert rate == by_hand and 0 < rate < 0.1
    # with equal spreads, three seeds a side, the interval keeps its level (errs safe)
    assert evidence.welch_false_exclusions(1.0, 0.95, draws=100_000) < 0.05
