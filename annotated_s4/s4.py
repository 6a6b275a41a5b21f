"""S4: the structured SSM kernel.

The diagonal case (S4D) comes first in the file because it is the simplest:
for a diagonal state matrix diag(Lambda) the kernel is a Vandermonde
product, computed in O(N L) without any matrix powers. The DPLR kernel of
S4 that follows reduces instead to Cauchy products.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from . import _checks as checks
from ._types import Array, Float, Inexact, Num, Real, Scalar
from .hippo import make_NPLR_HiPPO
from .ssm import K_conv, discretize

__all__ = [
    "discretize_diagonal",
    "kernel_diagonal",
    "vandermonde",
    "s4d_lin_init",
    "s4d_inv_init",
    "hippo_ssm",
    "K_diagonalised",
    "K_gen_simple",
    "conv_from_gen",
    "K_gen_inverse",
    "cauchy",
    "kernel_DPLR",
    "discrete_DPLR",
    "unfold_conj",
    "dplr_A0",
    "dplr_A1",
    "dplr_step",
    "dplr_rnn",
]


def discretize_diagonal(
    Lambda: Num[Array, "*H N"], B: Num[Array, "*H N"], dt: Scalar | Real[Array, "*#H #N"]
) -> tuple[Inexact[Array, "*H N"], Inexact[Array, "*H N"]]:
    """Zero-order-hold discretization of x' = diag(Lambda) x + B u.

    Returns (Lambda_bar, B_bar) = (exp(dt Lambda),
    (exp(dt Lambda) - 1) / Lambda * B),
    so that x_k = Lambda_bar * x_{k-1} + B_bar u_k, elementwise. Lambda and B
    have the same shape ((N,), or (H, N) for H channels); dt, the step size Δ,
    is positive and broadcasts against them (a scalar, or (H, 1)).
    """
    Lambda, B = jnp.asarray(Lambda), jnp.asarray(B)
    if Lambda.ndim < 1 or B.shape != Lambda.shape:
        raise ValueError(f"Lambda and B must have the same shape (..., N), got "
                         f"{Lambda.shape} and {B.shape}")
    dt = checks.positive(dt, "dt")
    if jnp.ndim(dt) > Lambda.ndim or jnp.broadcast_shapes(jnp.shape(dt), Lambda.shape) != Lambda.shape:
        raise ValueError(f"dt of shape {jnp.shape(dt)} does not broadcast against "
                         f"Lambda of shape {Lambda.shape}")
    dtL = dt * Lambda
    Lambda_bar = jnp.exp(dtL)
    return Lambda_bar, (Lambda_bar - 1.0) / Lambda * B


def kernel_diagonal(Lambda, B, C, dt, L, conj=False):
    """The kernel K_l = Re sum_n C_n B_bar_n Lambda_bar_n^l of a diagonal SSM
    discretised by a zero-order hold, shape (L,).

    A Vandermonde matrix-vector product: exp(dt * Lambda * l) for every
    (n, l), contracted with C * B_bar. Complex in, real out.
    conj=True: the N stored modes stand for N conjugate pairs (as in
    `kernel_DPLR`), and each partner adds the complex conjugate of its mode's
    term, so K_l = 2 Re sum_n C_n B_bar_n Lambda_bar_n^l.
    """
    Lambda, B, C = checks.diagonal(Lambda, B, C, dt=dt, L=L)
    _, B_bar = discretize_diagonal(Lambda, B, dt)
    V = jnp.exp((dt * Lambda)[:, None] * jnp.arange(L)[None, :])  # (N, L)
    K = jnp.einsum("n,nl->l", C * B_bar, V).real
    return 2.0 * K if conj else K


def vandermonde(
    W: Num[Array, "*#batch #N"], log_z: Num[Array, "*#batch #N"], L: int
) -> Float[Array, "*batch L"]:
    """Re sum_n W[..., n] z_n^l for l = 0 .. L-1 with z = exp(log_z); shape (..., L).

    The Vandermonde product behind every diagonal-SSM kernel, without the
    (..., N, L) matrix of powers. Split l = b T + j with T = ceil(sqrt L) and
    0 <= j < T. Since z^l = z^(bT) z^j, the kernel laid out as a (blocks, T)
    table is one matrix product per channel,

        K[b, j] = Re sum_n (W_n z_n^(bT)) z_n^j,

    of a (blocks, N) by an (N, T) matrix, and Re(w v) = w_r v_r - w_i v_i
    makes it one real product of inner size 2N. Only the 2 N sqrt(L) powers
    z^j and z^(bT) are evaluated, each from its exact exponent,
    z^k = exp(k Re log_z) (cos(k Im log_z) + i sin(k Im log_z)), in real
    arithmetic. W and log_z broadcast against each other. The gradient is
    two more Vandermonde sums (`_vandermonde_bwd`).
    """
    W, log_z = checks.modes(W, log_z, L)
    shape = jnp.broadcast_shapes(W.shape, log_z.shape)
    ctype = jnp.result_type(W.dtype, log_z.dtype, jnp.complex64)
    return _vandermonde(jnp.broadcast_to(W, shape).astype(ctype),
                        jnp.broadcast_to(log_z, shape).astype(ctype), L)


def _block_powers(log_z, L):
    """T, the number of blocks, and Re, Im of z^j (j < T) and of z^(bT), each (..., N, .)."""
    T = math.isqrt(L - 1) + 1                                         # block length
    blocks = -(-L // T)

    def power(k):  # Re and Im of z^k for the integers k, each (..., N, len(k))
        size, angle = jnp.exp(log_z.real[..., None] * k), log_z.imag[..., None] * k
        return size * jnp.cos(angle), size * jnp.sin(angle)

    return T, blocks, power(jnp.arange(T)), power(T * jnp.arange(blocks))


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _vandermonde(W, log_z, L):
    """The blocked product of `vandermonde` (W and log_z complex, of one shape)."""
    T, blocks, (v_re, v_im), (p_re, p_im) = _block_powers(log_z, L)  # z^j, z^(bT)
    W_re, W_im = jnp.real(W)[..., None], jnp.imag(W)[..., None]
    w = jnp.concatenate([W_re * p_re - W_im * p_im,                   # Re(W z^(bT))
                         -(W_re * p_im + W_im * p_re)], axis=-2)      # -Im(W z^(bT))
    v = jnp.concatenate([v_re, v_im], axis=-2)                        # (..., 2N, T)
    K = jnp.einsum("...nb,...nj->...bj", w, v, precision=jax.lax.Precision.HIGHEST)
    return K.reshape(*K.shape[:-2], blocks * T)[..., :L]


def _vandermonde_fwd(W, log_z, L):
    return _vandermonde(W, log_z, L), (W, log_z)


def _vandermonde_bwd(L, residuals, g):
    """The gradient of K_l = Re sum_n W_n z_n^l for a cotangent g (..., L).

    With W = W_r + i W_i and log_z = a + i theta, dK_l/dW_r = Re z^l,
    dK_l/dW_i = -Im z^l, dK_l/da = Re(l W z^l), dK_l/dtheta = -Im(l W z^l).
    In JAX's convention a complex input's cotangent is d/d(real part) minus
    i d/d(imaginary part), so both collapse to Vandermonde sums of g itself:

        dW = S_1 = sum_l g_l z^l,      dlog_z = W S_2,   S_2 = sum_l l g_l z^l,

    computed blockwise like the forward product, from the same powers:
    S = sum_b z^(bT) sum_j c[bT + j] z^j. Only W and log_z are kept from the
    forward pass; nothing of size L x N is stored or rematerialised.
    """
    W, log_z = residuals
    T, blocks, (v_re, v_im), (p_re, p_im) = _block_powers(log_z, L)
    g = jnp.pad(g, [(0, 0)] * (g.ndim - 1) + [(0, blocks * T - L)])
    c = jnp.stack([g, g * jnp.arange(blocks * T, dtype=g.dtype)], axis=-2)
    c = c.reshape(*c.shape[:-1], blocks, T)                           # (..., 2, blocks, T)
    hi = jax.lax.Precision.HIGHEST
    M_re = jnp.einsum("...nj,...sbj->...snb", v_re, c, precision=hi)  # sum_j c z^j
    M_im = jnp.einsum("...nj,...sbj->...snb", v_im, c, precision=hi)
    S = (jnp.sum(M_re * p_re[..., None, :, :] - M_im * p_im[..., None, :, :], axis=-1)
         + 1j * jnp.sum(M_re * p_im[..., None, :, :] + M_im * p_re[..., None, :, :], axis=-1))
    return S[..., 0, :].astype(W.dtype), (W * S[..., 1, :]).astype(log_z.dtype)


_vandermonde.defvjp(_vandermonde_fwd, _vandermonde_bwd)


def s4d_lin_init(N):
    """S4D-Lin: Lambda_n = -1/2 + i pi n, n = 0 .. N/2 - 1 (N/2 conjugate pairs)."""
    N = checks.even_int(N, "N")
    n = np.arange(N // 2)
    return jnp.asarray(-0.5 + 1j * np.pi * n, dtype=_default_complex_dtype())


def s4d_inv_init(N):
    """S4D-Inv: Lambda_n = -1/2 + i (N/pi) (N/(2n+1) - 1), n = 0 .. N/2 - 1.

    The imaginary parts follow an inverse law, approximating those of the
    Lambda of HiPPO-LegS's DPLR form: the eigenvalues of its normal part
    S = A + P P^T (S4D-LegS), not the diagonal of A itself, which is the real
    -(n + 1) (S4D paper, section 4).
    """
    N = checks.even_int(N, "N")
    n = np.arange(N // 2)
    Lambda = -0.5 + 1j * (N / np.pi) * (N / (2 * n + 1) - 1)
    return jnp.asarray(Lambda, dtype=_default_complex_dtype())


def _default_complex_dtype():
    """complex64, or complex128 under `jax_enable_x64` (JAX's default complex dtype)."""
    return jax.dtypes.canonicalize_dtype(jnp.complex128)


# --------------------------------------------------------------------------
# From matrix powers to a generating function (S4, section 3)
# --------------------------------------------------------------------------
def _hippo_and_C(N, C):
    N = checks.positive_int(N, "N")
    C = np.asarray(C)
    if C.shape != (N,):
        raise ValueError(f"C must be a vector of N = {N} output weights, got shape {C.shape}")
    A, _, B = make_NPLR_HiPPO(N)
    return A, B, C


def hippo_ssm(N, C, dt, dtype=jnp.float64):
    """The HiPPO-LegS SSM (A and B of `make_NPLR_HiPPO`) with output weights C
    (N,), discretized with step size `dt`: (Ab, Bb, Cb) of shapes (N, N), (N, 1),
    (1, N), in `dtype` (float64 takes effect under `jax.enable_x64`)."""
    A, B, C = _hippo_and_C(N, C)
    return discretize(jnp.asarray(A, dtype), jnp.asarray(B, dtype)[:, None],
                      jnp.asarray(C, dtype)[None, :], dt)


def K_diagonalised(N, C, dt, L):
    """The kernel of `hippo_ssm` through the naive diagonalisation
    A = W diag(w) W^{-1} and the diagonal kernel on the eigenvalues w, in
    numpy float64. Returns (K of shape (L,), cond(W)): exact in exact
    arithmetic, garbage in floating point once W is ill-conditioned."""
    A, B, C = _hippo_and_C(N, C)
    L = checks.positive_int(L, "L")
    w, W = np.linalg.eig(A)
    wb = (1 + dt / 2 * w) / (1 - dt / 2 * w)            # bilinear eigenvalues
    bb = dt / (1 - dt / 2 * w) * np.linalg.solve(W, B)  # W^{-1} Bb
    return (((C @ W) * bb) @ (wb[:, None] ** np.arange(L)[None, :])).real, np.linalg.cond(W)


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
    L = checks.positive_int(L, "L")
    Omega_L = jnp.exp((-2j * jnp.pi) * (jnp.arange(L) / L))
    atRoots = jax.vmap(gen)(Omega_L)
    return jnp.fft.ifft(atRoots, L).reshape(L).real


def K_gen_inverse(Ab, Bb, Cb, L):
    """The truncated generating function with the power series summed:

        sum_{l<L} Cb Ab^l Bb z^l = Cb (I - Ab^L z^L) (I - Ab z)^{-1} Bb
                                 = C~ (I - Ab z)^{-1} Bb   at roots of unity (z^L = 1),

    with C~ = Cb (I - Ab^L). One Ab^L, then one N x N solve per root.
    """
    Ab, Bb, Cb = checks.ssm(Ab, Bb, Cb, L=L)
    I = jnp.eye(Ab.shape[0])
    Ab_L = jnp.linalg.matrix_power(Ab, L)
    Ct = Cb @ (I - Ab_L)
    return lambda z: (Ct @ jnp.linalg.solve(I - Ab * z, Bb)).reshape()


# --------------------------------------------------------------------------
# Diagonal plus low rank: Cauchy kernels and the Woodbury identity
# --------------------------------------------------------------------------
def cauchy(
    v: Num[Array, "*K N"], omega: Num[Array, "M"], lambd: Num[Array, "N"], conj: bool = False
) -> Inexact[Array, "*K M"]:
    """The Cauchy matrix-vector product k(omega_j) = sum_n v_n / (omega_j - lambd_n).

    lambd has shape (N,), omega shape (M,); v has shape (N,), giving k of
    shape (M,), or (K, N) for K vectors at once, giving (K, M), which share
    one (M, N) Cauchy matrix 1 / (omega_j - lambd_n): O(M N) time and memory.

    conj=True: the N stored poles stand for 2N, the pairs (lambd_n, conj lambd_n)
    with weights (v_n, conj v_n), as for a real SSM written in its complex
    eigenbasis; the sum runs over all 2N.
    """
    v, omega, lambd = checks.cauchy(v, omega, lambd)
    k = v @ (1.0 / (omega[:, None] - lambd[None, :])).T
    if conj:
        k = k + v.conj() @ (1.0 / (omega[:, None] - lambd.conj()[None, :])).T
    return k


def kernel_DPLR(
    Lambda: Num[Array, "N"], P: Num[Array, "N"], Q: Num[Array, "N"],
    B: Num[Array, "N"], C: Num[Array, "N"], dt: Scalar, L: int, conj: bool = False
) -> Float[Array, "L"]:
    """The S4 convolution kernel of A = diag(Lambda) - P Q^*, shape (L,), real.

    C is C~ = C (I - Ab^L), the S4 parameterisation. With the bilinear
    discretisation, at a root of unity z the generating function is

        (2 / (1 + z)) C~ (g(z) - A)^{-1} B,    g(z) = (2 / dt) (1 - z) / (1 + z),

    and Woodbury turns the resolvent of a DPLR matrix into four Cauchy kernels:

        C~ R B - C~ R P (1 + Q^* R P)^{-1} Q^* R B,   R = (g - diag(Lambda))^{-1}.

    O(N L) work, no matrix powers, no inverses; an inverse FFT gives K.
    conj=True: the N stored modes stand for N conjugate pairs (see `cauchy`),
    the state size is 2N and only half of it is stored or computed on. The
    SSM is then real, so its values at conjugate roots are conjugate: only
    the L // 2 + 1 roots that `irfft` reads are evaluated.
    """
    Lambda, P, Q, B, C = checks.dplr(Lambda, P, Q, B, C, dt=dt, L=L)
    Omega_L = jnp.exp((-2j * jnp.pi) * (jnp.arange(L // 2 + 1 if conj else L) / L))
    aterm = (C.conj(), Q.conj())
    bterm = (B, P)
    g = (2.0 / dt) * ((1.0 - Omega_L) / (1.0 + Omega_L))
    c = 2.0 / (1.0 + Omega_L)
    # the four Cauchy kernels share their poles Lambda: one Cauchy matrix
    v = jnp.stack([aterm[0] * bterm[0], aterm[0] * bterm[1],
                   aterm[1] * bterm[0], aterm[1] * bterm[1]])
    k00, k01, k10, k11 = cauchy(v, g, Lambda, conj)
    atRoots = c * (k00 - k01 * (1.0 / (1.0 + k11)) * k10)
    if conj:
        return jnp.fft.irfft(atRoots, L)
    return jnp.fft.ifft(atRoots, L).real


def unfold_conj(*xs):
    """N/2 stored modes -> all N: each x becomes concat(x, conj(x)) on its last axis."""
    out = [jnp.concatenate([x, jnp.conj(x)], axis=-1) for x in map(jnp.asarray, xs)]
    return out[0] if len(out) == 1 else out


def discrete_DPLR(Lambda, P, Q, B, C, dt, L):
    """The bilinear discretisation of a DPLR SSM as DENSE matrices (the reference).

    Returns (Ab, Bb, Cb) with shapes (N, N), (N, 1), (1, N), complex, such that
    K_conv(Ab, Bb, Cb, L).real == kernel_DPLR(Lambda, P, Q, B, C, dt, L).

    Ab = A1 A0 and Bb = 2 A1 B with A0 = (2/dt) I + A and
    A1 = ((2/dt) I - A)^{-1} = D - D P (1 + Q^* D P)^{-1} Q^* D, where
    D = diag(1 / (2/dt - Lambda)) (Woodbury: no dense inverse). But the
    product A1 @ A0 is formed: O(N^2) memory, O(N^3) to build and O(N^2) per
    step of the recurrence. `dplr_step` applies the same Ab in O(N), never
    forming it; this function is what it is checked against.
    Since the kernel was written with C~ = C (I - Ab^L) (and uses its
    conjugate, see kernel_DPLR), the recurrence needs Cb = C~^* (I - Ab^L)^{-1}:
    a dense power Ab^L and one N x N solve, done once.
    """
    Lambda, P, Q, B, C = checks.dplr(Lambda, P, Q, B, C, dt=dt, L=L)
    N = Lambda.shape[0]
    A = jnp.diag(Lambda) - P[:, None] @ Q[:, None].conj().T
    I = jnp.eye(N)
    A0 = (2.0 / dt) * I + A
    d = 1.0 / ((2.0 / dt) - Lambda)  # the diagonal of D
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


# --------------------------------------------------------------------------
# The O(N) recurrent step (S4 paper, Theorem 2 and its appendix)
# --------------------------------------------------------------------------
def _dot(a, b, conj):
    """a^* b = sum_n conj(a_n) b_n over the last axis; with conj, over the pairs too."""
    s = jnp.sum(a.conj() * b, axis=-1)
    return 2.0 * s.real if conj else s


def dplr_A0(x, Lambda, P, Q, dt, conj=False):
    """A0 x = ((2/dt) I + diag(Lambda) - P Q^*) x: a diagonal and a rank one, O(N)."""
    return (2.0 / dt + Lambda) * x - P * _dot(Q, x, conj)[..., None]


def dplr_A1(y, Lambda, P, Q, dt, conj=False):
    """A1 y = ((2/dt) I - diag(Lambda) + P Q^*)^{-1} y by Woodbury, O(N):

        A1 = D - D P (1 + Q^* D P)^{-1} Q^* D,   D = diag(1 / (2/dt - Lambda)).
    """
    d = 1.0 / (2.0 / dt - Lambda)
    r = _dot(Q, d * y, conj) / (1.0 + _dot(Q, d * P, conj))
    return d * y - (d * P) * r[..., None]


def dplr_step(x, u, Lambda, P, Q, Bb, dt, conj=False):
    """One step x_k = Ab x_{k-1} + Bb u_k with Ab = A1 A0 applied, never formed: O(N).

    x has shape (..., N) (complex), u shape (...) (the scalar input of each
    SSM); Lambda, P, Q have shape (N,); Bb and dt broadcast against x.
    With conj, x holds the N stored modes of 2N conjugate pairs.
    """
    return dplr_A1(dplr_A0(x, Lambda, P, Q, dt, conj), Lambda, P, Q, dt, conj) \
        + Bb * u[..., None]


def dplr_rnn(Lambda, P, Q, B, C, dt, L, conj=False):
    """(Bb, Cb) for `dplr_step`, shapes (N,), with y_k = Re(Cb x_k)
    (2 Re(...) with conj).

    Bb = 2 A1 B is one O(N) Woodbury solve. Cb = C~^* (I - Ab^L)^{-1} needs
    the L-th power of Ab, taken densely by `discrete_DPLR` once, at set-up
    (O(N^3 log L)); every step after that is O(N).
    """
    Lambda, P, Q, B, C = checks.dplr(Lambda, P, Q, B, C, dt=dt)
    Bb = dplr_A1(2.0 * B, Lambda, P, Q, dt, conj)
    full = unfold_conj(Lambda, P, Q, B, C) if conj else (Lambda, P, Q, B, C)
    _, _, Cb = discrete_DPLR(*full, dt, L)
    return Bb, Cb[0, :Lambda.shape[0]]
