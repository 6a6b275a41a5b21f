"""Flax NNX modules built on the pure math of `ssm`, `hippo` and `s4`.

Every sequence layer in this package follows one small contract, so that the
same `SequenceBlock` and `StackedModel` serve the Part I SSM, S4, S4D, H3 and
attention:

* ``layer(H, rngs=...)`` builds a layer for H feature channels (pass the other
  arguments with ``functools.partial``);
* ``layer(u)`` maps u of shape (batch, L, H) to (batch, L, H) in parallel
  ("CNN mode", used for training);
* ``layer.init_cache(batch_size)`` prepares recurrent decoding: it precomputes
  whatever the recurrence needs and zeroes the state, held in ``nnx.Cache``
  variables;
* ``layer.step(u_t)`` maps one time step u_t of shape (batch, H) to (batch, H)
  and advances the cached state ("RNN mode", used for generation).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from .ssm import discretize

__all__ = [
    "log_step_initializer",
    "causal_convolution_batched",
    "SSMLayer",
    "SequenceBlock",
    "StackedModel",
]


def log_step_initializer(rng, shape, dt_min=0.001, dt_max=0.1):
    """log(step) drawn uniformly in [log dt_min, log dt_max]."""
    return jax.random.uniform(rng, shape) * (
        jnp.log(dt_max) - jnp.log(dt_min)
    ) + jnp.log(dt_min)


def causal_convolution_batched(u, K):
    """Causal convolution of u (batch, L, H) with one kernel per channel, K (H, L).

    The same zero-padded FFT as `ssm.causal_convolution`, done for all
    channels and batch elements at once: one FFT of the kernel, shared by the
    whole batch.
    """
    if u.ndim != 3:
        raise ValueError(f"u must have shape (batch, L, H), got {u.shape}")
    L, H = u.shape[1], u.shape[2]
    if K.shape != (H, L):
        raise ValueError(f"K must have shape (H, L) = ({H}, {L}), got {K.shape}")
    ud = jnp.fft.rfft(u, n=2 * L, axis=1)
    Kd = jnp.fft.rfft(K.T, n=2 * L, axis=0)
    return jnp.fft.irfft(ud * Kd[None], n=2 * L, axis=1)[:, :L]


def _check_input(u, H, name="u"):
    if u.ndim != 3 or u.shape[-1] != H:
        raise ValueError(f"{name} must have shape (batch, L, {H}), got {u.shape}")


def _check_step_input(u, H, cache):
    if cache is None:
        raise ValueError("call init_cache(batch_size) before step()")
    if u.ndim != 2 or u.shape[-1] != H:
        raise ValueError(f"u_t must have shape (batch, {H}), got {u.shape}")


class SSMLayer(nnx.Module):
    """H independent N-state SSMs with learned A, B, C, D and log step (Part I).

    The kernel is built with the naive `K_conv`-style power iteration, which
    costs O(N^2 L) per channel and is numerically fragile: the layer S4 improves on.
    """

    def __init__(self, H, N, L, *, rngs: nnx.Rngs, dt_min=0.001, dt_max=0.1):
        if H < 1 or N < 1 or L < 1:
            raise ValueError(f"H, N and L must be positive, got H={H}, N={N}, L={L}")
        self.H, self.N, self.L = H, N, L
        init = jax.nn.initializers.lecun_normal()
        self.A = nnx.Param(init(rngs.params(), (H, N, N)))
        self.B = nnx.Param(init(rngs.params(), (H, N, 1)))
        self.C = nnx.Param(init(rngs.params(), (H, 1, N)))
        self.D = nnx.Param(jnp.ones((H,)))
        self.log_step = nnx.Param(
            log_step_initializer(rngs.params(), (H,), dt_min, dt_max)
        )
        self.cache = nnx.data(None)  # set by init_cache (RNN mode)

    def discrete(self):
        """(Ab, Bb, Cb) for every channel: shapes (H, N, N), (H, N, 1), (H, 1, N)."""
        step = jnp.exp(self.log_step[...])
        return jax.vmap(discretize)(self.A[...], self.B[...], self.C[...], step)

    def kernel(self, L=None):
        """The per-channel convolution kernel, shape (H, L)."""
        L = self.L if L is None else L
        Ab, Bb, Cb = self.discrete()

        def one(Ab, Bb, Cb):
            def power(v, _):  # v = Ab^l Bb
                return Ab @ v, (Cb @ v).reshape()

            return jax.lax.scan(power, Bb, None, length=L)[1]

        return jax.vmap(one)(Ab, Bb, Cb)

    def __call__(self, u):
        _check_input(u, self.H)
        K = self.kernel(u.shape[1])
        return causal_convolution_batched(u, K) + self.D[...] * u

    def init_cache(self, batch_size):
        Ab, Bb, Cb = self.discrete()
        self.Ab, self.Bb, self.Cb = nnx.Cache(Ab), nnx.Cache(Bb[..., 0]), nnx.Cache(Cb[:, 0])
        self.cache = nnx.Cache(jnp.zeros((batch_size, self.H, self.N)))

    def step(self, u_t):
        _check_step_input(u_t, self.H, self.cache)
        x = jnp.einsum("hnm,bhm->bhn", self.Ab[...], self.cache[...])
        x = x + self.Bb[...] * u_t[..., None]
        self.cache[...] = x
        y = jnp.einsum("hn,bhn->bh", self.Cb[...], x)
        return y + self.D[...] * u_t


class SequenceBlock(nnx.Module):
    """Pre-norm residual block: norm -> sequence layer -> GELU -> GLU -> residual.

    Each of the H channels is mixed only in the position-wise GLU; the sequence
    layer mixes only along time.
    """

    def __init__(self, layer, d_model, *, rngs: nnx.Rngs, dropout=0.0,
                 prenorm=True, glu=True):
        self.seq = layer(d_model, rngs=rngs)
        self.norm = nnx.LayerNorm(d_model, rngs=rngs)
        self.out = nnx.Linear(d_model, d_model, rngs=rngs)
        self.out2 = nnx.Linear(d_model, d_model, rngs=rngs) if glu else None
        self.drop = nnx.Dropout(dropout, rngs=rngs)
        self.prenorm, self.glu = prenorm, glu

    def _mix(self, x):
        x = self.drop(jax.nn.gelu(x))
        if self.glu:
            x = self.out(x) * jax.nn.sigmoid(self.out2(x))
        else:
            x = self.out(x)
        return self.drop(x)

    def __call__(self, x):
        skip = x
        if self.prenorm:
            x = self.norm(x)
        x = skip + self._mix(self.seq(x))
        return x if self.prenorm else self.norm(x)

    def step(self, x_t):
        skip = x_t
        if self.prenorm:
            x_t = self.norm(x_t)
        x_t = skip + self._mix(self.seq.step(x_t))
        return x_t if self.prenorm else self.norm(x_t)

    def init_cache(self, batch_size):
        self.seq.init_cache(batch_size)


class StackedModel(nnx.Module):
    """Encoder -> n_layers SequenceBlocks -> decoder.

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
                 d_input=1, vocab_size=None, classification=True, dropout=0.0,
                 prenorm=True, glu=True):
        if n_layers < 1:
            raise ValueError(f"n_layers must be at least 1, got {n_layers}")
        self.vocab_size = vocab_size
        self.classification = classification
        if vocab_size is not None:
            self.encoder = nnx.Embed(vocab_size + 1, d_model, rngs=rngs)
        else:
            self.encoder = nnx.Linear(d_input, d_model, rngs=rngs)
        self.layers = nnx.List([
            SequenceBlock(layer, d_model, rngs=rngs, dropout=dropout,
                          prenorm=prenorm, glu=glu)
            for _ in range(n_layers)
        ])
        self.norm = nnx.LayerNorm(d_model, rngs=rngs) if prenorm else None
        self.decoder = nnx.Linear(d_model, d_output, rngs=rngs)

    @property
    def start_token(self):
        return self.vocab_size

    def _check_tokens(self, x, ndim):
        if self.vocab_size is not None:
            if x.ndim != ndim or not jnp.issubdtype(x.dtype, jnp.integer):
                raise TypeError(
                    f"expected integer tokens with {ndim} dims, got {x.dtype} {x.shape}"
                )
        elif x.ndim != ndim + 1:
            raise ValueError(
                f"expected float inputs with {ndim + 1} dims (..., d_input), got {x.shape}"
            )

    def _shift_right(self, x):
        if self.vocab_size is not None:
            start = jnp.full_like(x[:, :1], self.start_token)
            return jnp.concatenate([start, x[:, :-1]], axis=1)
        return jnp.pad(x[:, :-1], ((0, 0), (1, 0), (0, 0)))

    def _head(self, x):
        if self.norm is not None:
            x = self.norm(x)
        return jax.nn.log_softmax(self.decoder(x), axis=-1)

    def __call__(self, x):
        self._check_tokens(x, 2)
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

    def step(self, x_prev):
        """One RNN step: x_prev, the previous input (the start token or zeros
        at t = 0), of shape (batch,) tokens or (batch, d_input); returns the
        log-probabilities of the next input, (batch, d_output)."""
        self._check_tokens(x_prev, 1)
        x = self.encoder(x_prev)
        for block in self.layers:
            x = block.step(x)
        return self._head(x)
