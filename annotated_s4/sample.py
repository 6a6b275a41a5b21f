"""Autoregressive generation in RNN mode.

A next-step `StackedModel` (``classification=False``, integer tokens) is
trained in CNN mode, where all L outputs come from one parallel convolution.
To generate, we switch every layer to its recurrence: ``model.init_cache(b)``
discretizes once and zeroes the states, then each ``model.step(token)`` costs
O(1) in the sequence length: it reads the previous token and returns the
log-probabilities of the next one.

* `rnn_log_probs`: teacher-forced RNN mode over a given sequence; equals the
  CNN-mode output ``model(x)`` step by step (the check that RNN mode is right).
* `generate`: sample whole sequences, or complete given prefixes.
* `generate_cnn`: the baseline without a recurrence: rerun the whole CNN at
  every step (O(L) work per token instead of O(1)).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from . import _checks as checks
from .models import eval_mode

__all__ = ["rnn_log_probs", "generate", "generate_cnn"]


@nnx.jit
def _step(model, token):
    return model.step(token)


def _bound(fn, model):
    """`fn` with `model` bound as its first argument, for a loop of calls.

    `nnx.jit` walks the model's graph of modules and variables at every call,
    a fixed cost that dwarfs one generation step of a small model;
    `nnx.cached_partial` walks it once. The compiled program is the same.
    """
    return nnx.cached_partial(fn, model)


def _stack(out):
    """The per-step outputs, stacked along a new axis 1 (on the host: `jnp.stack`
    would compile a new program for every number of steps)."""
    return jnp.asarray(np.stack(jax.device_get(out), axis=1))


def _draw(logp, key, t, temperature):
    """Token t's draw: categorical over logp / temperature, key folded with t."""
    return jax.random.categorical(jax.random.fold_in(key, t), logp / temperature).astype(jnp.int32)


@nnx.jit
def _sample_step(model, token, key, t, temperature):
    """One RNN step and a draw from its output, as one compiled program."""
    logp = model.step(token)
    return _draw(logp, key, t, temperature)


def _check_model(model, length):
    """A next-step token model, and a length no longer than its layers' max_len.

    A layer with a length limit (S4's C~ = C (I - Ab^L) defines its kernel for
    exactly L steps; attention's key-value cache has max_len slots) refuses
    longer inputs in CNN mode; RNN mode must not silently go past it.
    """
    if getattr(model, "classification", True) or getattr(model, "vocab_size", None) is None:
        raise ValueError("model must be a next-step token model "
                         "(StackedModel with classification=False and vocab_size set)")
    length = checks.positive_int(length, "length")
    limits = [block.seq.max_len for block in model.layers if block.seq.max_len is not None]
    if limits and length > min(limits):
        raise ValueError(f"length {length} exceeds the model's layer length limit "
                         f"max_len = {min(limits)}; build the model with a larger L")


def _check_batch_size(batch_size):
    if batch_size is None:
        raise ValueError("batch_size is required (or a prefix, whose batch it is)")
    return checks.positive_int(batch_size, "batch_size")


def _check_generate(model, length, batch_size, prefix, temperature):
    """`generate`'s arguments; returns (prefix as int32 or None, the batch size,
    the prefix length)."""
    _check_model(model, length)
    checks.number(temperature, "temperature", low=0.0, low_open=True)
    if prefix is None:
        return None, _check_batch_size(batch_size), 0
    prefix = checks.tokens(prefix, "prefix", model.vocab_size).astype(jnp.int32)
    if prefix.shape[1] > length:
        raise ValueError(f"prefix length {prefix.shape[1]} exceeds length {length}")
    if batch_size is not None and batch_size != prefix.shape[0]:
        raise ValueError(f"batch_size {batch_size} does not match prefix batch "
                         f"{prefix.shape[0]}")
    return prefix, prefix.shape[0], prefix.shape[1]


def rnn_log_probs(model, x):
    """Log-probabilities of every token of x (batch, L) computed in RNN mode.

    Feeds the start token, then x[:, 0], x[:, 1], ... through ``model.step``;
    output t is the distribution of x[:, t] given x[:, :t], as in ``model(x)``.
    Returns (batch, L, vocab_size).
    """
    x = checks.tokens(x, "x", model.vocab_size)
    _check_model(model, x.shape[1])
    token = jnp.full((x.shape[0],), model.start_token, dtype=x.dtype)
    out = []
    with eval_mode(model):
        model.init_cache(x.shape[0])
        step = _bound(_step, model)
        for t in range(x.shape[1]):
            out.append(step(token))
            token = x[:, t]
    return _stack(out)


def generate(model, length, *, key, batch_size=None, prefix=None, temperature=1.0):
    """Sample `length` tokens per sequence in RNN mode.

    With ``prefix`` (batch, n_prefix) integer tokens, the first n_prefix tokens
    are forced to the prefix (the model reads them, "prompting" its state) and
    the remaining length - n_prefix are sampled: prefix completion. Without it, whole
    sequences are sampled for ``batch_size`` sequences. ``temperature`` divides
    the log-probabilities (0 < temperature; smaller is greedier).
    Returns the tokens, (batch, length) int32.
    """
    prefix, batch_size, n_prefix = _check_generate(model, length, batch_size, prefix,
                                                   temperature)
    token = jnp.full((batch_size,), model.start_token, dtype=jnp.int32)
    temperature = jnp.float32(temperature)
    out = []
    with eval_mode(model):
        model.init_cache(batch_size)
        sample_step = _bound(_sample_step, model)
        for t in range(length):
            # read the previous token into the state and draw token t; inside the
            # prefix the draw gives way to the prefix's token (one compiled
            # program for both, and draw t depends on t alone, not on the prefix)
            token = sample_step(token, key, t, temperature)
            if t < n_prefix:
                token = prefix[:, t]
            out.append(token)
    return _stack(out)


@nnx.jit
def _cnn_sample_at(model, x, key, t, temperature):
    """Rerun the CNN on the buffer x, draw token t and write it into x."""
    logp = jax.lax.dynamic_index_in_dim(model(x), t, axis=1, keepdims=False)
    token = _draw(logp, key, t, temperature)
    return jax.lax.dynamic_update_index_in_dim(x, token, t, axis=1)


def generate_cnn(model, length, *, key, batch_size, temperature=1.0):
    """Sample like `generate`, but rerun the full CNN-mode model at every step.

    The buffer keeps a fixed length (so one compiled program serves all steps);
    causality makes the not-yet-sampled zeros at positions >= t irrelevant to
    output t. This is what generation costs without a recurrent view.
    """
    _check_model(model, length)
    _check_batch_size(batch_size)
    checks.number(temperature, "temperature", low=0.0, low_open=True)
    x = jnp.zeros((batch_size, length), dtype=jnp.int32)
    temperature = jnp.float32(temperature)
    with eval_mode(model):
        sample_at = _bound(_cnn_sample_at, model)
        for t in range(length):
            x = sample_at(x, key, t, temperature)
    return x
