"""Part I: the state space model, its discretization, and its two views.

A continuous SSM maps a 1-D input u(t) to an output y(t) through an
N-dimensional state x(t):

    x'(t) = A x(t) + B u(t)
    y(t)  = C x(t)            (+ D u(t), a skip connection kept outside)

Discretized with a step Delta it becomes a linear recurrence (an RNN), and
unrolled it becomes a convolution with the kernel K (a CNN). Everything here
is a pure function of arrays.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from . import _checks as checks

__all__ = [
    "random_SSM",
    "discretize",
    "scan_SSM",
    "run_SSM",
    "K_conv",
    "causal_convolution",
    "example_mass",
    "example_force",
    "example_ssm",
]


# --------------------------------------------------------------------------
# Checks at the boundary. Inside the functions the data is trusted.
# --------------------------------------------------------------------------
def _check_ssm(A, B, C):
    A, B, C = jnp.asarray(A), jnp.asarray(B), jnp.asarray(C)
    if A.ndim != 2 or A.shape[0] != A.shape[1]:
        raise ValueError(f"A must be a square (N, N) matrix, got shape {A.shape}")
    N = A.shape[0]
    if B.shape != (N, 1):
        raise ValueError(f"B must have shape (N, 1) = ({N}, 1), got {B.shape}")
    if C.shape != (1, N):
        raise ValueError(f"C must have shape (1, N) = (1, {N}), got {C.shape}")
    return A, B, C


def _check_length(L, name="L"):
    if isinstance(L, bool) or not isinstance(L, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(L).__name__}")
    if L < 1:
        raise ValueError(f"{name} must be a positive length, got {L}")
    return int(L)


def random_SSM(rng, N):
    """A random (A, B, C) with shapes (N, N), (N, 1), (1, N)."""
    N = _check_length(N, "N")
    a_r, b_r, c_r = jax.random.split(rng, 3)
    A = jax.random.uniform(a_r, (N, N))
    B = jax.random.uniform(b_r, (N, 1))
    C = jax.random.uniform(c_r, (1, N))
    return A, B, C


def discretize(A, B, C, step):
    """Bilinear (trapezoid / Tustin) discretization with step size `step`."""
    A, B, C = _check_ssm(A, B, C)
    if not isinstance(step, jax.core.Tracer) and not np.all(np.asarray(step) > 0):
        raise ValueError(f"step must be positive, got {step}")
    I = jnp.eye(A.shape[0])
    BL = jnp.linalg.inv(I - (step / 2.0) * A)
    Ab = BL @ (I + (step / 2.0) * A)
    Bb = (BL * step) @ B
    return Ab, Bb, C


def scan_SSM(Ab, Bb, Cb, u, x0):
    """Run the recurrence x_k = Ab x_{k-1} + Bb u_k, y_k = Cb x_k.

    u has shape (L, 1) and x0 shape (N,). Returns (x_L, y) with y of shape (L, 1).
    """
    Ab, Bb, Cb = _check_ssm(Ab, Bb, Cb)
    u, x0 = jnp.asarray(u), jnp.asarray(x0)
    if u.ndim != 2 or u.shape[1] != 1:
        raise ValueError(f"u must have shape (L, 1), got {u.shape}")
    if x0.shape != (Ab.shape[0],):
        raise ValueError(f"x0 must have shape (N,) = ({Ab.shape[0]},), got {x0.shape}")

    def step(x_k_1, u_k):
        x_k = Ab @ x_k_1 + Bb @ u_k
        y_k = Cb @ x_k
        return x_k, y_k

    return jax.lax.scan(step, x0, u)


def run_SSM(A, B, C, u):
    """Discretize with step 1/L and run the recurrence from a zero state.

    u has shape (L,); the output y has shape (L, 1).
    """
    u = jnp.asarray(u)
    if u.ndim != 1:
        raise ValueError(f"u must be a 1-D sequence of shape (L,), got {u.shape}")
    L = u.shape[0]
    N = jnp.asarray(A).shape[0]
    Ab, Bb, Cb = discretize(A, B, C, step=1.0 / L)
    return scan_SSM(Ab, Bb, Cb, u[:, None], jnp.zeros((N,)))[1]


def K_conv(Ab, Bb, Cb, L):
    """The SSM convolution kernel K = (Cb Bb, Cb Ab Bb, ..., Cb Ab^(L-1) Bb), shape (L,).

    Computed the naive way, by applying Ab over and over: v_0 = Bb,
    v_(l+1) = Ab v_l, K_l = Cb v_l. That is O(N^2 L) work in a sequential
    loop, and it inherits every rounding error of the powers Ab^l: the
    computation S4 replaces.
    """
    Ab, Bb, Cb = _check_ssm(Ab, Bb, Cb)
    L = _check_length(L)

    def power(v, _):  # v = Ab^l Bb
        return Ab @ v, (Cb @ v).reshape()

    return jax.lax.scan(power, Bb, None, length=L)[1]


def causal_convolution(u, K, axis=0, nofft=False):
    """y_k = sum_{j<=k} K_j u_{k-j} along `axis` of u, for every channel at once.

    u has its time axis (length L) at `axis`; K (..., L) holds the kernels, its
    leading axes broadcast against u's other axes (u (L,) and K (L,) for one
    signal; u (batch, L, H) with axis=1 and K (H, L) for a layer). By FFT, both
    signals zero-padded to 2L so that the circular convolution the FFT computes
    equals the causal one on the first L outputs: O(L log L). With nofft=True,
    a product with the lower-triangular Toeplitz matrix T[k, j] = K_{k-j}: O(L^2).
    """
    u = jnp.moveaxis(checks.array(u, "u", kind="real"), axis, -1)
    L = u.shape[-1]
    K = checks.kernel(K, L)
    if nofft:
        lag = jnp.arange(L)[:, None] - jnp.arange(L)[None, :]          # k - j
        T = jnp.where(lag >= 0, K[..., jnp.clip(lag, 0, L - 1)], 0.0)  # (..., L, L)
        y = (T @ u[..., None])[..., 0]
    else:
        y = jnp.fft.irfft(jnp.fft.rfft(u, n=2 * L) * jnp.fft.rfft(K, n=2 * L), n=2 * L)[..., :L]
    return jnp.moveaxis(y, -1, axis)


# --------------------------------------------------------------------------
# The mass-spring example
# --------------------------------------------------------------------------
def example_mass(k, b, m):
    """The 2-state SSM of m y'' = u - b y' - k y, state x = (position, velocity)."""
    if not m > 0:
        raise ValueError(f"mass m must be positive, got {m}")
    A = jnp.array([[0.0, 1.0], [-k / m, -b / m]])
    B = jnp.array([[0.0], [1.0 / m]])
    C = jnp.array([[1.0, 0.0]])
    return A, B, C


@jax.jit
def example_force(t):
    """A clipped, rectified sine: sin(10 t) where it exceeds 0.5, zero elsewhere.

    The force switches on and off with a jump (from 0 to 0.5), which matters
    for how fast the discretization converges (chapter 2).
    """
    x = jnp.sin(10 * t)
    return x * (x > 0.5)


def example_ssm(L=200, T=5.0, k=40.0, b=5.0, m=1.0):
    """Simulate the mass for T time units in L steps of size T/L.

    Returns (t, u, y): the sample times t_k = k T / L (k = 1..L), the force
    u_k = example_force(t_k) and the position y_k of the discrete SSM.
    """
    L = _check_length(L)
    if not T > 0:
        raise ValueError(f"T must be a positive duration, got {T}")
    A, B, C = example_mass(k=k, b=b, m=m)
    Ab, Bb, Cb = discretize(A, B, C, step=T / L)
    t = jnp.arange(1, L + 1) * (T / L)
    u = example_force(t)
    _, y = scan_SSM(Ab, Bb, Cb, u[:, None], jnp.zeros((2,)))
    return t, u, y[:, 0]
