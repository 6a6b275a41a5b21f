"""The digit generator scored by a classifier: the bottom half of each test
digit completed by the next-pixel model (`complete_digits`), the fraction
that a classifier reads as the true digit (`completion_accuracy`), and that
fraction's tolerance, the completions that another float32 evaluation could
make or read differently (`completions_on_a_boundary`); `completion_metrics`
gives both, as a run's metrics.
"""

from __future__ import annotations

import jax
import numpy as np

from .measure import UNIT_ROUNDOFF, item_statistics, measure_items
from .train import evaluate

__all__ = ["COMPLETION_CLASSIFIERS", "complete_digits", "completion_accuracy",
           "completions_on_a_boundary", "completion_metrics"]


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
    perturbed log-probability by at most delta (`measure.rounding_bound`), so
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


def completion_metrics(model, classifier, data):
    """The metrics of a digit generator `model` that `classifier` scores on
    the test digits of `data` (a `datasets.Dataset`): completion_accuracy
    (`completion_accuracy`), with its tolerance, the fraction of digits whose
    completion or reading sits on a float32 boundary (`completions_on_a_boundary`)."""
    accuracy, completed = completion_accuracy(model, classifier, data.x_test,
                                              data.labels_test)
    near = completions_on_a_boundary(model, classifier, data.x_test, completed)
    return {"completion_accuracy": accuracy,
            "tolerance": {"completion_accuracy": float(near.mean()) + UNIT_ROUNDOFF}}
