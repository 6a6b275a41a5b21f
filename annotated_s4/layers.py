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

from .hippo import make_DPLR_HiPPO
from .s4 import (discrete_DPLR, discretize_diagonal, kernel_DPLR, kernel_diagonal,
                 s4d_inv_init, s4d_lin_init)
from .ssm import K_conv, discretize
from .toeplitz import SSMDecoder, etsc, etsc_kernel

__all__ = [
    "log_step_initializer",
    "causal_convolution_batched",
    "SSMLayer",
    "SequenceBlock",
    "StackedModel",
    "S4Layer",
    "S4DLayer",
    "ToeplitzLayer",
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
        """The per-channel convolution kernel `K_conv`, shape (H, L)."""
        L = self.L if L is None else L
        return jax.vmap(K_conv, in_axes=(0, 0, 0, None))(*self.discrete(), L)

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


# --------------------------------------------------------------------------
# S4 and S4D layers (Part II)
# --------------------------------------------------------------------------
def _complex(p):
    """A (..., 2) float parameter read as a complex array (real, imag)."""
    return p[..., 0] + 1j * p[..., 1]


def _float_dtype():
    """JAX's default float dtype: float32, or float64 under `jax_enable_x64`."""
    return jax.dtypes.canonicalize_dtype(jnp.float64)


def _as_pair(z, dtype=None):
    """A complex array stored as a (..., 2) float array (real, imag)."""
    z = jnp.asarray(z)
    return jnp.stack([z.real, z.imag], axis=-1).astype(dtype or _float_dtype())


def _check_length_le(u, L):
    if u.shape[1] > L:
        raise ValueError(f"u has length {u.shape[1]}, more than the layer's L = {L}")


class S4Layer(nnx.Module):
    """H channels of an S4 SSM with a DPLR state matrix, HiPPO-initialised.

    Parameters: Lambda, P, B of the DPLR HiPPO, ONE copy shared by the H
    channels (the Annotated S4 keeps a copy per channel; sharing is the S4
    paper's option of tying the state matrix across channels: N-sized instead
    of H x N-sized, and the Cauchy matrix of the kernel is built once for all
    channels); one C~ (the kernel's C (I - Ab^L)), D and log step per channel,
    so every channel still reads the shared HiPPO memory at its own time-scale
    through its own output vector. Complex parameters are (real, imag) pairs in
    JAX's default float dtype (float32; float64 under x64); the real part of
    Lambda is stored as its log-negative, so it stays < 0.

    CNN mode builds the length-L kernel with `kernel_DPLR` on every call and
    uses its first u.shape[1] taps. RNN mode (`init_cache`) computes the
    discrete DPLR matrices once with `discrete_DPLR`.
    """

    def __init__(self, H, N, L, *, rngs: nnx.Rngs, dt_min=0.001, dt_max=0.1):
        if H < 1 or N < 1 or L < 1:
            raise ValueError(f"H, N and L must be positive, got H={H}, N={N}, L={L}")
        self.H, self.N, self.L = H, N, L
        Lambda, P, B, _ = make_DPLR_HiPPO(N)
        dtype = _float_dtype()
        self.Lambda_log_neg_re = nnx.Param(jnp.log(-Lambda.real).astype(dtype))
        self.Lambda_im = nnx.Param(jnp.asarray(Lambda.imag, dtype=dtype))
        self.P = nnx.Param(_as_pair(P))
        self.B = nnx.Param(_as_pair(B))
        # C~ ~ N(0, 1/2) in each of the real and imaginary parts.
        self.C = nnx.Param(jax.random.normal(rngs.params(), (H, N, 2), dtype) * 0.5**0.5)
        self.D = nnx.Param(jnp.ones((H,)))
        self.log_step = nnx.Param(
            log_step_initializer(rngs.params(), (H,), dt_min, dt_max)
        )
        self.cache = nnx.data(None)  # set by init_cache (RNN mode)

    def ssm_params(self):
        """(Lambda, P, B, C~ (H, N), step (H,)) as complex / real arrays."""
        Lambda = -jnp.exp(self.Lambda_log_neg_re[...]) + 1j * self.Lambda_im[...]
        return (Lambda, _complex(self.P[...]), _complex(self.B[...]),
                _complex(self.C[...]), jnp.exp(self.log_step[...]))

    def kernel(self, L=None):
        """The per-channel kernel, shape (H, L); L defaults to (and may not exceed) self.L.

        C~ = C (I - Ab^L) ties the kernel to its length self.L, so a longer
        kernel is not available: asking for one raises.
        """
        L = self.L if L is None else L
        if isinstance(L, bool) or not isinstance(L, int) or not 1 <= L <= self.L:
            raise ValueError(f"L must be an int in [1, self.L = {self.L}], got {L!r}")
        Lambda, P, B, C, step = self.ssm_params()
        K = jax.vmap(lambda C, step: kernel_DPLR(Lambda, P, P, B, C, step, self.L))(C, step)
        return K[:, :L]

    def __call__(self, u):
        _check_input(u, self.H)
        _check_length_le(u, self.L)
        K = self.kernel(u.shape[1])
        return causal_convolution_batched(u, K) + self.D[...] * u

    def init_cache(self, batch_size):
        Lambda, P, B, C, step = self.ssm_params()
        Ab, Bb, Cb = jax.vmap(
            lambda C, step: discrete_DPLR(Lambda, P, P, B, C, step, self.L)
        )(C, step)
        self.Ab, self.Bb, self.Cb = nnx.Cache(Ab), nnx.Cache(Bb[..., 0]), nnx.Cache(Cb[:, 0])
        self.cache = nnx.Cache(jnp.zeros((batch_size, self.H, self.N), Ab.dtype))

    def step(self, u_t):
        _check_step_input(u_t, self.H, self.cache)
        x = jnp.einsum("hnm,bhm->bhn", self.Ab[...], self.cache[...])
        x = x + self.Bb[...] * u_t[..., None]
        self.cache[...] = x
        y = jnp.einsum("hn,bhn->bh", self.Cb[...], x).real
        return y + self.D[...] * u_t


class S4DLayer(nnx.Module):
    """H channels of a diagonal SSM (S4D): N/2 complex modes per channel.

    x_k = Lambda_bar x_{k-1} + B_bar u_k,  y_k = 2 Re(C x_k) + D u_k,
    with the zero-order-hold discretisation of `discretize_diagonal`. The N/2
    modes stand for N/2 conjugate pairs (a real state of size N), hence the 2.
    Lambda starts at S4D-Lin (init="lin") or S4D-Inv (init="inv"), B at 1,
    C ~ N(0, 1/2) per part; Lambda's real part is stored as its log-negative.
    The kernel is the Vandermonde product `kernel_diagonal`, O(N L).
    """

    def __init__(self, H, N, L, *, rngs: nnx.Rngs, init="lin", dt_min=0.001, dt_max=0.1):
        if H < 1 or N < 2 or L < 1:
            raise ValueError(f"H, L must be positive and N >= 2, got H={H}, N={N}, L={L}")
        inits = {"lin": s4d_lin_init, "inv": s4d_inv_init}
        if init not in inits:
            raise ValueError(f"init must be 'lin' or 'inv', got {init!r}")
        self.H, self.N, self.L = H, N, L
        dtype = _float_dtype()
        Lambda = jnp.broadcast_to(inits[init](N), (H, N // 2))
        self.Lambda_log_neg_re = nnx.Param(jnp.log(-Lambda.real).astype(dtype))
        self.Lambda_im = nnx.Param(Lambda.imag.astype(dtype))
        self.B = nnx.Param(_as_pair(jnp.ones((H, N // 2))))
        self.C = nnx.Param(jax.random.normal(rngs.params(), (H, N // 2, 2), dtype) * 0.5**0.5)
        self.D = nnx.Param(jnp.ones((H,)))
        self.log_step = nnx.Param(
            log_step_initializer(rngs.params(), (H,), dt_min, dt_max)
        )
        self.cache = nnx.data(None)  # set by init_cache (RNN mode)

    def ssm_params(self):
        """(Lambda, B, C, step) with shapes (H, N/2) complex x3 and (H,)."""
        Lambda = -jnp.exp(self.Lambda_log_neg_re[...]) + 1j * self.Lambda_im[...]
        return Lambda, _complex(self.B[...]), _complex(self.C[...]), jnp.exp(self.log_step[...])

    def kernel(self, L=None):
        """The per-channel kernel 2 Re(sum_n C_n B_bar_n Lambda_bar_n^l), shape (H, L)."""
        L = self.L if L is None else L
        Lambda, B, C, step = self.ssm_params()
        return jax.vmap(lambda Lm, B, C, s: kernel_diagonal(Lm, B, 2 * C, s, L))(
            Lambda, B, C, step
        )

    def __call__(self, u):
        _check_input(u, self.H)
        _check_length_le(u, self.L)
        K = self.kernel(u.shape[1])
        return causal_convolution_batched(u, K) + self.D[...] * u

    def init_cache(self, batch_size):
        Lambda, B, C, step = self.ssm_params()
        Lambda_bar, B_bar = discretize_diagonal(Lambda, B, step[:, None])
        self.Lambda_bar = nnx.Cache(Lambda_bar)
        self.B_bar = nnx.Cache(B_bar)
        self.C2 = nnx.Cache(2 * C)
        self.cache = nnx.Cache(jnp.zeros((batch_size, self.H, self.N // 2), Lambda_bar.dtype))

    def step(self, u_t):
        _check_step_input(u_t, self.H, self.cache)
        x = self.Lambda_bar[...] * self.cache[...] + self.B_bar[...] * u_t[..., None]
        self.cache[...] = x
        y = jnp.einsum("hn,bhn->bh", self.C2[...], x).real
        return y + self.D[...] * u_t


class ToeplitzLayer(nnx.Module):
    """A TNN-style long convolution with an explicit learned kernel (ETSC chapter).

    Each of the H channels has its own kernel t of length L (a parameter, shape
    (H, L)) and a skip D: y = T u + D u, with t zero beyond lag L-1. CNN mode is
    the batched FFT convolution; RNN mode keeps a cache of the last L inputs
    (O(L H) per token).

    ``to_ssm(h)`` converts the kernel, zero-padded to length h, with ETSC into a
    diagonal SSM with h states per channel. From then on the layer IS that SSM:
    CNN mode uses its kernel (equal to t up to lag h, periodic with period h+1
    beyond), and RNN mode runs `toeplitz.SSMDecoder`'s exact-phase recurrence
    (mapped over the batch): O(h H) per token whatever the position, and, like
    the kernel, exact up to lag h and periodic beyond.
    """

    def __init__(self, H, L, *, rngs: nnx.Rngs, decay=None):
        if H < 1 or L < 1:
            raise ValueError(f"H and L must be positive, got H={H}, L={L}")
        self.H, self.L = H, L
        decay = L / 8 if decay is None else decay
        envelope = jnp.exp(-jnp.arange(L) / decay)  # favour recent lags at init
        self.t = nnx.Param(0.5 * jax.random.normal(rngs.params(), (H, L)) * envelope)
        self.D = nnx.Param(jnp.ones((H,)))
        self.ssm_b = nnx.data(None)  # (h, H) complex once converted by to_ssm
        self.cache = nnx.data(None)

    def to_ssm(self, h=None):
        """Replace the kernel by its exact ETSC diagonal SSM with h >= L states."""
        h = self.L if h is None else h
        if h < self.L:
            raise ValueError(f"h must be at least the kernel length {self.L}, got {h}")
        t = jnp.pad(self.t[...].T, ((0, h - self.L), (0, 0)))  # (h, H)
        self.ssm_b = nnx.Cache(etsc(t)[1])
        return self

    def kernel(self, L):
        """The kernel actually applied to a length-L input, shape (H, L)."""
        if self.ssm_b is not None:
            return etsc_kernel(self.ssm_b[...], L).T
        t = self.t[...]
        return t[:, :L] if L <= self.L else jnp.pad(t, ((0, 0), (0, L - self.L)))

    def __call__(self, u):
        _check_input(u, self.H)
        return causal_convolution_batched(u, self.kernel(u.shape[1])) + self.D[...] * u

    def init_cache(self, batch_size):
        if self.ssm_b is None:  # cache of the last L inputs, oldest first
            self.cache = nnx.Cache(jnp.zeros((batch_size, self.L, self.H)))
            return
        z, p = SSMDecoder.from_etsc(self.ssm_b[...]).init()  # (h, H), (h,)
        self.phase = nnx.Cache(p)  # p_k = ik mod (h+1), shared by the batch
        self.cache = nnx.Cache(jnp.broadcast_to(z, (batch_size,) + z.shape))

    def step(self, u_t):
        _check_step_input(u_t, self.H, self.cache)
        if self.ssm_b is None:
            buf = jnp.concatenate([self.cache[...][:, 1:], u_t[:, None]], axis=1)
            self.cache[...] = buf
            y = jnp.einsum("blh,hl->bh", buf, self.t[...][:, ::-1])
            return y + self.D[...] * u_t
        # the exact-phase recurrence of toeplitz.SSMDecoder, mapped over the batch
        dec = SSMDecoder.from_etsc(self.ssm_b[...])
        (z, p), y = jax.vmap(dec.step, in_axes=((0, None), 0), out_axes=((0, None), 0))(
            (self.cache[...], self.phase[...]), u_t)
        self.cache[...], self.phase[...] = z, p
        return y + self.D[...] * u_t
