"""The state space model, its discretization, and its two views.

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
from ._types import Array, Inexact, Num, Scalar

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
    "example_force_jumps",
    "reference_solution",
    "memory_ratio",
]


def random_SSM(rng, N):
    """A random stable SSM: A (N, N), B (N, 1), C (1, N).

    A = S - (I + F F^T) / 2 with S skew-symmetric (S = G - G^T) and G, F
    standard normal / sqrt(N). Its symmetric part -(I + F F^T) / 2 is negative
    definite, so every eigenvalue of A has real part <= -1/2: the continuous
    system is stable, and so is its bilinear discretization at every step size.
    B and C are uniform on [0, 1).
    """
    N = checks.positive_int(N, "N")
    g_r, f_r, b_r, c_r = jax.random.split(rng, 4)
    G = jax.random.normal(g_r, (N, N)) / jnp.sqrt(N)
    F = jax.random.normal(f_r, (N, N)) / jnp.sqrt(N)
    A = (G - G.T) - 0.5 * (jnp.eye(N) + F @ F.T)
    B = jax.random.uniform(b_r, (N, 1))
    C = jax.random.uniform(c_r, (1, N))
    return A, B, C


def discretize(
    A: Num[Array, "N N"], B: Num[Array, "N 1"], C: Num[Array, "1 N"], dt: Scalar
) -> tuple[Inexact[Array, "N N"], Inexact[Array, "N 1"], Num[Array, "1 N"]]:
    """Bilinear (trapezoid / Tustin) discretization with step size Δ (`dt`)."""
    A, B, C = checks.ssm(A, B, C, dt=dt)
    I = jnp.eye(A.shape[0])
    BL = jnp.linalg.inv(I - (dt / 2.0) * A)
    Ab = BL @ (I + (dt / 2.0) * A)
    Bb = (BL * dt) @ B
    return Ab, Bb, C


def scan_SSM(
    Ab: Num[Array, "N N"], Bb: Num[Array, "N 1"], Cb: Num[Array, "1 N"],
    u: Num[Array, "L 1"], x0: Num[Array, "N"],
) -> tuple[Num[Array, "N"], Num[Array, "L 1"]]:
    """Run the recurrence x_k = Ab x_{k-1} + Bb u_k, y_k = Cb x_k.

    u has shape (L, 1), the inputs u_0 .. u_{L-1}, and x0 shape (N,) is the state
    before the first input (x_{-1} in the convolution's derivation). Returns (x_{L-1}, y): the
    last state and the outputs y_0 .. y_{L-1}, shape (L, 1).
    """
    Ab, Bb, Cb, u, x0 = checks.recurrence(Ab, Bb, Cb, u, x0)

    def step(x_k_1, u_k):
        x_k = Ab @ x_k_1 + Bb @ u_k
        y_k = Cb @ x_k
        return x_k, y_k

    return jax.lax.scan(step, x0, u)


def run_SSM(A, B, C, u):
    """Discretize with step 1/L and run the recurrence from a zero state.

    u has shape (L,); the output y has shape (L, 1).
    """
    u = checks.array(u, "u", ndim=1)
    L = u.shape[0]
    N = jnp.asarray(A).shape[0]
    Ab, Bb, Cb = discretize(A, B, C, dt=1.0 / L)
    return scan_SSM(Ab, Bb, Cb, u[:, None], jnp.zeros((N,)))[1]


def K_conv(
    Ab: Num[Array, "N N"], Bb: Num[Array, "N 1"], Cb: Num[Array, "1 N"], L: int
) -> Num[Array, "L"]:
    """The SSM convolution kernel K = (Cb Bb, Cb Ab Bb, ..., Cb Ab^(L-1) Bb), (L,).

    Computed the naive way, by applying Ab over and over: v_0 = Bb,
    v_(l+1) = Ab v_l, K_l = Cb v_l. That is O(N^2 L) work in a sequential
    loop, and it inherits every rounding error of the powers Ab^l: the
    computation S4 replaces.
    """
    Ab, Bb, Cb = checks.ssm(Ab, Bb, Cb, L=L)

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
        u_f, K_f = jnp.fft.rfft(u, n=2 * L), jnp.fft.rfft(K, n=2 * L)
        y = jnp.fft.irfft(u_f * K_f, n=2 * L)[..., :L]
    return jnp.moveaxis(y, -1, axis)


# --------------------------------------------------------------------------
# The mass-spring example
# --------------------------------------------------------------------------
def example_mass(k, b, m):
    """The 2-state SSM of m y'' = u - b y' - k y, state x = (position, velocity)."""
    checks.number(m, "m", low=0, low_open=True)
    A = jnp.array([[0.0, 1.0], [-k / m, -b / m]])
    B = jnp.array([[0.0], [1.0 / m]])
    C = jnp.array([[1.0, 0.0]])
    return A, B, C


@jax.jit
def example_force(t):
    """A thresholded sine: sin(10 t) where it exceeds 0.5, zero elsewhere.

    The force switches on and off with a jump (from 0 to 0.5), which matters
    for how fast the discretization converges.
    """
    x = jnp.sin(10 * t)
    return x * (x > 0.5)


def example_ssm(L=200, T=5.0, k=40.0, b=5.0, m=1.0):
    """Simulate the mass for T time units in L steps of size T/L.

    Returns (t, u, y): the sample times t_k = k T / L (k = 1..L), the force
    u_k = example_force(t_k) and the position y_k of the discrete SSM.
    """
    L = checks.positive_int(L, "L")
    T = checks.number(T, "T", low=0, low_open=True)
    A, B, C = example_mass(k=k, b=b, m=m)
    Ab, Bb, Cb = discretize(A, B, C, dt=T / L)
    t = jnp.arange(1, L + 1) * (T / L)
    u = example_force(t)
    _, y = scan_SSM(Ab, Bb, Cb, u[:, None], jnp.zeros((2,)))
    return t, u, y[:, 0]


def example_force_jumps(T=5.0):
    """The times in (0, T) where `example_force` jumps, in increasing order.

    sin(10 t) crosses 1/2 upwards at t = (pi/6 + 2 pi j) / 10 and downwards at
    t = (5 pi/6 + 2 pi j) / 10, for j = 0, 1, 2, ...
    """
    T = checks.number(T, "T", low=0, low_open=True)
    j = np.arange(int(np.ceil(10 * T / (2 * np.pi))) + 1)
    up, down = (np.pi / 6 + 2 * np.pi * j) / 10, (5 * np.pi / 6 + 2 * np.pi * j) / 10
    t = np.concatenate([up, down])
    return np.sort(t[(t > 0) & (t < T)])


def reference_solution(A, B, C, force, t, breaks=(), rtol=1e-11, atol=1e-13):
    """An accurate y(t) of the continuous SSM x' = A x + B u(t), x(0) = 0, y = C x.

    For checking discretizations: SciPy's 8th-order Dormand-Prince (DOP853)
    integrates in float64 from one break of the force to the next, so that no
    step straddles a jump of u (an adaptive method stumbles on jumps). `force`
    maps a time to u(t); `t` holds the times, in [0, max(t)], at which to
    return y; `breaks` the times where u jumps. Returns y(t), shape t.shape.
    """
    from scipy.integrate import solve_ivp

    checks.ssm(np.asarray(A), np.asarray(B), np.asarray(C))  # shapes; float64 below
    checks.array(np.asarray(t), "t", ndim=1, kind="real")
    A, B, C, t = (np.asarray(M, dtype=np.float64) for M in (A, B, C, t))
    if t.size and t.min() < 0:
        raise ValueError(f"t must hold times >= 0, got min(t) = {t.min()}")
    end = float(t.max()) if t.size else 0.0
    if end == 0:  # no time has passed: the state is still zero
        return np.zeros_like(t)
    edges = [0.0, *sorted(float(b) for b in breaks if 0 < b < end), end]
    x, pieces = np.zeros(A.shape[0]), []
    for a, z in zip(edges[:-1], edges[1:]):
        sol = solve_ivp(lambda s, x: A @ x + B[:, 0] * force(s), (a, z), x,
                        method="DOP853", rtol=rtol, atol=atol, dense_output=True)
        pieces.append(sol.sol)
        x = sol.y[:, -1]
    piece = np.clip(np.searchsorted(edges, t, side="left") - 1, 0, len(pieces) - 1)
    y = np.empty_like(t)
    for p in np.unique(piece):  # each piece's interpolant, at all its times at once
        y[piece == p] = C[0] @ pieces[p](t[piece == p])
    return y


# --------------------------------------------------------------------------
# How long a discrete SSM remembers
# --------------------------------------------------------------------------
def memory_ratio(A, B, dt, lengths):
    """How much of the first input the state still holds when the L-th arrives.

    For each L in `lengths`: ||Ab^(L-1) Bb||^2 / ||Bb||^2, with (Ab, Bb) the
    bilinear discretisation of `discretize` at step size `dt`. Bb is the state that
    an impulse u_0 = 1 leaves, Ab^(L-1) Bb what is left of it L - 1 steps
    later; below 1 the state forgets, above 1 it amplifies. A (N, N) and
    B (N, 1), real or complex. NumPy in float64: a diagnostic of an
    initialisation, and ratios far below float32's smallest number stay exact.
    """
    checks.array(A, "A", ndim=2), checks.array(B, "B", shape=(np.shape(A)[0], 1))
    dt = checks.positive(dt, "dt")
    A, B = np.asarray(A, dtype=np.complex128), np.asarray(B, dtype=np.complex128)
    I = np.eye(A.shape[0])
    BL = np.linalg.inv(I - (dt / 2.0) * A)
    Ab, Bb = BL @ (I + (dt / 2.0) * A), (BL * dt) @ B
    left = [np.linalg.matrix_power(Ab, checks.positive_int(L, "L") - 1) @ Bb for L in lengths]
    return np.array([np.vdot(x, x).real for x in left]) / np.vdot(Bb, Bb).real
