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
