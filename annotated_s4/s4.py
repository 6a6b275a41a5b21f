"""S4: the structured SSM kernel.

The diagonal case (S4D) comes first in the file because everything else
reduces to it: for a diagonal state matrix diag(Lambda) the kernel is a
Vandermonde product, computed in O(N L) without any matrix powers.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from .ssm import K_conv, _check_length, _check_ssm

__all__ = [
    "discretize_diagonal",
    "kernel_diagonal",
    "s4d_lin_init",
    "s4d_inv_init",
    "K_gen_simple",
    "conv_from_gen",
    "K_gen_inverse",
    "cauchy",
    "kernel_DPLR",
    "discrete_DPLR",
]


def _check_diagonal(Lambda, B, C):
    Lambda, B, C = jnp.asarray(Lambda), jnp.asarray(B), jnp.asarray(C)
    if Lambda.ndim != 1:
        raise ValueError(f"Lambda must be a 1-D vector of N eigenvalues, got {Lambda.shape}")
    N = Lambda.shape[0]
    if B.shape != (N,) or C.shape != (N,):
        raise ValueError(
            f"B and C must have shape (N,) = ({N},), got {B.shape} and {C.shape}"
        )
    return Lambda, B, C


def _check_step(step):
    """step must be positive (checked when it is a concrete value, not under jit)."""
    if isinstance(step, jax.core.Tracer):
        return step
    a = np.asarray(step)
    if not (np.issubdtype(a.dtype, np.floating) or np.issubdtype(a.dtype, np.integer)):
        raise TypeError(f"step must be a real number or array, got dtype {a.dtype}")
    if not np.all(a > 0):
        raise ValueError(f"step must be positive, got {step}")
    return step


def discretize_diagonal(Lambda, B, step):
    """Zero-order-hold discretization of x' = diag(Lambda) x + B u.

    Returns (Lambda_bar, B_bar) = (exp(step Lambda), (exp(step Lambda) - 1) / Lambda * B),
    so that x_k = Lambda_bar * x_{k-1} + B_bar u_k, elementwise. Lambda and B
    have the same shape ((N,), or (H, N) for H channels); step is positive and
    broadcasts against them (a scalar, or (H, 1)).
    """
    Lambda, B = jnp.asarray(Lambda), jnp.asarray(B)
    if Lambda.ndim < 1 or B.shape != Lambda.shape:
        raise ValueError(f"Lambda and B must have the same shape (..., N), got "
                         f"{Lambda.shape} and {B.shape}")
    step = _check_step(step)
    if jnp.ndim(step) > Lambda.ndim or jnp.broadcast_shapes(jnp.shape(step), Lambda.shape) != Lambda.shape:
        raise ValueError(f"step of shape {jnp.shape(step)} does not broadcast against "
                         f"Lambda of shape {Lambda.shape}")
    dtL = step * Lambda
    Lambda_bar = jnp.exp(dtL)
    return Lambda_bar, (Lambda_bar - 1.0) / Lambda * B


def kernel_diagonal(Lambda, B, C, step, L):
    """The kernel K_l = Re sum_n C_n B_bar_n Lambda_bar_n^l of a diagonal SSM, shape (L,).

    A Vandermonde matrix-vector product: exp(step * Lambda * l) for every
    (n, l), contracted with C * B_bar. Complex in, real out (the pairs of
    conjugate eigenvalues this stands for are folded into the factor 2 the
    caller puts in C, or into taking the real part as here).
    """
    Lambda, B, C = _check_diagonal(Lambda, B, C)
    L = _check_length(L)
    if jnp.ndim(step) != 0:
        raise ValueError(f"step must be a scalar, got shape {jnp.shape(step)}")
    _, B_bar = discretize_diagonal(Lambda, B, step)
    V = jnp.exp((step * Lambda)[:, None] * jnp.arange(L)[None, :])  # (N, L)
    return jnp.einsum("n,nl->l", C * B_bar, V).real


def s4d_lin_init(N):
    """S4D-Lin: Lambda_n = -1/2 + i pi n, n = 0 .. N/2 - 1 (N/2 conjugate-pair modes)."""
    N = _check_even_N(N)
    n = np.arange(N // 2)
    return jnp.asarray(-0.5 + 1j * np.pi * n, dtype=_complex_dtype())


def s4d_inv_init(N):
    """S4D-Inv: Lambda_n = -1/2 + i (N/pi) (N/(2n+1) - 1), n = 0 .. N/2 - 1.

    The imaginary parts follow an inverse law, approximating the spectrum of
    the HiPPO-LegS matrix's diagonal part (S4D paper, section 4).
    """
    N = _check_even_N(N)
    n = np.arange(N // 2)
    return jnp.asarray(-0.5 + 1j * (N / np.pi) * (N / (2 * n + 1) - 1), dtype=_complex_dtype())


def _complex_dtype():
    """complex64, or complex128 under `jax_enable_x64` (JAX's default complex dtype)."""
    return jax.dtypes.canonicalize_dtype(jnp.complex128)


def _check_even_N(N):
    N = _check_length(N, "N")
    if N % 2:
        raise ValueError(f"N must be even (N/2 conjugate pairs), got {N}")
    return N


# --------------------------------------------------------------------------
# From matrix powers to a generating function (S4, section 3)
# --------------------------------------------------------------------------
def K_gen_simple(Ab, Bb, Cb, L):
    """The truncated generating function z -> sum_{l<L} K_l z^l of the SSM kernel.

    Built from the naive kernel: only a stepping stone to check the next ones.
    """
    K = K_conv(Ab, Bb, Cb, L)

    def gen(z):
        return jnp.sum(K * (z ** jnp.arange(L)))

    return gen


def conv_from_gen(gen, L):
    """Recover the kernel (length L, real) from its generating function.

    Evaluating gen at the L roots of unity omega^k = exp(-2 pi i k / L) is a
    discrete Fourier transform of K, so an inverse FFT gives K back.
    """
    if not callable(gen):
        raise TypeError(f"gen must be a function z -> K_hat(z), got {type(gen).__name__}")
    L = _check_length(L)
    Omega_L = jnp.exp((-2j * jnp.pi) * (jnp.arange(L) / L))
    atRoots = jax.vmap(gen)(Omega_L)
    return jnp.fft.ifft(atRoots, L).reshape(L).real


def K_gen_inverse(Ab, Bb, Cb, L):
    """The truncated generating function with the power series summed:

        sum_{l<L} Cb Ab^l Bb z^l = Cb (I - Ab^L z^L) (I - Ab z)^{-1} Bb
                                 = C~ (I - Ab z)^{-1} Bb   at roots of unity (z^L = 1),

    with C~ = Cb (I - Ab^L). One Ab^L, then one N x N solve per root.
    """
    Ab, Bb, Cb = _check_ssm(Ab, Bb, Cb)
    L = _check_length(L)
    I = jnp.eye(Ab.shape[0])
    Ab_L = jnp.linalg.matrix_power(Ab, L)
    Ct = Cb @ (I - Ab_L)
    return lambda z: (Ct @ jnp.linalg.solve(I - Ab * z, Bb)).reshape()


# --------------------------------------------------------------------------
# Diagonal plus low rank: Cauchy kernels and the Woodbury identity
# --------------------------------------------------------------------------
def cauchy(v, omega, lambd):
    """The Cauchy matrix-vector product k(omega_j) = sum_n v_n / (omega_j - lambd_n).

    lambd has shape (N,), omega shape (M,); v has shape (N,), giving k of
    shape (M,), or (K, N) for K vectors at once, giving (K, M). The Cauchy
    matrix 1 / (omega_j - lambd_n) is built once and shared by the K vectors:
    O(M N) time and memory.
    """
    v, omega, lambd = jnp.asarray(v), jnp.asarray(omega), jnp.asarray(lambd)
    if lambd.ndim != 1:
        raise ValueError(f"lambd must be 1-D of shape (N,), got {lambd.shape}")
    if v.ndim not in (1, 2) or v.shape[-1] != lambd.shape[0]:
        raise ValueError(
            f"v must have shape (N,) or (K, N) with N = {lambd.shape[0]}, got {v.shape}"
        )
    if omega.ndim != 1:
        raise ValueError(f"omega must be 1-D of shape (M,), got {omega.shape}")
    cauchy_matrix = 1.0 / (omega[:, None] - lambd[None, :])  # (M, N)
    return v @ cauchy_matrix.T


def _check_dplr(Lambda, P, Q, B, C, step):
    arrs = [jnp.asarray(a) for a in (Lambda, P, Q, B, C)]
    if arrs[0].ndim != 1:
        raise ValueError(f"Lambda must be 1-D of shape (N,), got {arrs[0].shape}")
    N = arrs[0].shape[0]
    for name, a in zip("PQBC", arrs[1:]):
        if a.shape != (N,):
            raise ValueError(f"{name} must have shape (N,) = ({N},), got {a.shape}")
    _check_step(step)
    return arrs


def kernel_DPLR(Lambda, P, Q, B, C, step, L):
    """The S4 convolution kernel of A = diag(Lambda) - P Q^*, shape (L,), real.

    C is C~ = C (I - Ab^L), the S4 parameterisation. With the bilinear
    discretisation, at a root of unity z the generating function is

        (2 / (1 + z)) C~ (g(z) - A)^{-1} B,    g(z) = (2 / step) (1 - z) / (1 + z),

    and Woodbury turns the resolvent of a DPLR matrix into four Cauchy kernels:

        C~ R B - C~ R P (1 + Q^* R P)^{-1} Q^* R B,   R = (g - diag(Lambda))^{-1}.

    O(N L) work, no matrix powers, no inverses; an inverse FFT gives K.
    """
    Lambda, P, Q, B, C = _check_dplr(Lambda, P, Q, B, C, step)
    L = _check_length(L)
    Omega_L = jnp.exp((-2j * jnp.pi) * (jnp.arange(L) / L))
    aterm = (C.conj(), Q.conj())
    bterm = (B, P)
    g = (2.0 / step) * ((1.0 - Omega_L) / (1.0 + Omega_L))
    c = 2.0 / (1.0 + Omega_L)
    # the four Cauchy kernels share their poles Lambda: one Cauchy matrix
    v = jnp.stack([aterm[0] * bterm[0], aterm[0] * bterm[1],
                   aterm[1] * bterm[0], aterm[1] * bterm[1]])
    k00, k01, k10, k11 = cauchy(v, g, Lambda)
    atRoots = c * (k00 - k01 * (1.0 / (1.0 + k11)) * k10)
    return jnp.fft.ifft(atRoots, L).reshape(L).real


def discrete_DPLR(Lambda, P, Q, B, C, step, L):
    """The bilinear discretisation of a DPLR SSM, for the RNN mode.

    Returns (Ab, Bb, Cb) with shapes (N, N), (N, 1), (1, N), complex, such that
    K_conv(Ab, Bb, Cb, L).real == kernel_DPLR(Lambda, P, Q, B, C, step, L).

    Ab = A1 A0 and Bb = 2 A1 B with A0 = (2/step) I + A and
    A1 = ((2/step) I - A)^{-1} = D - D P (1 + Q^* D P)^{-1} Q^* D, where
    D = diag(1 / (2/step - Lambda)) (Woodbury again: no dense inverse).
    Since the kernel was written with C~ = C (I - Ab^L) (and uses its
    conjugate, see kernel_DPLR), the recurrence needs Cb = C~^* (I - Ab^L)^{-1}:
    one N x N solve, done once.
    """
    Lambda, P, Q, B, C = _check_dplr(Lambda, P, Q, B, C, step)
    L = _check_length(L)
    N = Lambda.shape[0]
    A = jnp.diag(Lambda) - P[:, None] @ Q[:, None].conj().T
    I = jnp.eye(N)
    A0 = (2.0 / step) * I + A
    d = 1.0 / ((2.0 / step) - Lambda)  # the diagonal of D
    Qc = Q.conj()
    DP = d * P
    QcD = Qc * d
    A1 = jnp.diag(d) - (DP[:, None] / (1.0 + QcD @ P)) @ QcD[None, :]
    Ab = A1 @ A0
    Bb = 2.0 * A1 @ B[:, None]
    # The kernel uses C~^* (conjugated C~, see kernel_DPLR), so the unrolled
    # recurrence needs Cb = C~^* (I - Ab^L)^{-1}: solve (I - Ab^L)^T Cb^T = conj(C~).
    Ab_L = jnp.linalg.matrix_power(Ab, L)
    Cb = jnp.linalg.solve((I - Ab_L).T, C.conj()[:, None]).T
    return Ab, Bb, Cb
