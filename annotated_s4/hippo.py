"""HiPPO-LegS: a state matrix that remembers the whole past of a signal.

The HiPPO-LegS state x(t) holds the coefficients of the best approximation of
the history u(s), s <= t, by Legendre polynomials scaled to [0, t]. It is the
initialisation that makes S4 work, and it has a structure S4 exploits: it is
normal plus low rank (NPLR), hence unitarily equivalent to a diagonal plus low
rank (DPLR) matrix.

These functions build matrices once, at initialisation, so they use NumPy in
float64 (eigendecompositions in float32 would throw away the accuracy the
kernel needs). Callers cast the results to jnp arrays of the dtype they want.
"""

from __future__ import annotations

import numpy as np

from . import _checks as checks

__all__ = [
    "make_HiPPO",
    "make_NPLR_HiPPO",
    "make_DPLR_HiPPO",
    "legendre_reconstruct",
    "hippo_legs_states",
    "legs_history_matrix",
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
    eigenvalues -1/2 + i w. -i S itself is not Hermitian (its diagonal is i/2),
    but -i K = -i (S + I/2) is: we diagonalise it with `eigh` (exact to
    rounding, with an orthonormal V), whose real eigenvalues are the w.

    conj=True (N even): S is real, so its eigenvalues and eigenvectors come in
    conjugate pairs (A itself is lower triangular, with the real eigenvalues
    -1, ..., -N). Only the N/2 modes with w > 0 are returned (V has shape
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
        # eigh sorts w ascending and the w come in pairs +-w, none zero for even N
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
    T_t T_{t-1} ... T_{j+1} S_j with T_k = (I - A/(2k))^{-1}(I + A/(2k)) and
    S_j = (I - A/(2j))^{-1} B / j, accumulated from the right end backwards.
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
