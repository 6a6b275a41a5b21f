"""Toeplitz-to-SSM conversion (ETSC) and its gradient-descent baseline.

A causal long convolution ``y_i = sum_{j<=i} t_{i-j} x_j`` is a lower-triangular
Toeplitz matrix T applied to x. A diagonal SSM with state matrix diag(lambda),
input vector b and C = 1 is a special one, with ``t_i = sum_k b_k lambda_k^i``.
ETSC (Qin & Zhong, 2023) inverts that map in closed form: append
``t_n = -sum_i t_i`` (the inclusion equation) and take lambda to be the (n+1)-th
roots of unity, so that the Vandermonde system becomes a DFT.

Everything here is a pure function of arrays. Decoding one token at a time is
in `decoders`; the long-convolution layers that convert themselves are in
`longconv`.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax

from . import _checks as checks
from ._types import Array, Complex, Float, Scalar

__all__ = [
    "etsc",
    "etsc_grid",
    "roots_of_unity",
    "ssm_to_toeplitz",
    "ssm_to_toeplitz_naive",
    "etsc_kernel",
    "toeplitz_matvec",
    "fit_toeplitz_gradient",
    "decaying_kernel",
]


def decaying_kernel(n, d=None, seed=0, dtype=jnp.float32):
    """A random, slowly decaying long-convolution kernel, chapter 8's test kernel:
    t_i = r_i exp(-3 i / n) with r_i standard normal (key `seed`), shape (n,) or (n, d)."""
    n = checks.positive_int(n, "n")
    if d is not None:
        d = checks.positive_int(d, "d")
    return _decaying_kernel(n, d, seed, jnp.dtype(dtype))


@functools.partial(jax.jit, static_argnames=("n", "d", "seed", "dtype"))
def _decaying_kernel(n, d, seed, dtype):
    shape = (n,) if d is None else (n, d)
    t = jax.random.normal(jax.random.PRNGKey(seed), shape, dtype)
    decay = jnp.exp(-3 * jnp.arange(n, dtype=dtype) / n)
    return t * (decay if d is None else decay[:, None])


def roots_of_unity(N, dtype):
    """omega^m = exp(2 pi i m/N), m = 0..N-1, computed in float64 and rounded once
    to the complex dtype (a constant: N is a shape, known while tracing)."""
    return jnp.asarray(np.exp(2j * np.pi * np.arange(N) / N), dtype)


def decay_powers(gamma, n, dtype):
    """gamma^i, i = 0..n-1, in float64 then rounded once to `dtype`."""
    return jnp.asarray(np.float64(gamma) ** np.arange(n), dtype)


def _complex_like(dtype):
    """The complex dtype with the precision of the real `dtype`."""
    return jnp.result_type(dtype, jnp.complex64)


def etsc(
    t: Float[Array, "n *d"], decay: Scalar | None = None, half: bool = False
) -> tuple[Complex[Array, "modes"], Complex[Array, "modes *d"]]:
    """Exact Toeplitz-to-SSM conversion (Algorithm 1 of ETSC).

    t: (n,) or (n, d) real kernel(s). Returns (lambd, b) with
    ``t_i = Re sum_k b_k lambd_k^i`` for 0 <= i < n (for i = n it gives
    ``-gamma^n sum_i r_i``, the inclusion equation, and the kernel repeats with
    period n+1, times gamma^i, beyond).

    lambd_k = gamma * omega^k, omega = exp(2 pi i/(n+1)), k = 1..n, shared by
    every channel; b (n,) or (n, d) complex (the signature's ``modes`` is n,
    or ceil(n/2) with ``half=True``). With ``decay=gamma`` in (0, 1] the
    kernel is read as t_i = gamma^i r_i (TNN's exponential decay) and r is
    converted, so the SSM decays, and so does its echo beyond lag n. In
    float32, lambd carries gamma rounded to float32 (relative error delta <=
    2^-24), so the kernel of the returned SSM is t_i (1 + i delta) to first
    order: evaluate with the exact gamma, ``etsc_kernel(b, n, decay=gamma)``,
    as the long-convolution layers do, where a slow decay meets a long kernel.

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
        t = t / decay_powers(gamma, n, t.dtype).reshape((n,) + (1,) * (t.ndim - 1))
    m = t.mean(axis=0, keepdims=True)
    r = t - m
    r_bar = jnp.concatenate([r, -r.sum(axis=0, keepdims=True)], axis=0)  # sums to 0
    w = roots_of_unity(N, _complex_like(t.dtype))[1:].reshape((n,) + (1,) * (t.ndim - 1))
    b = jnp.fft.fft(r_bar, axis=0)[1:] / N - m * w  # b_k, k = 1..n
    lambd = w.reshape(n) * (1.0 if gamma is None else gamma)
    if half:
        keep = (n + 1) // 2  # modes 1..ceil(n/2); k = N/2 (n odd) is its own partner
        pair = (jnp.arange(1, keep + 1) < N - jnp.arange(1, keep + 1))
        b = b[:keep] * jnp.where(pair, 2.0, 1.0).reshape((keep,) + (1,) * (t.ndim - 1))
        lambd = lambd[:keep]
    return lambd.astype(b.dtype), b


def etsc_grid(lambd):
    """(N, gamma) if lambd is an ETSC grid gamma * exp(2 pi i k/N), k = 1..h,
    full (h = N - 1) or half (h = floor(N/2)), to within a few roundings of
    lambd's dtype; None otherwise, and under jit (a tracer has no values), so
    the checked entry points take their general path. A lambd that is off
    the grid by more than its rounding is not snapped onto it, and a decay
    gamma is dropped (None) only when it is within that rounding of 1."""
    if isinstance(lambd, jax.core.Tracer) or lambd.ndim != 1:
        return None
    tol = 16 * float(jnp.finfo(lambd.dtype).eps)  # a few roundings of lambd
    lam = np.asarray(lambd).astype(np.complex128)
    h, mod = lam.shape[0], np.abs(lam)
    gamma = float(mod.mean())
    if not 0 < gamma < 1 + tol or np.any(np.abs(mod - gamma) > tol * gamma):
        return None
    ang = np.angle(lam)
    if ang[0] <= 0:
        return None
    N = int(round(2 * np.pi / ang[0]))
    if h not in (N - 1, N // 2):
        return None
    k = ang * N / (2 * np.pi)
    k = np.where(k < 0.5, k + N, k)  # angles in (-pi, pi] -> k in 1..h
    if np.any(np.abs(k - np.arange(1, h + 1)) * 2 * np.pi / N > tol * np.pi):  # angles
        return None
    return N, (None if abs(gamma - 1) <= tol else gamma)   # no decay beyond rounding


def ssm_to_toeplitz(lambd, b, n):
    """The kernel t_i = Re sum_k b_k lambd_k^i, i < n, evaluated accurately.

    lambd (h,) complex (shared by all channels) or (h, d) (one set per
    channel, as `fit_toeplitz_gradient` returns), b (h,) or (h, d) complex;
    returns (n,) or (n, d) real.

    The powers lambd_k^i are where precision goes: a float32 lambd carries a
    relative error ~6e-8 that the i-th power multiplies by i. For the ETSC
    grid (full, half, decayed or not; `etsc_grid` recognises it to within a
    few roundings of lambd, and evaluates the grid lambd rounds to) the
    exponent is known exactly,
    omega^{ik} = omega^{(ik mod N)}, and the sum over k is an inverse DFT, which
    computes every phase from the integer ik mod N: `etsc_kernel`. A decayed
    grid is evaluated with the gamma its lambd carries, rounded to lambd's
    dtype, whose i-th power is off by about i eps (`etsc_kernel` with the
    exact decay avoids that). Any other lambd is evaluated as exp(i log lambd)
    chunk by chunk.
    """
    lambd, b = checks.diagonal_ssm(lambd, b)
    n = checks.positive_int(n, "n")
    grid = etsc_grid(lambd)
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


@functools.partial(jax.jit, static_argnames=("n", "N", "decay"))
def etsc_kernel(b, n, N=None, decay=None):
    """t_i = Re sum_k b_k gamma^i omega^{ik}, omega = exp(2 pi i/N), i < n.

    b (h,) or (h, d): full ETSC coefficients (h = N - 1, the default N) or the
    half-state ones of ``etsc(..., half=True)`` (h = floor(N/2)). The sum over k
    is an inverse DFT: every phase comes from the integer ik mod N. As in
    `etsc`, the constant part (b_k = c omega^k, c = -mean) is taken out in
    closed form before the FFT, so the spike at lag N-1 does not swamp the
    rounding. Periodic with period N, times gamma^i. No input checks (it is
    called inside jitted layers); `ssm_to_toeplitz` is the checked entry point.
    Compiled once per shape, n, N and decay (static: they fix the shapes and
    the float64 constants).
    """
    b2 = b if b.ndim == 2 else b[:, None]
    h = b2.shape[0]
    N = h + 1 if N is None else N
    w = roots_of_unity(N, b2.dtype)[:, None]
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
        out = out * decay_powers(decay, n, out.dtype)[:, None]
    return out if b.ndim == 2 else out[:, 0]


def ssm_to_toeplitz_naive(lambd, b, n):
    """The same kernel with the powers lambd^i taken literally (jnp.power):
    the textbook Vandermonde evaluation, whose float32 error grows with i.
    lambd (h,), b (h,) or (h, d); returns (n,) or (n, d)."""
    lambd, b = checks.diagonal_ssm(lambd, b)
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


@functools.partial(jax.jit, static_argnames=("steps", "fixed"))
def _adam_fit(params, t2, lr, steps, fixed=()):
    """`steps` Adam steps on `_gradient_loss`, one compiled scan; the parameters
    named in `fixed` keep their starting values. Defined once at module level, so
    a second call with the same shapes reuses the compiled program (a benchmark
    can warm it up and time the fit alone)."""
    tx = optax.multi_transform({"fit": optax.adam(lr), "fixed": optax.set_to_zero()},
                               {name: "fixed" if name in fixed else "fit" for name in params})
    scale = jnp.sum(t2 ** 2) + jnp.finfo(t2.dtype).tiny

    def body(carry, _):
        p, s = carry
        value, g = jax.value_and_grad(_gradient_loss)(p, t2, scale)
        updates, s = tx.update(g, s, p)
        return (optax.apply_updates(p, updates), s), value

    (params, _), losses = jax.lax.scan(body, (params, tx.init(params)), None, length=steps)
    return params, losses


def fit_toeplitz_gradient(t, h, steps=1000, lr=1e-2, seed=0, init=None, fixed=()):
    """The gradient baseline (Algorithm 2 of ETSC): fit lambd, b by Adam.

    Per channel, lambd = sigmoid(r) exp(i theta) and b = b_re + i b_im with
    r, theta, b_re, b_im ~ N(0, 1), minimising sum_i |t_i - sum_k b_k lambd_k^i|^2
    (scaled by sum t^2). `init` (optional) maps some of the names "r", "theta",
    "b_re", "b_im" to starting values of shape (h,) or (h, d), which replace the
    random draws (to study where the fit starts); the names in `fixed` keep
    their starting values throughout (`fixed=("r", "theta")`: b alone is fitted,
    lambd held where `init` puts it). Returns (lambd, b, losses):
    lambd and b of shape (h,) or (h, d) (one set per channel), losses (steps,)
    the relative squared error.
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
    for name, value in checks.fit_init(init, params, h, d).items():
        params[name] = jnp.broadcast_to(jnp.asarray(value, t.dtype).reshape(h, -1), (h, d))
    fixed = tuple(sorted(checks.fit_fixed(fixed, params)))
    params, losses = _adam_fit(params, t2, jnp.asarray(lr, t.dtype), steps, fixed)
    lambd = jax.nn.sigmoid(params["r"]) * jnp.exp(1j * params["theta"])
    b = params["b_re"] + 1j * params["b_im"]
    if squeeze:
        lambd, b = lambd[:, 0], b[:, 0]
    return lambd, b, losses
