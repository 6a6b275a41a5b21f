"""Comparisons of trained classifiers: McNemar's exact test, the verdict rule,
and a reference run scored again with its answer for every example."""

import numpy as np
import pytest
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


@pytest.mark.parametrize("seeds_a, seeds_b, p, fixed_b, starts", [
    ([0.97, 0.98], [0.95, 0.96], 0.2, False, "not established: within the test set's noise"),
    ([0.97], [0.95, 0.96], 0.01, False, "beyond the test set's noise; one seed"),
    ([0.97, 0.98], [0.95], 0.01, False, "beyond the test set's noise; one seed"),
    ([0.97, 0.98], [0.95], 0.01, True, "established"),
    ([0.94, 0.98], [0.95], 0.01, True, "not established: within the seeds' spread"),
    ([0.970, 0.974], [0.950, 0.952], 0.001, False, "established"),
    ([0.960, 0.980], [0.955, 0.965], 0.001, False, "not established: within the seeds' spread"),
])
def test_verdict_weighs_seeds_and_test_noise(seeds_a, seeds_b, p, fixed_b, starts):
    assert evidence.verdict(seeds_a, seeds_b, p, fixed_b).startswith(starts)


def test_a_reference_classifier_is_scored_again_digit_by_digit():
    scored = evidence.reevaluate_classifier("digits64-s4")
    right = scored["right"]
    assert right.dtype == bool and right.ndim == 1
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


# --- the two-level bootstrap ------------------------------------------------------

def test_compare_arms_with_one_seed_is_the_paired_item_bootstrap():
    """One seed a side: only the items vary, and the interval is the paired
    difference's normal interval (the bootstrap of a mean of 2,000 items)."""
    rng = np.random.default_rng(0)
    a = rng.random(2000) < 0.9
    b = np.where(rng.random(2000) < 0.1, ~a, a)          # b disagrees on about 10%
    out = evidence.compare_arms(a[None], b[None], n_boot=20_000)
    d = a.astype(float) - b.astype(float)
    half = 1.959964 * d.std() / np.sqrt(len(d))
    assert out["difference"] == pytest.approx(d.mean())
    assert out["low"] == pytest.approx(d.mean() - half, abs=0.1 * half)
    assert out["high"] == pytest.approx(d.mean() + half, abs=0.1 * half)


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


def test_compare_arms_keeps_its_error_rate_when_nothing_differs():
    """Two arms drawn from the same models: the 95% interval excludes zero in
    about 5% of repetitions, not more (a test that a too-narrow interval fails)."""
    rng = np.random.default_rng(3)
    false = 0
    for rep in range(200):
        seeds = rng.normal(0.9, 0.01, size=10)            # each seed's own accuracy
        arms = np.stack([rng.random(400) < s for s in seeds])
        false += evidence.compare_arms(arms[:5], arms[5:], n_boot=2000, seed=rep)["established"]
    assert false <= 25     # 5% of 200 is 10; 25 would be a 12.5% error rate


@pytest.mark.parametrize("kwargs, match", [
    ({"scores_a": np.ones((2, 5)), "scores_b": np.ones((2, 6))}, "same items"),
    ({"scores_a": np.ones((2, 5)), "scores_b": np.ones((2, 5)), "comparisons": 0}, "comparisons"),
    ({"scores_a": np.ones((2, 5)), "scores_b": np.ones((2, 5)), "alpha": 1.5}, "alpha"),
])
def test_compare_arms_refuses_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
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
