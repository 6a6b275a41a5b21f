"""S4: the structured SSM kernel.

The diagonal case (S4D) comes first in the file because everything else
reduces to it: for a diagonal state matrix diag(Lambda) the kernel is a
Vandermonde product, computed in O(N L) without any matrix powers.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

__all__ = [
    "discretize_diagonal",
    "kernel_diagonal",
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


def discretize_diagonal(Lambda, B, step):
    """Zero-order-hold discretization of x' = diag(Lambda) x + B u.

    Returns (Lambda_bar, B_bar) = (exp(step Lambda), (exp(step Lambda) - 1) / Lambda * B),
    so that x_k = Lambda_bar * x_{k-1} + B_bar u_k, elementwise.
    """
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
    _, B_bar = discretize_diagonal(Lambda, B, step)
    V = jnp.exp((step * Lambda)[:, None] * jnp.arange(L)[None, :])  # (N, L)
    return jnp.einsum("n,nl->l", C * B_bar, V).real
