"""Decoding a causal convolution one token at a time, three ways.

For y_i = sum_{j<=i} t_{i-j} x_j with d channels, three decoders share the
layers' recurrent protocol (a cache made before the first token, then one
`step` per token), in functional form: the cache is returned, not stored,
so that it can be the carry of a jax.lax.scan.

    cache = dec.empty_cache()            # arrays only
    cache, y_t = dec.step(cache, x_t)    # x_t, y_t: (d,)
    y = dec.decode(x)                    # x: (L, d), L <= dec.n; scans step

`FFTDecoder` recomputes the whole convolution for every token, `CacheDecoder`
keeps the past inputs (the KV-cache analogue), and `SSMDecoder` runs the
diagonal SSM that `toeplitz.etsc` makes of the kernel, in constant time and
memory per token.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from . import _checks as checks
from ._types import Array, Float
from .toeplitz import etsc_grid, roots_of_unity

__all__ = ["FFTDecoder", "CacheDecoder", "SSMDecoder"]


class _Decoder:
    """Shared checks. Each decoder sets ``n``, the longest sequence it decodes
    correctly, and ``d``, the number of channels."""

    def _check_step(self, x_t):
        if jnp.shape(x_t) != (self.d,):
            raise ValueError(f"x_t must have shape ({self.d},) (one token of every "
                             f"channel), got {jnp.shape(x_t)}")

    def decode(self, x: Float[Array, "L *channels"]) -> Float[Array, "L d"]:
        """Run step over x (L, d) from an empty cache; returns y (L, d).

        L must be at most n: past its kernel's length the FFT buffer would drop
        the writes, the Cache would see zero taps and the SSM would repeat its
        kernel periodically, each silently wrong, so longer inputs raise."""
        x = checks.toeplitz_kernel(x, "x")
        x = x[:, None] if x.ndim == 1 else x
        if x.shape[1] != self.d:
            raise ValueError(f"x must have {self.d} channels, got shape {x.shape}")
        if x.shape[0] > self.n:
            raise ValueError(f"x has {x.shape[0]} time steps but this {type(self).__name__} "
                             f"covers at most n = {self.n} (its kernel length or state "
                             "size); convert a longer kernel")
        return jax.lax.scan(self.step, self.empty_cache(), x)[1]


class _InputBuffer(_Decoder):
    """The cache of the two decoders that keep the inputs: a buffer of the n
    past inputs (n, d) and the position i of the next one."""

    def __init__(self, t):
        t = checks.toeplitz_kernel(t)
        self.t = t[:, None] if t.ndim == 1 else t
        self.n, self.d = self.t.shape

    def empty_cache(self):
        return jnp.zeros_like(self.t), jnp.zeros((), jnp.int32)

    def _push(self, cache, x_t):
        """The buffer with x_t written at position i, and i."""
        self._check_step(x_t)
        buf, i = cache
        return buf.at[i].set(x_t), i


class FFTDecoder(_InputBuffer):
    """Recompute: keep the inputs so far in a buffer and redo the whole causal
    convolution by FFT for every new token: O(n log n * d) per token."""

    def __init__(self, t):
        super().__init__(t)
        self.t_hat = jnp.fft.rfft(self.t, 2 * self.n, axis=0)

    def step(self, cache, x_t: Float[Array, " d"]) -> tuple[tuple, Float[Array, " d"]]:
        buf, i = self._push(cache, x_t)
        y = jnp.fft.irfft(jnp.fft.rfft(buf, 2 * self.n, axis=0) * self.t_hat,
                          2 * self.n, axis=0)
        return (buf, i + 1), y[i]


class CacheDecoder(_InputBuffer):
    """Cache (the KV-cache analogue): keep the past inputs and compute only the
    new output, y_i = sum_{j<=i} t_{i-j} x_j: O(n d) per token, O(n d) memory."""

    def __init__(self, t):
        super().__init__(t)
        # reversed kernel: t_rev[j] = t[n-1-j], so t_{i-j} = t_rev[n-1-i+j]
        self.t_rev_padded = jnp.concatenate([self.t[::-1], jnp.zeros_like(self.t)], 0)

    def step(self, cache, x_t: Float[Array, " d"]) -> tuple[tuple, Float[Array, " d"]]:
        buf, i = self._push(cache, x_t)
        # rows n-1-i .. 2n-2-i of the padded reversed kernel: t_{i-j} for j <= i, 0 after
        taps = jax.lax.dynamic_slice_in_dim(self.t_rev_padded, self.n - 1 - i, self.n, 0)
        return (buf, i + 1), jnp.sum(taps * buf, axis=0)


class SSMDecoder(_Decoder):
    """SSM recurrence: s_k <- lambd_k s_k + b_k x_i, y_i = Re sum_k s_k (s the
    state, x_i the input at position i): O(h d) per token and O(h d) memory,
    whatever the position in the sequence.

    Built from (lambd, b), e.g. ``etsc(t)`` (full, half-state or decayed). With
    ``exact_phase=False`` the state is the literal recurrence above; in float32
    it drifts, because the rounding error of every lambd_k (relative ~6e-8)
    compounds into lambd_k^i.

    With ``exact_phase=True`` (the default, for lambd on an ETSC grid
    gamma * omega^k) the state is kept in the rotating frame z_k = omega^{-ik} s_k,
    which obeys z_k <- gamma z_k + b_k omega^{-ik} x_i, and
    y_i = Re sum_k omega^{ik} z_k. The powers omega^{+-ik} are looked up from a
    table of the N roots of unity at the integer index p_k = ik mod N, carried
    in the cache and advanced by p_k <- (p_k + k) mod N. No power of a rounded
    root is ever formed, so the error is that of a running (decaying) sum, not
    of a compounding rotation. A decay gamma is still a float32 number here:
    its rounding compounds into gamma^i (1 + i delta), delta <= 2^-24, which a
    slow decay over a long sequence shows. The cost per token stays O(h d).
    """

    def __init__(self, lambd, b, exact_phase=True, *, grid=None):
        """lambd (h,), b (h,) or (h, d). ``grid=(N, gamma)`` states that lambd is
        the ETSC grid gamma * exp(2 pi i k/N) (gamma None for 1) instead of
        detecting it from lambd's values, which a traced lambd does not have
        (`from_etsc` passes it)."""
        lambd, b = checks.diagonal_ssm(lambd, b)
        if lambd.ndim != 1:
            raise ValueError(f"lambd must have shape (h,) (shared by all channels), "
                             f"got {lambd.shape}")
        grid = etsc_grid(lambd) if grid is None else grid
        if exact_phase and grid is None:
            raise ValueError("exact_phase=True needs lambd on an ETSC grid "
                             "gamma * exp(2 pi i k/N), k = 1..h (pass exact_phase=False)")
        N, gamma = grid or (None, None)
        self.lambd, self.b = lambd, (b[:, None] if b.ndim == 1 else b)
        self.h, self.d = self.b.shape
        self.exact_phase = exact_phase
        self.n = self.h if N is None else N - 1  # exact for lags < N - 1, periodic after
        if exact_phase:
            self.N, self.gamma = N, (1.0 if gamma is None else gamma)
            self.k = jnp.arange(1, self.h + 1, dtype=jnp.int32)
            self.roots = roots_of_unity(N, self.b.dtype)

    @classmethod
    def from_etsc(cls, b, N=None, decay=None):
        """The exact-phase decoder for ETSC coefficients b (h,) or (h, d) on the
        grid gamma * exp(2 pi i k/N), k = 1..h (N = h + 1 unless given: pass it
        for the half-state b). It can be built inside jit (as the layers of
        `longconv` do): the grid is given, not detected."""
        N = b.shape[0] + 1 if N is None else N
        lambd = roots_of_unity(N, b.dtype)[1:b.shape[0] + 1] * (1.0 if decay is None else decay)
        return cls(lambd, b, grid=(N, decay))

    def empty_cache(self):
        """The state s (h, d), or in exact-phase form z (h, d) and the phase
        indices p (h,)."""
        z = jnp.zeros((self.h, self.d), self.b.dtype)
        if self.exact_phase:
            return z, jnp.zeros((self.h,), jnp.int32)
        return z

    def step(self, cache, x_t: Float[Array, " d"]) -> tuple[Array | tuple, Float[Array, " d"]]:
        self._check_step(x_t)
        if not self.exact_phase:
            s = self.lambd[:, None] * cache + self.b * x_t[None, :]
            return s, s.real.sum(axis=0)
        z, p = cache
        w = self.roots[p][:, None]  # omega^{ik}, from the exact integer phase
        z = self.gamma * z + self.b * jnp.conj(w) * x_t[None, :]
        y = (w * z).real.sum(axis=0)
        return (z, (p + self.k) % self.N), y
