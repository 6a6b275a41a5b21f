"""HiPPO-LegS: a state matrix derived from an approximation problem.

In the time-varying (scale-invariant) system c' = (1/t) A c + (1/t) B u, the
state c(t) holds the coefficients of the best approximation of the history
u(s), 0 <= s <= t, by Legendre polynomials scaled to [0, t]. A is lower
triangular with the eigenvalues -1, ..., -N: in its eigenbasis the state holds
the moments of the history against the monomials (s/t)^k, and A is that
diagonal system written in the orthonormal (Gram-Schmidt) basis of the same
polynomials. S4 uses the same A and B in a time-invariant SSM (no 1/t), whose
state holds the past in exponentially warped Legendre polynomials. A is normal
plus low rank (NPLR), hence unitarily equivalent to a diagonal plus low rank
(DPLR) matrix, the structure S4's kernel exploits.

These functions build matrices once, at initialisation, so they use NumPy in
float64 (eigendecompositions in float32 would throw away the accuracy the
kernel needs). Callers cast the results to jnp arrays of the dtype they want.
"""

from __future__ import annotations

import math

import numpy as np

from . import _checks as checks

__all__ = [
    "make_HiPPO",
    "make_NPLR_HiPPO",
    "make_DPLR_HiPPO",
    "legendre_reconstruct",
    "hippo_legs_states",
    "legs_history_matrix",
    "shifted_legendre",
    "gram_schmidt_monomials",
    "legs_projection",
]


def make_HiPPO(N):
    """The (negative) HiPPO-LegS matrix A, shape (N, N), float64.

    A_nk = -sqrt(2n+1) sqrt(2k+1) for n > k, -(n+1) for n = k, 0 for n < k.
    """
    N = checks.positive_int(N, "N")
    p = np.sqrt(1 + 2 * np.arange(N))
    A = p[:, None] * p[None, :]  # sqrt(2n+1) sqrt(2k+1) everywhere
    A = np.tril(A) - np.diag(np.arange(N))  # diagonal: (2n+1) - n = n+1
    return -A


def make_NPLR_HiPPO(N):
    """HiPPO as normal plus low rank: (A, P, B) with A + P P^T normal.

    P_n = sqrt(n + 1/2) and B_n = sqrt(2n + 1), the HiPPO-LegS input vector.
    Adding P P^T to A gives -1/2 on the diagonal and a skew-symmetric rest.
    """
    A = make_HiPPO(N)
    P = np.sqrt(np.arange(N) + 0.5)
    B = np.sqrt(2 * np.arange(N) + 1.0)
    return A, P, B


def make_DPLR_HiPPO(N, conj=False):
    """HiPPO as diagonal plus low rank in the eigenbasis of its normal part.

    Returns (Lambda, P, B, V), complex128, with
    A = V (diag(Lambda) - P P^*) V^*, where P and B are expressed in that basis.

    S = A + P P^T = -1/2 I + K with K skew-symmetric, so S is normal with
    eigenvalues -1/2 + i Lambda_imag. -i S itself is not Hermitian (its diagonal
    is i/2), but -i K = -i (S + I/2) is: we diagonalise it with `eigh` (exact
    to rounding, with an orthonormal V), whose real eigenvalues are Lambda_imag.
    (eigh(-i S), as the Annotated S4 and the S4 authors' code write it, gives
    the same: a LAPACK-based `eigh` (PyTorch's, NumPy's) reads one triangle and
    takes the diagonal as real, and `jax.numpy.linalg.eigh` first symmetrises
    its input to (a + a^H) / 2, which is -i K.)

    conj=True (N even): S is real, so its eigenvalues and eigenvectors come in
    conjugate pairs (A itself is lower triangular, with the real eigenvalues
    -1, ..., -N). Only the N/2 modes with Lambda_imag > 0 are returned (V has shape
    (N, N/2)); the other N/2 are their conjugates, V_full = [V, conj(V)].
    """
    A, P, B = make_NPLR_HiPPO(N)
    S = A + P[:, None] * P[None, :]
    S_diag = np.diagonal(S)
    Lambda_real = np.mean(S_diag) * np.ones_like(S_diag)  # all -1/2
    K = S - np.diag(S_diag)  # the skew-symmetric part, S + I/2
    Lambda_imag, V = np.linalg.eigh(-1j * K)
    if conj:
        if N % 2:
            raise ValueError(f"N must be even for conjugate pairs, got {N}")
        # eigh sorts Lambda_imag ascending: pairs +-theta, none zero for even N
        Lambda_real, Lambda_imag, V = Lambda_real[N // 2:], Lambda_imag[N // 2:], V[:, N // 2:]
    P = V.conj().T @ P
    B = V.conj().T @ B
    return Lambda_real + 1j * Lambda_imag, P, B, V


def legendre_reconstruct(c, t, s):
    """The signal encoded by HiPPO-LegS coefficients c at time t, evaluated at s.

    HiPPO-LegS approximates the history on [0, t] by
    u(s) ~ sum_n c_n sqrt(2n+1) P_n(2 s / t - 1), with P_n the Legendre
    polynomials. c has shape (N,), s any shape with 0 <= s <= t.
    """
    c = np.asarray(c, dtype=np.float64)
    if c.ndim != 1:
        raise ValueError(f"c must be a 1-D coefficient vector, got shape {c.shape}")
    if not t > 0:
        raise ValueError(f"t must be positive, got {t}")
    s = np.asarray(s, dtype=np.float64)
    if np.any(s < 0) or np.any(s > t):
        raise ValueError(f"s must lie in [0, t] = [0, {t}], got values in "
                         f"[{s.min()}, {s.max()}]")
    N = c.shape[0]
    x = 2.0 * s / t - 1.0
    scale = np.sqrt(2 * np.arange(N) + 1.0)
    return np.polynomial.legendre.legval(x, c * scale)


def hippo_legs_states(u, N, A=None, B=None):
    """Run HiPPO-LegS online on a sampled signal: the states c_k, shape (L, N).

    The scale-invariant LegS ODE is c'(t) = (1/t) A c(t) + (1/t) B u(t) with
    A = make_HiPPO(N) (already negative). Its bilinear discretisation at
    t_k = k dt uses the step dt / t_k = 1 / k, so dt cancels:

        c_k = (I - A/(2k))^{-1} [(I + A/(2k)) c_{k-1} + (B/k) u_k].

    c_k encodes the whole history u_1 .. u_k (see `legendre_reconstruct`).
    Pass another (A, B) to run the same online update with a different matrix.
    NumPy float64, one small solve per step: a tool for figures, not training.
    """
    u = np.asarray(u, dtype=np.float64)
    if u.ndim != 1:
        raise ValueError(f"u must be a 1-D sequence of shape (L,), got {u.shape}")
    A, B = _legs_AB(N, A, B)
    I = np.eye(N)
    c = np.zeros(N)
    out = np.empty((u.shape[0], N))
    for k in range(1, u.shape[0] + 1):
        h = 1.0 / k
        c = np.linalg.solve(I - (h / 2) * A, (I + (h / 2) * A) @ c + h * B * u[k - 1])
        out[k - 1] = c
    return out


def legs_history_matrix(N, t, A=None, B=None):
    """The linear map M (N, t) from the history u_1..u_t to the state c_t = M u.

    Column j is the state at time t left by a unit impulse at time j:
    Ab_t Ab_{t-1} ... Ab_{j+1} Bb_j, with the step matrices of the bilinear rule
    Ab_k = (I - A/(2k))^{-1}(I + A/(2k)) and Bb_j = (I - A/(2j))^{-1} B / j,
    accumulated from the right end backwards.
    """
    A, B = _legs_AB(N, A, B)
    t = checks.positive_int(t, "t")
    I = np.eye(N)
    W = I.copy()
    M = np.empty((N, t))
    for j in range(t, 0, -1):
        h = 1.0 / j
        Linv = np.linalg.inv(I - (h / 2) * A)
        M[:, j - 1] = W @ (Linv @ (h * B))
        W = W @ (Linv @ (I + (h / 2) * A))
    return M


def _legs_AB(N, A, B):
    N = checks.positive_int(N, "N")
    if A is None and B is None:
        A, _, B = make_NPLR_HiPPO(N)
    A, B = np.asarray(A, dtype=np.float64), np.asarray(B, dtype=np.float64)
    if A.shape != (N, N):
        raise ValueError(f"A must have shape (N, N) = ({N}, {N}), got {A.shape}")
    if B.shape != (N,):
        raise ValueError(f"B must have shape (N,) = ({N},), got {B.shape}")
    return A, B


def shifted_legendre(N):
    """The orthonormal Legendre polynomials of [0, 1] in the monomial basis: T, (N, N).

    Row n holds the coefficients of p_n(x) = sqrt(2n+1) P_n(2x - 1):
    p_n(x) = sum_k T[n, k] x^k. Rodrigues' formula applied to (x^2 - x)^n gives
    P_n(2x - 1) = sum_{k<=n} (-1)^(n+k) binom(n, k) binom(n+k, k) x^k, so T is
    lower triangular with a positive diagonal. Its entries grow like 5.8^n, so
    use it for the algebra at small N, not to evaluate p_n (use legvander).
    """
    N = checks.positive_int(N, "N")
    T = np.zeros((N, N))
    for n in range(N):
        for k in range(n + 1):
            T[n, k] = (-1) ** (n + k) * math.comb(n, k) * math.comb(n + k, k)
    return np.sqrt(2 * np.arange(N) + 1.0)[:, None] * T


def gram_schmidt_monomials(N):
    """Gram-Schmidt of 1, x, ..., x^(N-1) on [0, 1] (uniform measure): T, (N, N).

    The Gram matrix of the monomials is the Hilbert matrix
    H_jk = <x^j, x^k> = int_0^1 x^(j+k) dx = 1/(j+k+1). Gram-Schmidt builds
    q_n = sum_{k<=n} T[n, k] x^k (T lower triangular, positive diagonal) with
    <q_n, q_m> = (T H T^T)_nm = delta_nm. With the Cholesky factor H = R R^T
    that is T = R^{-1}: Gram-Schmidt of a basis is the Cholesky factorisation
    of its Gram matrix. cond(H) grows about 31-fold per added degree from N = 4
    to 8, tending to (1 + sqrt 2)^4 = 34 as N grows: float64, small N only.
    """
    N = checks.positive_int(N, "N")
    k = np.arange(N)
    H = 1.0 / (k[:, None] + k[None, :] + 1)       # Hilbert matrix, (N, N)
    R = np.linalg.cholesky(H)                      # H = R R^T, R lower
    return np.linalg.solve(R, np.eye(N))           # T = R^{-1}, lower


def legs_projection(u, t, N, order=200):
    """The LegS coefficients of a signal, computed directly: c(t), shape (N,).

    c_n(t) = (1/t) int_0^t u(s) p_n(s/t) ds = int_0^1 u(t x) p_n(x) dx
    (substituting s = t x), with p_n(x) = sqrt(2n+1) P_n(2x - 1). `u` is a
    vectorised function of time; the integral is Gauss-Legendre quadrature with
    `order` nodes on [0, 1], exact when u is a polynomial of degree below
    2 * order - N + 1 and accurate to rounding for smooth u.
    """
    N = checks.positive_int(N, "N")
    order = checks.positive_int(order, "order")
    if not t > 0:
        raise ValueError(f"t must be positive, got {t}")
    y, w = np.polynomial.legendre.leggauss(order)   # nodes and weights on [-1, 1]
    x, w = (y + 1) / 2, w / 2                        # ... on [0, 1]
    p = np.polynomial.legendre.legvander(y, N - 1) * np.sqrt(2 * np.arange(N) + 1.0)
    return p.T @ (w * np.asarray(u(t * x), dtype=np.float64))
