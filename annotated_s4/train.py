"""Training: losses, an optax/NNX train step, and a small `fit` loop.

The loop is deliberately plain: sample a batch, take a step, evaluate now and
then. Classification models return (batch, classes) log-probabilities; next-step
models return (batch, L, vocab) log-probabilities of their own (shifted) input.
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from .data import batches

__all__ = ["loss_fn", "make_optimizer", "train_step", "evaluate", "fit"]


def loss_fn(model, x, y=None):
    """Mean negative log-likelihood and accuracy.

    With y (classification): NLL of the labels y (batch,). Without y (next-step
    prediction on integer tokens x (batch, L)): NLL per token, in nats.
    """
    logp = model(x)
    target = x if y is None else y
    nll = -jnp.take_along_axis(logp, target[..., None], axis=-1)[..., 0]
    acc = (logp.argmax(-1) == target).astype(jnp.float32)
    return nll.mean(), acc.mean()


def make_optimizer(model, lr=1e-3, weight_decay=0.01, steps=1000, warmup=0):
    """AdamW with a cosine schedule (optional linear warm-up)."""
    schedule = optax.warmup_cosine_decay_schedule(
        0.0 if warmup else lr, lr, max(warmup, 1), max(steps, warmup + 1), lr * 0.01
    )
    tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(schedule, weight_decay=weight_decay))
    return nnx.Optimizer(model, tx, wrt=nnx.Param)


@nnx.jit
def train_step(model, optimizer, x, y):
    """One gradient step; y=None for next-step models. Returns (loss, accuracy)."""
    grad_fn = nnx.value_and_grad(loss_fn, has_aux=True)
    (loss, acc), grads = grad_fn(model, x, y)
    optimizer.update(model, grads)
    return loss, acc


@nnx.jit
def _eval_batch(model, x, y):
    return loss_fn(model, x, y)


def evaluate(model, x, y=None, batch_size=256):
    """Mean loss and accuracy over a whole split (model put in eval mode)."""
    model.eval()
    n = len(x)
    totals = np.zeros(2)
    for start in range(0, n, batch_size):
        xb = jnp.asarray(x[start:start + batch_size])
        yb = None if y is None else jnp.asarray(y[start:start + batch_size])
        loss, acc = _eval_batch(model, xb, yb)
        totals += np.array([float(loss), float(acc)]) * len(xb)
    model.train()
    return {"loss": totals[0] / n, "accuracy": totals[1] / n}


def fit(model, x_train, y_train=None, x_test=None, y_test=None, *, steps=500,
        batch_size=64, lr=1e-3, weight_decay=0.01, seed=0, eval_every=None,
        log=print):
    """Train `model` for `steps` steps; returns a history of metrics.

    The history holds the training loss of every step, the evaluations made
    every `eval_every` steps (and at the end), and seconds per step.
    """
    if steps < 1:
        raise ValueError(f"steps must be positive, got {steps}")
    optimizer = make_optimizer(model, lr=lr, weight_decay=weight_decay, steps=steps)
    model.train()
    rng = np.random.default_rng(seed)
    sampler = batches(rng, len(x_train), batch_size)
    history = {"step": [], "train_loss": [], "eval": []}
    start = time.perf_counter()
    for step in range(1, steps + 1):
        idx = next(sampler)
        yb = None if y_train is None else jnp.asarray(y_train[idx])
        loss, _ = train_step(model, optimizer, jnp.asarray(x_train[idx]), yb)
        history["step"].append(step)
        history["train_loss"].append(float(loss))
        if x_test is not None and (step == steps or (eval_every and step % eval_every == 0)):
            metrics = evaluate(model, x_test, y_test)
            history["eval"].append({"step": step, **metrics})
            if log:
                log(f"step {step:5d}  train loss {float(loss):.4f}  "
                    f"test loss {metrics['loss']:.4f}  test acc {metrics['accuracy']:.4f}")
    history["seconds_per_step"] = (time.perf_counter() - start) / steps
    return history
