"""Models built from sequence layers: the residual block, the stacked model,
and a wrapper that reads a next-token model at its last position.

Every sequence layer in the package (`layers`, `h3`, `attention`, `gru`,
`longconv`, `mamba` and `mamba2`) follows one contract, so these models serve
them all:

* ``layer(H, rngs=...)`` builds a layer for H feature channels (pass the other
  arguments with ``functools.partial``);
* ``layer(u)`` maps u of shape (batch, L, H) to (batch, L, H) in parallel
  ("CNN mode", used for training);
* ``layer.init_cache(batch_size)`` prepares recurrent decoding: it precomputes
  whatever the recurrence needs and zeroes the layer's recurrent state, its
  *cache*: everything a step carries to the next, held in ``nnx.Cache``
  variables. ``layer.cache`` is the state proper (the SSM's x, attention's
  keys and values, a convolution's past inputs); a second part is named for
  what it holds (attention's ``position``, Mamba's conv ``window``, the ETSC
  layer's ``phase``), and a sublayer keeps its own (H3's ``shift.cache``);
* ``layer.step(u_t)`` maps one time step u_t of shape (batch, H) to (batch, H)
  and advances the cache ("RNN mode", used for generation);
* ``layer.max_len`` is the longest sequence the layer accepts in either mode,
  None when there is no limit; CNN mode refuses longer inputs.

The same words serve where the state is passed instead of stored: H3's
``empty_cache``/``chunk`` (state passing between chunks) and the decoders of
`decoders` (``empty_cache()``, ``step(cache, x_t)``) return the cache, so that
it can be a carry of ``jax.lax.scan``.
"""

from __future__ import annotations

import contextlib

import jax
import jax.numpy as jnp
from flax import nnx

from . import _checks as checks
from ._types import Array, Float, Int

__all__ = ["SequenceBlock", "StackedModel", "LastTokenModel", "eval_mode"]

# The attributes that nnx's Module.eval() and .train() switch (dropout, batch norm).
_MODE_ATTRIBUTES = ("deterministic", "use_running_average")


@contextlib.contextmanager
def eval_mode(model):
    """``with eval_mode(model):`` runs the block in eval mode (dropout off) and
    then gives every submodule back the mode it had before."""
    saved = [(module, name, getattr(module, name)) for _, module in nnx.iter_modules(model)
             for name in _MODE_ATTRIBUTES if hasattr(module, name)]
    model.eval()
    try:
        yield model
    finally:
        for module, name, value in saved:
            setattr(module, name, value)


class SequenceBlock(nnx.Module):
    """Pre-norm residual block: norm -> sequence layer -> GELU -> GLU -> residual.

    Each of the H channels is mixed only in the position-wise GLU; the sequence
    layer mixes only along time.
    """

    def __init__(self, layer, d_model, *, rngs: nnx.Rngs, dropout=0.0):
        self.seq = layer(d_model, rngs=rngs)
        self.norm = nnx.LayerNorm(d_model, rngs=rngs)
        self.out = nnx.Linear(d_model, d_model, rngs=rngs)
        self.out2 = nnx.Linear(d_model, d_model, rngs=rngs)
        self.drop = nnx.Dropout(dropout, rngs=rngs)

    def _mix(self, y):
        """GELU, then the gated linear unit out(y) * sigmoid(out2(y)), per position."""
        y = self.drop(jax.nn.gelu(y))
        return self.drop(self.out(y) * jax.nn.sigmoid(self.out2(y)))

    def __call__(self, x: Float[Array, "batch L H"]) -> Float[Array, "batch L H"]:
        return x + self._mix(self.seq(self.norm(x)))

    def step(self, x_t: Float[Array, "batch H"]) -> Float[Array, "batch H"]:
        return x_t + self._mix(self.seq.step(self.norm(x_t)))

    def init_cache(self, batch_size):
        self.seq.init_cache(batch_size)


class StackedModel(nnx.Module):
    """Encoder -> n_layers SequenceBlocks -> decoder.

    `layer` is a layer factory ``layer(d_model, rngs=...)``, or a list of
    them used in turn: ``[h3, attention]`` builds H3 in layers 0, 2, ... and
    attention in layers 1, 3, ... (alternating H3 and attention; the H3 paper's
    hybrid keeps only two attention layers among twelve).

    * ``classification=True``: inputs (batch, L, d_input) floats (or (batch, L)
      tokens), outputs log-probabilities (batch, d_output) after mean pooling.
    * ``classification=False``: next-step prediction. The input is shifted one
      step right, so output k sees inputs 0..k-1 only; outputs
      (batch, L, d_output) log-probabilities of input k.
    * ``vocab_size``: if given, inputs are integer tokens and the encoder is an
      embedding; a start token (index vocab_size) fills the shifted-in slot.
      Otherwise the encoder is dense from d_input features and zero is shifted in.
    """

    def __init__(self, layer, d_output, d_model, n_layers, *, rngs: nnx.Rngs,
                 d_input=1, vocab_size=None, classification=True, dropout=0.0):
        n_layers = checks.positive_int(n_layers, "n_layers")
        factories = checks.factories(layer, "layer")
        self.vocab_size = vocab_size
        self.classification = classification
        if vocab_size is not None:
            self.encoder = nnx.Embed(vocab_size + 1, d_model, rngs=rngs)
        else:
            self.encoder = nnx.Linear(d_input, d_model, rngs=rngs)
        self.layers = nnx.List([
            SequenceBlock(factories[i % len(factories)], d_model, rngs=rngs,
                          dropout=dropout)
            for i in range(n_layers)
        ])
        self.norm = nnx.LayerNorm(d_model, rngs=rngs)
        self.decoder = nnx.Linear(d_model, d_output, rngs=rngs)

    @property
    def start_token(self):
        return self.vocab_size

    def _check_input(self, x, ndim):
        """Tokens (the start token included) with `ndim` dims, or float inputs
        with a trailing d_input axis."""
        if self.vocab_size is not None:
            return checks.tokens(x, "x", self.vocab_size + 1, ndim=ndim)
        return checks.array(x, "x", shape=(None,) * ndim + (self.encoder.in_features,),
                            kind="float")

    def _shift_right(self, x):
        if self.vocab_size is not None:
            start = jnp.full_like(x[:, :1], self.start_token)
            return jnp.concatenate([start, x[:, :-1]], axis=1)
        return jnp.pad(x[:, :-1], ((0, 0), (1, 0), (0, 0)))

    def _head(self, x):
        return jax.nn.log_softmax(self.decoder(self.norm(x)), axis=-1)

    def __call__(
        self, x: Int[Array, "batch L"] | Float[Array, "batch L d_input"]
    ) -> Float[Array, "batch *seq d_output"]:
        """Log-probabilities: (batch, d_output) for a classifier, else
        (batch, L, d_output), output k predicting input k from inputs 0..k-1."""
        self._check_input(x, 2)
        if not self.classification:
            x = self._shift_right(x)
        x = self.encoder(x)
        for block in self.layers:
            x = block(x)
        if self.classification:
            x = x.mean(axis=1)
        return self._head(x)

    def init_cache(self, batch_size):
        """Prepare RNN mode for `batch_size` sequences (generation models only)."""
        if self.classification:
            raise ValueError("RNN mode is for next-step models (classification=False)")
        for block in self.layers:
            block.init_cache(batch_size)

    def step(
        self, x_prev: Int[Array, " batch"] | Float[Array, "batch d_input"]
    ) -> Float[Array, "batch d_output"]:
        """One RNN step: x_prev, the previous input (the start token or zeros
        at t = 0), of shape (batch,) tokens or (batch, d_input); returns the
        log-probabilities of the next input, (batch, d_output)."""
        self._check_input(x_prev, 1)
        x = self.encoder(x_prev)
        for block in self.layers:
            x = block.step(x)
        return self._head(x)


class LastTokenModel(nnx.Module):
    """Wraps a next-step `StackedModel` (classification=False, vocab_size set)
    to predict the token that follows x (batch, L): returns (batch, vocab)
    log-probabilities, so `train.fit` treats it as a classifier whose label is
    the answer of a recall task.

    With `answer_len` = K, the answer is K tokens, one after each of the last K
    tokens of x (the markers of selective copying): returns (batch, K, vocab),
    the prediction after x_0 .. x_{L-K+i} for answer i, and the label is
    (batch, K)."""

    def __init__(self, model, answer_len=None):
        self.model = model
        self.answer_len = None if answer_len is None else checks.positive_int(answer_len,
                                                                              "answer_len")

    def __call__(self, x: Int[Array, "batch L"]) -> Float[Array, "batch *answer vocab"]:
        # StackedModel shifts its input right: output k sees x_0 .. x_{k-1}.
        # Append a placeholder so that the last output sees all of x.
        x = jnp.concatenate([x, jnp.zeros_like(x[:, :1])], axis=1)
        if self.answer_len is None:
            return self.model(x)[:, -1]
        if self.answer_len >= x.shape[1]:
            raise ValueError(f"answer_len ({self.answer_len}) must be at most the length of x "
                             f"({x.shape[1] - 1} tokens)")
        return self.model(x)[:, -self.answer_len:]
