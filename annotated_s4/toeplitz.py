"""Toeplitz-to-SSM conversion (ETSC), its gradient-descent baseline, and decoding.

A causal long convolution ``y_i = sum_{j<=i} t_{i-j} x_j`` is a lower-triangular
Toeplitz matrix T applied to x. A diagonal SSM with state matrix diag(lambda),
input vector b and C = 1 is a special one, with ``t_i = sum_k b_k lambda_k^i``.
ETSC (Qin & Zhong, 2023) inverts that map in closed form: append
``t_n = -sum_i t_i`` (the inclusion equation) and take lambda to be the (n+1)-th
roots of unity, so that the Vandermonde system becomes a DFT.

The conversion and the kernels are pure functions of arrays; the three
decoders are small classes that hold arrays and expose one functional
interface (``init() -> state``, ``step(state, x_t) -> (state, y_t)``,
``decode(x)``). `ToeplitzLayer` is a long-convolution layer (Flax NNX, the
layer contract of `models`) that `to_ssm` turns into its ETSC diagonal SSM.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from . import _checks as checks
from .ssm import causal_convolution

__all__ = [
    "etsc",
    "ssm_to_toeplitz",
    "ssm_to_toeplitz_naive",
    "etsc_kernel",
    "toeplitz_matvec",
    "fit_toeplitz_gradient",
    "FFTDecoder",
    "CacheDecoder",
    "SSMDecoder",
    "ToeplitzLayer",
    "TNNLayer",
    "SGConvLayer",
    "valid_loss",
]


def _check_ssm(lambd, b):
    lambd = checks.array(lambd, "lambd", ndim=(1, 2))
    if lambd.shape[0] < 1:
        raise ValueError(f"lambd must have shape (h,) or (h, d), got {lambd.shape}")
    b = checks.array(b, "b", ndim=(1, 2))
    if b.shape[0] != lambd.shape[0] or (lambd.ndim == 2 and b.shape != lambd.shape):
        raise ValueError(f"b must have shape (h,) or (h, d) matching lambd "
                         f"{lambd.shape}, got {b.shape}")
    return checks.finite(lambd, "lambd"), checks.finite(b, "b")


def _roots(N, dtype):
    """omega^m = exp(2 pi i m/N), m = 0..N-1, computed in float64 and rounded once
    to the complex dtype (a constant: N is a shape, known while tracing)."""
    return jnp.asarray(np.exp(2j * np.pi * np.arange(N) / N), dtype)


def _powers(gamma, n, dtype):
    """gamma^i, i = 0..n-1, in float64 then rounded once to `dtype`."""
    return jnp.asarray(np.float64(gamma) ** np.arange(n), dtype)


def _complex_like(dtype):
    """The complex dtype with the precision of the real `dtype`."""
    return jnp.result_type(dtype, jnp.complex64)


def etsc(t, decay=None, half=False):
    """Exact Toeplitz-to-SSM conversion (Algorithm 1 of ETSC).

    t: (n,) or (n, d) real kernel(s). Returns (lambd, b) with
    ``t_i = Re sum_k b_k lambd_k^i`` for 0 <= i < n (for i = n it gives
    ``-gamma^n sum_i r_i``, the inclusion equation, and the kernel repeats with
    period n+1, times gamma^i, beyond).

    lambd_k = gamma * omega^k, omega = exp(2 pi i/(n+1)), k = 1..n, shared by
    every channel; b (n,) or (n, d) complex. With ``decay=gamma`` in (0, 1] the
    kernel is read as t_i = gamma^i r_i (TNN's exponential decay) and r is
    converted, so the SSM decays, and so does its echo beyond lag n.

    ``half=True``: t is real, so b_{n+1-k} = conj(b_k) and lambd too; keep the
    modes k = 1..ceil(n/2) and double b_k for each conjugate pair (k = (n+1)/2,
    lambd = -gamma, has no partner and is kept once): the same kernel, half
    the states.

    The inclusion equation's spike -sum t (about n times the mean) would
    dominate the FFT's rounding, so the mean is handled in closed form: a
    constant kernel m has b_k = -m omega^k exactly, and only t - mean(t), which
    sums to zero and has no spike, goes through the FFT.
    """
    t, gamma = checks.decayed_kernel(t, decay)
    n, N = t.shape[0], t.shape[0] + 1
    if gamma is not None:  # r_i = t_i / gamma^i
        t = t / _powers(gamma, n, t.dtype).reshape((n,) + (1,) * (t.ndim - 1))
    m = t.mean(axis=0, keepdims=True)
    r = t - m
    r_bar = jnp.concatenate([r, -r.sum(axis=0, keepdims=True)], axis=0)  # sums to 0
    w = _roots(N, _complex_like(t.dtype))[1:].reshape((n,) + (1,) * (t.ndim - 1))
    b = jnp.fft.fft(r_bar, axis=0)[1:] / N - m * w  # b_k, k = 1..n
    lambd = w.reshape(n) * (1.0 if gamma is None else gamma)
    if half:
        keep = (n + 1) // 2  # modes 1..ceil(n/2); k = N/2 (n odd) is its own partner
        pair = (jnp.arange(1, keep + 1) < N - jnp.arange(1, keep + 1))
        b = b[:keep] * jnp.where(pair, 2.0, 1.0).reshape((keep,) + (1,) * (t.ndim - 1))
        lambd = lambd[:keep]
    return lambd.astype(b.dtype), b


def _etsc_grid(lambd):
    """(N, gamma) if lambd is an ETSC grid gamma * exp(2 pi i k/N), k = 1..h,
    full (h = N - 1) or half (h = floor(N/2)); None otherwise, and under jit
    (a tracer has no values), so the checked entry points take their general
    path."""
    if isinstance(lambd, jax.core.Tracer) or lambd.ndim != 1:
        return None
    lam = np.asarray(lambd).astype(np.complex128)
    h, mod = lam.shape[0], np.abs(lam)
    gamma = float(mod.mean())
    if not 0 < gamma < 1 + 1e-4 or np.any(np.abs(mod - gamma) > 1e-4 * gamma):
        return None
    ang = np.angle(lam)
    if ang[0] <= 0:
        return None
    N = int(round(2 * np.pi / ang[0]))
    if h not in (N - 1, N // 2):
        return None
    k = ang * N / (2 * np.pi)
    k = np.where(k < 0.5, k + N, k)  # angles in (-pi, pi] -> k in 1..h
    if np.any(np.abs(k - np.arange(1, h + 1)) > 1e-2):
        return None
    return N, (None if abs(gamma - 1) < 1e-6 else gamma)


def ssm_to_toeplitz(lambd, b, n):
    """The kernel t_i = Re sum_k b_k lambd_k^i, i < n, evaluated accurately.

    lambd (h,) complex (shared by all channels) or (h, d) (one set per
    channel, as `fit_toeplitz_gradient` returns), b (h,) or (h, d) complex;
    returns (n,) or (n, d) real.

    The powers lambd_k^i are where precision goes: a float32 lambd carries a
    relative error ~6e-8 that the i-th power multiplies by i. For the ETSC
    grid (full, half, decayed or not) the exponent is known exactly,
    omega^{ik} = omega^{(ik mod N)}, and the sum over k is an inverse DFT, which
    computes every phase from the integer ik mod N: `etsc_kernel`. Any other
    lambd is evaluated as exp(i log lambd) chunk by chunk.
    """
    lambd, b = _check_ssm(lambd, b)
    n = checks.positive_int(n, "n")
    grid = _etsc_grid(lambd)
    if grid is not None:
        return etsc_kernel(b, n, N=grid[0], decay=grid[1])
    bb = b if b.ndim == 2 else b[:, None]
    log_l = jnp.log(lambd if lambd.ndim == 2 else lambd[:, None])  # (h, 1 or d)

    def rows(i):  # i: (chunk,) exponents; lambd^i = exp(i log lambd)
        V = jnp.exp(i[:, None, None].astype(log_l.real.dtype) * log_l[None])
        return jnp.sum(V * bb[None], axis=1).real

    chunk = 256
    m = -(-n // chunk) * chunk
    out = jax.lax.map(rows, jnp.arange(m).reshape(-1, chunk)).reshape(m, -1)[:n]
    return out if b.ndim == 2 else out[:, 0]


def etsc_kernel(b, n, N=None, decay=None):
    """t_i = Re sum_k b_k gamma^i omega^{ik}, omega = exp(2 pi i/N), i < n.

    b (h,) or (h, d): full ETSC coefficients (h = N - 1, the default N) or the
    half-state ones of ``etsc(..., half=True)`` (h = floor(N/2)). The sum over k
    is an inverse DFT: every phase comes from the integer ik mod N. As in
    `etsc`, the constant part (b_k = c omega^k, c = -mean) is taken out in
    closed form before the FFT, so the spike at lag N-1 does not swamp the
    rounding. Periodic with period N, times gamma^i. No input checks (it is
    called inside jitted layers); `ssm_to_toeplitz` is the checked entry point.
    """
    b2 = b if b.ndim == 2 else b[:, None]
    h = b2.shape[0]
    N = h + 1 if N is None else N
    w = _roots(N, b2.dtype)[:, None]
    if h != N - 1:  # half: rebuild the full conjugate-symmetric spectrum
        pair = jnp.arange(1, h + 1)[:, None] < N - jnp.arange(1, h + 1)[:, None]
        half = jnp.where(pair, b2 / 2, b2)
        mirror = jnp.conj(half[: N - 1 - h][::-1])  # k = h+1..N-1 mirror N-k
        b2 = jnp.concatenate([half, mirror], axis=0)
    c = jnp.mean(b2 * jnp.conj(w[1:]), axis=0).real  # -mean of the kernel
    spectrum = jnp.concatenate([jnp.zeros_like(b2[:1]), b2 - c * w[1:]], axis=0)
    period = (N * jnp.fft.ifft(spectrum, axis=0)).real  # zero-mean part, i = 0..N-1
    period = period - c * jnp.where(jnp.arange(N) < N - 1, 1.0, 1.0 - N)[:, None]
    out = period[jnp.arange(n) % N]
    if decay is not None:
        out = out * _powers(decay, n, out.dtype)[:, None]
    return out if b.ndim == 2 else out[:, 0]


def ssm_to_toeplitz_naive(lambd, b, n):
    """The same kernel with the powers lambd^i taken literally (jnp.power):
    the textbook Vandermonde evaluation, whose float32 error grows with i.
    lambd (h,), b (h,) or (h, d); returns (n,) or (n, d)."""
    lambd, b = _check_ssm(lambd, b)
    if lambd.ndim != 1:
        raise ValueError(f"lambd must have shape (h,) here, got {lambd.shape}")
    n = checks.positive_int(n, "n")

    chunk = 1024  # rows at a time: memory chunk * h, the arithmetic unchanged
    return jnp.concatenate([
        (jnp.power(lambd[None, :], jnp.arange(s, min(s + chunk, n))[:, None]) @ b).real
        for s in range(0, n, chunk)], axis=0)


def toeplitz_matvec(t, x):
    """y = T x for the causal Toeplitz matrix of t: y_i = sum_{j<=i} t_{i-j} x_j.

    t (n,) or (n, d); x (n,) or (n, d) (same shape). Zero-padded FFT, O(n log n).
    """
    t, x = checks.toeplitz_kernel(t), checks.toeplitz_kernel(x, "x")
    if t.shape != x.shape:
        raise ValueError(f"x must have the shape of t, {t.shape}, got {x.shape}")
    n = t.shape[0]
    y = jnp.fft.irfft(jnp.fft.rfft(t, 2 * n, axis=0) * jnp.fft.rfft(x, 2 * n, axis=0),
                      2 * n, axis=0)
    return y[:n]


def _gradient_loss(p, t2, scale):
    """sum_i |t_i - sum_k b_k lambd_k^i|^2 / sum t^2, lambd = sigmoid(r) e^{i theta}."""
    i = jnp.arange(t2.shape[0], dtype=t2.dtype)[:, None, None]
    # log lambd = log sigmoid(r) + i theta; lambd^i = exp(i log lambd)
    log_l = jax.nn.log_sigmoid(p["r"]) + 1j * p["theta"]
    pred = jnp.sum(jnp.exp(i * log_l[None]) * (p["b_re"] + 1j * p["b_im"])[None], axis=1)
    return jnp.sum(jnp.abs(t2 - pred) ** 2) / scale


@functools.partial(jax.jit, static_argnames=("steps",))
def _adam_fit(params, t2, lr, steps):
    """`steps` Adam steps on `_gradient_loss`, one compiled scan. Defined once at
    module level, so a second call with the same shapes reuses the compiled
    program (a benchmark can warm it up and time the fit alone)."""
    tx = optax.adam(lr)
    scale = jnp.sum(t2 ** 2) + jnp.finfo(t2.dtype).tiny

    def body(carry, _):
        p, s = carry
        value, g = jax.value_and_grad(_gradient_loss)(p, t2, scale)
        updates, s = tx.update(g, s, p)
        return (optax.apply_updates(p, updates), s), value

    (params, _), losses = jax.lax.scan(body, (params, tx.init(params)), None, length=steps)
    return params, losses


def fit_toeplitz_gradient(t, h, steps=1000, lr=1e-2, seed=0):
    """The gradient baseline (Algorithm 2 of ETSC): fit lambd, b by Adam.

    Per channel, lambd = sigmoid(r) exp(i theta) and b = b_re + i b_im with
    r, theta, b_re, b_im ~ N(0, 1), minimising sum_i |t_i - sum_k b_k lambd_k^i|^2
    (scaled by sum t^2). Returns (lambd, b, losses): lambd and b of shape (h,)
    or (h, d) (one set per channel), losses (steps,) the relative squared error.
    Memory is O(n h d): the Vandermonde tensor is formed at each step.
    """
    t, h = checks.toeplitz_kernel(t), checks.positive_int(h, "h")
    steps = checks.positive_int(steps, "steps")
    lr = checks.number(lr, "lr", low=0, low_open=True, high_open=True)
    squeeze = t.ndim == 1
    t2 = t[:, None] if squeeze else t
    d = t2.shape[1]
    keys = jax.random.split(jax.random.PRNGKey(seed), 4)
    params = {name: jax.random.normal(k, (h, d), t.dtype)
              for name, k in zip(("r", "theta", "b_re", "b_im"), keys)}
    params, losses = _adam_fit(params, t2, jnp.asarray(lr, t.dtype), steps)
    lambd = jax.nn.sigmoid(params["r"]) * jnp.exp(1j * params["theta"])
    b = params["b_re"] + 1j * params["b_im"]
    if squeeze:
        lambd, b = lambd[:, 0], b[:, 0]
    return lambd, b, losses


# ---------------------------------------------------------------- decoders
#
# Decoding one token at a time from a causal convolution y_i = sum_j t_{i-j} x_j,
# with d channels and sequences up to n_max. All three share one interface:
#   state = dec.init()            # arrays only, so it can live in a jax.lax.scan
#   state, y_t = dec.step(state, x_t)   # x_t, y_t: (d,)
#   y = dec.decode(x)             # x: (L, d), L <= n_max; scans step


class _Decoder:
    """Shared checks. Each decoder sets ``n``, the longest sequence it decodes
    correctly, and ``d``, the number of channels."""

    def _check_step(self, x_t):
        if jnp.shape(x_t) != (self.d,):
            raise ValueError(f"x_t must have shape ({self.d},) (one token of every "
                             f"channel), got {jnp.shape(x_t)}")

    def decode(self, x):
        """Run step over x (L, d) from a fresh state; returns y (L, d).

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
        return jax.lax.scan(self.step, self.init(), x)[1]


class _InputBuffer(_Decoder):
    """The state of the two decoders that keep the inputs: a buffer of the n
    past inputs (n, d) and the position i of the next one."""

    def __init__(self, t):
        t = checks.toeplitz_kernel(t)
        self.t = t[:, None] if t.ndim == 1 else t
        self.n, self.d = self.t.shape

    def init(self):
        return jnp.zeros_like(self.t), jnp.zeros((), jnp.int32)

    def _push(self, state, x_t):
        """The buffer with x_t written at position i, and i."""
        self._check_step(x_t)
        buf, i = state
        return buf.at[i].set(x_t), i


class FFTDecoder(_InputBuffer):
    """Recompute: keep the inputs so far in a buffer and redo the whole causal
    convolution by FFT for every new token: O(n log n * d) per token."""

    def __init__(self, t):
        super().__init__(t)
        self.t_hat = jnp.fft.rfft(self.t, 2 * self.n, axis=0)

    def step(self, state, x_t):
        buf, i = self._push(state, x_t)
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

    def step(self, state, x_t):
        buf, i = self._push(state, x_t)
        # rows n-1-i .. 2n-2-i of the padded reversed kernel: t_{i-j} for j <= i, 0 after
        taps = jax.lax.dynamic_slice_in_dim(self.t_rev_padded, self.n - 1 - i, self.n, 0)
        return (buf, i + 1), jnp.sum(taps * buf, axis=0)


class SSMDecoder(_Decoder):
    """SSM recurrence: x_k <- lambd_k x_k + b_k u, y = Re sum_k x_k: O(h d) per
    token and O(h d) memory, whatever the position in the sequence.

    Built from (lambd, b), e.g. ``etsc(t)`` (full, half-state or decayed). With
    ``exact_phase=False`` the state is the literal recurrence above; in float32
    it drifts, because the rounding error of every lambd_k (relative ~6e-8)
    compounds into lambd_k^i.

    With ``exact_phase=True`` (the default, for lambd on an ETSC grid
    gamma * omega^k) the state is kept in the rotating frame z_k = omega^{-ik} x_k,
    which obeys z_k <- gamma z_k + b_k omega^{-ik} u_i, and
    y_i = Re sum_k omega^{ik} z_k. The powers omega^{+-ik} are looked up from a
    table of the N roots of unity at the integer index p_k = ik mod N, carried
    in the state and advanced by p_k <- (p_k + k) mod N. No power of a rounded
    root is ever formed, so the error is that of a running (decaying) sum, not
    of a compounding rotation. The cost per token stays O(h d).
    """

    def __init__(self, lambd, b, exact_phase=True):
        lambd, b = _check_ssm(lambd, b)
        if lambd.ndim != 1:
            raise ValueError(f"lambd must have shape (h,) (shared by all channels), "
                             f"got {lambd.shape}")
        grid = _etsc_grid(lambd)
        if exact_phase and grid is None:
            raise ValueError("exact_phase=True needs lambd on an ETSC grid "
                             "gamma * exp(2 pi i k/N), k = 1..h (pass exact_phase=False)")
        self._setup(lambd, b, *(grid or (None, None)), exact_phase=exact_phase)

    @classmethod
    def from_etsc(cls, b, N=None, decay=None):
        """The exact-phase decoder for ETSC coefficients b (h,) or (h, d) on the
        grid gamma * exp(2 pi i k/N), k = 1..h (N = h + 1 unless given: pass it
        for the half-state b). No value checks, so it can be built inside jit
        (as `ToeplitzLayer` below does); `SSMDecoder(*etsc(t))` is the checked
        entry point."""
        self = cls.__new__(cls)
        N = b.shape[0] + 1 if N is None else N
        lambd = _roots(N, b.dtype)[1:b.shape[0] + 1] * (1.0 if decay is None else decay)
        self._setup(lambd, b, N, decay, exact_phase=True)
        return self

    def _setup(self, lambd, b, N, decay, exact_phase):
        self.lambd = lambd
        self.b = b[:, None] if b.ndim == 1 else b
        self.h, self.d = self.b.shape
        self.exact_phase = exact_phase
        # exact for lags < N - 1 (= h for a full grid), periodic after
        self.n = self.h if N is None else N - 1
        if exact_phase:
            self.N, self.gamma = N, (1.0 if decay is None else decay)
            self.k = jnp.arange(1, self.h + 1, dtype=jnp.int32)
            self.roots = _roots(N, self.b.dtype)

    def init(self):
        z = jnp.zeros((self.h, self.d), self.b.dtype)
        if self.exact_phase:
            return z, jnp.zeros((self.h,), jnp.int32)
        return z

    def step(self, state, x_t):
        self._check_step(x_t)
        if not self.exact_phase:
            state = self.lambd[:, None] * state + self.b * x_t[None, :]
            return state, state.real.sum(axis=0)
        z, p = state
        w = self.roots[p][:, None]  # omega^{ik}, from the exact integer phase
        z = self.gamma * z + self.b * jnp.conj(w) * x_t[None, :]
        y = (w * z).real.sum(axis=0)
        return (z, (p + self.k) % self.N), y


# --------------------------------------------------------------------------
# A Toeplitz neural network layer, convertible to an SSM
# --------------------------------------------------------------------------
class ToeplitzLayer(nnx.Module):
    """A TNN-style long convolution with an explicit learned kernel (ETSC chapter).

    Each of the H channels has its own kernel t of length L (a parameter, shape
    (H, L)) and a skip D: y = T u + D u, with t zero beyond lag L-1. CNN mode is
    the batched FFT convolution; RNN mode keeps a cache of the last L inputs
    (O(L H) per token). At initialisation t_i is drawn N(0, 1/4) times the
    envelope exp(-i / envelope_length) (L/8 by default): recent lags first.

    ``to_ssm(h)`` converts the kernel, zero-padded to length h, with ETSC into a
    diagonal SSM with h states per channel. From then on the layer IS that SSM:
    CNN mode uses its kernel (equal to t up to lag h, periodic with period h+1
    beyond), and RNN mode runs `toeplitz.SSMDecoder`'s exact-phase recurrence
    (mapped over the batch): O(h H) per token whatever the position, and, like
    the kernel, exact up to lag h and periodic beyond.
    """

    max_len = None  # the kernel is zero beyond lag L-1: any input length is exact

    def __init__(self, H, L, *, rngs: nnx.Rngs, envelope_length=None):
        self.H, self.L = checks.positive_int(H, "H"), checks.positive_int(L, "L")
        envelope_length = L / 8 if envelope_length is None else envelope_length
        envelope = jnp.exp(-jnp.arange(L) / envelope_length)  # favour recent lags at init
        self.t = nnx.Param(0.5 * jax.random.normal(rngs.params(), (H, L)) * envelope)
        self.D = nnx.Param(jnp.ones((H,)))
        self.ssm_b = nnx.data(None)  # (h, H) complex once converted by to_ssm
        self.ssm_decay = None
        self.cache = nnx.data(None)

    def to_ssm(self, h=None, decay=None):
        """Replace the kernel by its exact ETSC diagonal SSM with h >= L states
        (lambd = decay * omega^k if a decay is given, see `etsc`)."""
        h = self.L if h is None else h
        if h < self.L:
            raise ValueError(f"h must be at least the kernel length {self.L}, got {h}")
        t = jnp.pad(self.t[...].T, ((0, h - self.L), (0, 0)))  # (h, H)
        self.ssm_decay = checks.decay_factor(decay)
        self.ssm_b = nnx.Cache(etsc(t, decay=self.ssm_decay)[1])
        return self

    def taps(self):
        """The kernel's first L lags, (H, L): what RNN mode convolves with
        before conversion."""
        return self.t[...]

    def kernel(self, L):
        """The kernel actually applied to a length-L input, shape (H, L)."""
        if self.ssm_b is not None:
            return etsc_kernel(self.ssm_b[...], L, decay=self.ssm_decay).T
        t = self.t[...]
        return t[:, :L] if L <= self.L else jnp.pad(t, ((0, 0), (0, L - self.L)))

    def __call__(self, u):
        checks.sequence(u, self.H)
        return causal_convolution(u, self.kernel(u.shape[1]), axis=1) + self.D[...] * u

    def init_cache(self, batch_size):
        if self.ssm_b is None:  # cache of the last L inputs, oldest first
            self.cache = nnx.Cache(jnp.zeros((batch_size, self.L, self.H)))
            return
        z, p = SSMDecoder.from_etsc(self.ssm_b[...], decay=self.ssm_decay).init()  # (h, H), (h,)
        self.phase = nnx.Cache(p)  # p_k = ik mod (h+1), shared by the batch
        self.cache = nnx.Cache(jnp.broadcast_to(z, (batch_size,) + z.shape))

    def step(self, u_t):
        checks.step_input(u_t, self.H, self.cache)
        if self.ssm_b is None:
            buf = jnp.concatenate([self.cache[...][:, 1:], u_t[:, None]], axis=1)
            self.cache[...] = buf
            y = jnp.einsum("blh,hl->bh", buf, self.taps()[:, ::-1])
            return y + self.D[...] * u_t
        # the exact-phase recurrence of toeplitz.SSMDecoder, mapped over the batch
        dec = SSMDecoder.from_etsc(self.ssm_b[...], decay=self.ssm_decay)
        (z, p), y = jax.vmap(dec.step, in_axes=((0, None), 0), out_axes=((0, None), 0))(
            (self.cache[...], self.phase[...]), u_t)
        self.cache[...], self.phase[...] = z, p
        return y + self.D[...] * u_t


class _GeneratedKernelLayer(ToeplitzLayer):
    """A long convolution whose kernel is *generated* for any length (TNN,
    SGConv). Subclasses define `raw_kernel(L)` -> (H, L). CNN mode uses it at the
    input's length; RNN mode, before conversion, is a Cache over the last L
    inputs (exact for positions < L); `to_ssm` converts raw_kernel(h)."""

    def _init_common(self, H, L):
        self.H, self.L = checks.positive_int(H, "H"), checks.positive_int(L, "L")
        self.D = nnx.Param(jnp.ones((H,)))
        self.ssm_b = nnx.data(None)
        self.ssm_decay = None
        self.cache = nnx.data(None)

    def taps(self):
        return self.raw_kernel(self.L)

    def to_ssm(self, h=None, decay=None):
        """ETSC of the generated kernel's first h lags (h >= 1 any size: the
        kernel exists at every length), with lambd = decay * omega^k if given."""
        h = self.L if h is None else checks.positive_int(h, "h")
        self.ssm_decay = checks.decay_factor(decay)
        self.ssm_b = nnx.Cache(etsc(self.raw_kernel(h).T, decay=self.ssm_decay)[1])
        return self

    def kernel(self, L):
        if self.ssm_b is not None:
            return etsc_kernel(self.ssm_b[...], L, decay=self.ssm_decay).T
        return self.raw_kernel(L)


class TNNLayer(_GeneratedKernelLayer):
    """Toeplitz neural network layer (Qin et al., 2023): the kernel is a relative
    position encoder times an exponential decay, t_i = gamma^i RPE(i).

    RPE is a small MLP of the relative position i (scaled by 1/L, L the
    training length): Linear(1, rpe_dim), ReLU, Linear(rpe_dim, rpe_dim),
    ReLU, Linear(rpe_dim, H). It defines a kernel at every length, which is how
    TNN extrapolates, and ``to_ssm(h, decay=gamma)`` converts it with its own
    decay folded into the eigenvalues (lambd = gamma omega^k, as in the ETSC
    paper's TNN).
    """

    def __init__(self, H, L, *, rngs: nnx.Rngs, gamma=0.99, rpe_dim=32):
        self._init_common(H, L)
        self.gamma = checks.decay_factor(gamma)
        self.rpe = nnx.List([nnx.Linear(1, rpe_dim, rngs=rngs),
                             nnx.Linear(rpe_dim, rpe_dim, rngs=rngs),
                             nnx.Linear(rpe_dim, H, rngs=rngs)])

    def rpe_values(self, L):
        """RPE(i) for i = 0..L-1: (L, H)."""
        z = (jnp.arange(L, dtype=jnp.float32) / self.L)[:, None]
        for i, lin in enumerate(self.rpe):
            z = lin(z) if i == 0 else lin(jax.nn.relu(z))
        return z

    def raw_kernel(self, L):
        return (self.rpe_values(L) * _powers(self.gamma, L, jnp.float32)[:, None]).T


class SGConvLayer(_GeneratedKernelLayer):
    """SGConv-style layer (Li et al., 2023): the kernel is a concatenation of
    sub-kernels, sub-kernel s a learned (k, H) kernel upsampled 2^s times
    (linear interpolation) and scaled by alpha^s, covering lags
    k(2^s - 1) .. k(2^{s+1} - 1). Enough scales are built to cover `max_len`
    lags; beyond that the kernel is zero.
    """

    def __init__(self, H, L, *, rngs: nnx.Rngs, k=16, alpha=0.5, max_len=None):
        self._init_common(H, L)
        self.k, self.alpha = checks.positive_int(k, "k"), alpha
        max_len = 8 * L if max_len is None else max_len
        S = int(np.ceil(np.log2(max_len / k + 1)))
        self.w = nnx.Param(jax.random.normal(rngs.params(), (S, k, H)) / np.sqrt(k))

    def raw_kernel(self, L):
        w, k = self.w[...], self.k
        pieces = [jax.image.resize(w[s], (k * 2 ** s, self.H), "linear") * self.alpha ** s
                  for s in range(w.shape[0])]
        t = jnp.concatenate(pieces, axis=0)
        t = t[:L] if L <= t.shape[0] else jnp.pad(t, ((0, L - t.shape[0]), (0, 0)))
        return t.T


# --------------------------------------------------------------------------
# Evaluating the trained language models (reference runs tnn-charlm and
# sgconv-charlm, trained by `python -m annotated_s4.cli --layer tnn|sgconv`)
# --------------------------------------------------------------------------
def valid_loss(model, x):
    """Mean next-character NLL (nats) of x (batch, L) in CNN mode."""
    model.eval()
    logp = model(jnp.asarray(x))
    return float(-jnp.take_along_axis(logp, jnp.asarray(x)[..., None], axis=-1).mean())
