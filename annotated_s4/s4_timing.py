"""Timing the S4 kernel: shared by `benchmarks/bench_s4.py` and chapter 5.

The benchmark script runs the full sweep (L up to 16k, whole layers, on a GPU
if there is one); the chapter calls the same functions on a short sweep, so
the figure in the book is produced by the benchmark's own measuring code.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from .hippo import make_DPLR_HiPPO, make_NPLR_HiPPO
from .layers import S4Layer
from .s4 import K_gen_inverse, conv_from_gen, kernel_DPLR
from .ssm import K_conv, _check_length, discretize
from .timing import time_fn

__all__ = ["KERNELS", "kernel_fns", "layer_kernel_fn", "kernel_scaling", "loglog_slope",
           "linearity"]

#: The kernel computations `kernel_scaling` knows, in the order of chapter 5.
KERNELS = ("naive", "generating_function", "dplr", "dplr_H_channels")


def kernel_fns(N, L):
    """The three kernel computations for the HiPPO SSM (float32), as jitted thunks.

    naive: the power iteration `K_conv`, O(N^2 L), L dependent steps;
    generating_function: `K_gen_inverse` at the L roots of unity, one N x N
    solve per root, O(N^3 L); dplr: `kernel_DPLR`, O(N L) Cauchy sums + FFT.
    """
    N, L = _check_length(N, "N"), _check_length(L)
    step = 1.0 / L
    A, _, B0 = make_NPLR_HiPPO(N)
    C0 = np.random.RandomState(0).randn(N) / np.sqrt(N)
    Ab, Bb, Cb = discretize(jnp.asarray(A, jnp.float32), jnp.asarray(B0, jnp.float32)[:, None],
                            jnp.asarray(C0, jnp.float32)[None, :], step)
    Lambda, P, B, _ = make_DPLR_HiPPO(N)
    c64 = lambda x: jnp.asarray(x, jnp.complex64)  # noqa: E731
    Ct = c64(np.random.RandomState(1).randn(N))
    naive = jax.jit(lambda: K_conv(Ab, Bb, Cb, L))
    gen = jax.jit(lambda: conv_from_gen(K_gen_inverse(Ab, Bb, Cb, L), L))
    dplr = jax.jit(lambda: kernel_DPLR(c64(Lambda), c64(P), c64(P), c64(B), Ct, step, L))
    return {"naive": naive, "generating_function": gen, "dplr": dplr}


def layer_kernel_fn(H, N, L):
    """The H-channel DPLR kernel of an S4Layer's parameters (what CNN mode computes).

    Jitted as a pure function of the parameters, so that the time is the
    kernel's and not the module bookkeeping of `nnx.jit` (a few ms per call).
    """
    Lambda, P, B, C, step = S4Layer(H, N, L, rngs=nnx.Rngs(0)).ssm_params()

    @jax.jit
    def kernel(Lambda, P, B, C, step):
        return jax.vmap(lambda C, s: kernel_DPLR(Lambda, P, P, B, C, s, L))(C, step)

    return lambda: kernel(Lambda, P, B, C, step)


def kernel_scaling(lengths, N=64, H=128, kernels=KERNELS, max_L=None, repeats=3):
    """Median seconds of each kernel computation at each length.

    Returns {kernel: [seconds or None for each L in lengths]}; None where
    L > max_L[kernel] (skip what would take minutes, e.g. the O(N^3 L)
    generating function at 16k on a CPU). "dplr_H_channels" is the kernel of
    all H channels of an S4Layer at once.
    """
    unknown = set(kernels) - set(KERNELS)
    if unknown:
        raise ValueError(f"kernels must be among {KERNELS}, got {sorted(unknown)}")
    lengths = [_check_length(L) for L in lengths]
    max_L = max_L or {}
    out = {name: [] for name in kernels}
    for L in lengths:
        fns = kernel_fns(N, L)
        for name in kernels:
            if L > max_L.get(name, L):
                out[name].append(None)
                continue
            fn = layer_kernel_fn(H, N, L) if name == "dplr_H_channels" else fns[name]
            out[name].append(time_fn(fn, repeats=repeats))
    return out


def loglog_slope(lengths, seconds):
    """The exponent p of a least-squares fit seconds ~ L^p (1.0 = linear in L)."""
    pts = [(L, s) for L, s in zip(lengths, seconds) if s is not None]
    if len(pts) < 2:
        raise ValueError(f"need times at two lengths or more, got {len(pts)}")
    Ls, ts = np.log(np.array(pts, float)).T
    return float(np.polyfit(Ls, ts, 1)[0])


def linearity(slope, tol=0.25):
    """Words for a log-log slope: close to linear, sublinear or superlinear."""
    if abs(slope - 1.0) <= tol:
        return f"close to linear (|slope - 1| <= {tol})"
    if slope < 1.0:
        return "sublinear: fixed per-call costs still dominate at these lengths"
    return "superlinear: worse than linear in L"
