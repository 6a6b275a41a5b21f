"""Re-evaluating a run is a measurement: its test metrics recomputed from the
item statistics of every held-out item (`measure_items`, `metrics_of_items`),
and compared with the recorded ones within a tolerance derived from float32
arithmetic (`compare`; derived below, above `rounding_bound`).

A re-evaluation is repeated on whatever device is at hand. It runs at
`jax.default_matmul_precision("float32")`: a GPU's TF32 products (10-bit
mantissa) would move the logits far more than float32 rounding does.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from .models import eval_mode
from .registry import test_metrics
from .train import fill_batch

__all__ = ["UNIT_ROUNDOFF", "ROUNDING_UNITS", "SIGMAS", "RECORDED_BATCH", "rounding_bound",
           "item_statistics", "measure_items", "remeasure", "metrics_of_items", "compare"]


# --- Re-evaluation as a measurement: its tolerance ------------------------------------
# Two float32 evaluations of the same model on the same input (the one that
# recorded a run's metrics, and a re-evaluation on another machine, another
# device, another summation order) differ only by rounding. Each evaluation's
# log-probabilities lie within ROUNDING_UNITS units of float32 roundoff u = 2^-24
# of the exact ones, relative to the item's scale s = max(1, max_j |log p_j|):
# against a float64 evaluation of the same weights, the reference runs measured
# at most 91 units (the 784-step MNIST classifier; 73 for the digit generator, 52
# for the H3 language model, 24 for the 8 x 8 digit classifier, which
# tests/test_runner.py checks against the bound). So two evaluations'
# log-probabilities differ by at most delta = 2 ROUNDING_UNITS u s, and:
#  * a prediction (the argmax) can differ only where the top two log-probabilities
#    lie closer than 2 delta: the accuracy may move by (those items) / n;
#  * each term -log p_y of the loss moves by at most its delta_i. Rounding errors
#    taken as independent and of mean zero (the probabilistic model of Higham and
#    Mary, SIAM J. Sci. Comput. 2019), Hoeffding's inequality bounds the mean of n
#    such moves by SIGMAS sqrt(sum delta_i^2) / n, except with probability
#    2 exp(-SIGMAS^2 / 2) = 5e-11. The recorded loss is also a float32 mean of
#    m = batch x tokens nonnegative terms, whose relative rounding error Higham and
#    Mary bound by SIGMAS sqrt(m) u (failing with probability below
#    2m exp(-SIGMAS^2 / 2), 1e-5 for m = 256 x 784), plus u for the division:
#    relative tolerance (SIGMAS sqrt(m) + 1) u on top of the first term.
#: float32's unit roundoff, 2^-24.
UNIT_ROUNDOFF = 2.0 ** -24
#: A float32 evaluation's largest error in a log-probability, in units of roundoff
#: times the item's scale max(1, max |log p|) (2.8 times the largest measured).
ROUNDING_UNITS = 256
#: lambda of the probabilistic bounds, which fail with probability 2 exp(-lambda^2 / 2)
#: per term bounded.
SIGMAS = 7
#: The batch of `train.evaluate`, which recorded the runs' test metrics.
RECORDED_BATCH = 256


def rounding_bound(logp):
    """delta: how far two float32 evaluations' log-probabilities `logp` (..., classes)
    can lie apart, per item: 2 ROUNDING_UNITS u max(1, max |log p|)."""
    scale = jnp.maximum(1.0, jnp.abs(logp).max(-1))
    return 2 * ROUNDING_UNITS * UNIT_ROUNDOFF * scale


def item_statistics(logp, target):
    """Per item (an example, or a token of a next-step model) of log-probabilities
    `logp` (..., classes) and integer `target` (...): the loss -log p_target, whether
    the argmax is the target, whether the top two lie within 2 delta (a float32
    boundary, `rounding_bound`), and delta."""
    logp = jnp.asarray(logp)
    nll = -jnp.take_along_axis(logp, jnp.asarray(target)[..., None], axis=-1)[..., 0]
    best = logp.argmax(-1)
    top = jnp.take_along_axis(logp, best[..., None], axis=-1)[..., 0]
    # the runner-up, the largest of the others: `jax.lax.top_k(logp, 2)` exactly, which
    # XLA's CPU backend computes many times slower in this program (256 classes)
    second = jnp.where(jnp.arange(logp.shape[-1]) == best[..., None], -jnp.inf, logp).max(-1)
    delta = rounding_bound(logp)
    return {"nll": nll, "right": best == target,
            "boundary": top - second < 2 * delta, "delta": delta}


@nnx.jit
def _batch_statistics(model, x, y):
    return item_statistics(model(x), x if y is None else y)


def measure_items(model, x, y=None, batch_size=RECORDED_BATCH):
    """`item_statistics` of `model` on every item of x, y (y None for next-step
    models), in eval mode, in batches: numpy arrays. A last, shorter batch is
    filled up (and its extra items dropped), so that one program, compiled
    once, scores every batch; an item's statistics do not depend on its batch."""
    size = min(batch_size, len(x))
    parts = []
    with eval_mode(model):
        for i in range(0, len(x), size):
            n = len(x[i:i + size])
            stats = _batch_statistics(model, jnp.asarray(fill_batch(x[i:i + size], size)),
                                      None if y is None else jnp.asarray(fill_batch(y[i:i + size], size)))
            parts.append({k: v[:n] for k, v in jax.device_get(stats).items()})
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


def remeasure(model, x, y, data, batch_size=RECORDED_BATCH):
    """A run's test metrics (`registry.test_metrics`) measured again on x, y (y None
    for next-step models), with the tolerance of each: the metrics' dict holds
    {"tolerance": {metric: largest difference from the recorded value that
    float32 rounding explains}} (`metrics_of_items`, derived above)."""
    return metrics_of_items(measure_items(model, x, y, batch_size), data, batch_size)


def metrics_of_items(items, data, batch_size=RECORDED_BATCH):
    """Test metrics and their tolerances from `item_statistics` of every test
    item (an example, or a sequence of tokens), as a run recorded them: means
    over batches of `batch_size` items (`train.evaluate`).

    test_loss: the mean of -log p_y (summed in float64), tolerance
    SIGMAS sqrt(sum delta^2) / n + (SIGMAS sqrt(terms) + 1) u x loss, `terms` the
    number of terms of one recorded float32 mean (min(batch_size, items) times
    the targets per item); test_accuracy: tolerance
    (items on a boundary) / n + u (the recorded float32 mean of 0s and 1s is
    exact but for its division); bits per token: the loss's, / log 2.
    """
    nll = np.asarray(items["nll"], np.float64)
    terms = min(batch_size, len(nll)) * nll[0].size
    loss = float(nll.mean())
    metrics = test_metrics({"loss": loss, "accuracy": float(np.mean(items["right"]))}, data)
    delta = np.asarray(items["delta"], np.float64)
    loss_tol = (SIGMAS * math.sqrt(np.sum(delta ** 2)) / delta.size
                + (SIGMAS * math.sqrt(terms) + 1) * UNIT_ROUNDOFF * loss)
    tolerance = {"test_loss": loss_tol,
                 "test_accuracy": float(np.mean(items["boundary"])) + UNIT_ROUNDOFF}
    for k in metrics:
        if k.startswith("test_bits_per_"):
            tolerance[k] = loss_tol / math.log(2)
    return {**metrics, "tolerance": tolerance}


def compare(recorded, recomputed, tolerance=None):
    """{name: (recorded, recomputed)} of the recomputed metrics that differ from the
    recorded ones by more than their tolerance: `tolerance` if given (one number for
    all), else the re-evaluation's own, ``recomputed["tolerance"]`` (`remeasure`); a
    metric without one must be reproduced to float32 rounding (u relative)."""
    allowed = recomputed.get("tolerance", {})
    bad = {}
    for k, v in recomputed.items():
        if k == "tolerance":
            continue
        tol = tolerance if tolerance is not None else allowed.get(
            k, UNIT_ROUNDOFF * abs(v))
        if recorded.get(k) is None or not abs(recorded[k] - v) <= tol:
            bad[k] = (recorded.get(k), v)
    return bad
