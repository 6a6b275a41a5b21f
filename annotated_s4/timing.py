"""Wall-clock timing shared by the benchmarks and the chapters' speed figures."""

from __future__ import annotations

import statistics
import time

import jax

__all__ = ["time_fn", "peak_bytes", "convolution_timings", "layer_scaling", "crossover"]


def time_fn(fn, *args, warmup=1, repeats=5):
    """Median seconds of `fn(*args)` over `repeats` runs, after `warmup` runs.

    Results are waited for with `jax.block_until_ready`, so asynchronous
    dispatch does not hide the work.
    """
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats}")
    for _ in range(warmup):
        jax.block_until_ready(fn(*args))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def convolution_timings(lengths, N=64, repeats=5, seed=3):
    """Three ways to apply an N-state SSM to a sequence of each length L.

    A random SSM made stable (A - N I), so outputs stay finite at every
    length. For each L: median seconds of the zero-padded FFT convolution
    with the kernel K, of the direct causal sum, and of the recurrence by
    `jax.lax.scan`, all jitted (chapter 3 and benchmarks/bench_convolution.py).
    The FFT and scan outputs are checked to agree, relative to the output's size.
    Returns a list of dicts with keys L, fft_s, direct_s, scan_s.
    """
    import jax.numpy as jnp

    from .ssm import K_conv, causal_convolution, discretize, random_SSM, run_SSM

    A, B, C = random_SSM(jax.random.PRNGKey(seed), N)
    A = A - N * jnp.eye(N)
    fft = jax.jit(lambda u, K: causal_convolution(u, K))
    direct = jax.jit(lambda u, K: causal_convolution(u, K, nofft=True))
    scan = jax.jit(lambda u: run_SSM(A, B, C, u)[:, 0])
    rows = []
    for L in lengths:
        u = jax.random.normal(jax.random.PRNGKey(seed + 1), (L,))
        K = K_conv(*discretize(A, B, C, 1.0 / L), L)
        y_fft, y_scan = fft(u, K), scan(u)
        if not jnp.allclose(y_fft, y_scan, atol=1e-4 * float(jnp.abs(y_scan).max())):
            raise RuntimeError(f"FFT convolution and scan disagree at L = {L}")
        rows.append({"L": L,
                     "fft_s": time_fn(fft, u, K, repeats=repeats),
                     "direct_s": time_fn(direct, u, K, repeats=repeats),
                     "scan_s": time_fn(scan, u, repeats=repeats)})
    return rows


def peak_bytes(fn, *args):
    """Arguments + outputs + temporaries of `jax.jit(fn)` compiled for `args`,
    in bytes (XLA's own accounting), or None where the backend does not say."""
    try:
        stats = jax.jit(fn).lower(*args).compile().memory_analysis()
        return int(stats.argument_size_in_bytes + stats.output_size_in_bytes
                   + stats.temp_size_in_bytes)
    except Exception:  # memory_analysis is not available on every backend
        return None


def layer_scaling(layers, lengths, d_model, *, batch=1, repeats=3, backward=True,
                  memory=True, log=None):
    """Time sequence layers against the sequence length.

    `layers` maps a name to an NNX layer taking u of shape (batch, L, d_model).
    For every L in `lengths` and every layer: the median forward time
    (`time_fn`, one warm-up run that also compiles) and, if `backward`, the
    forward+backward time (gradient of the summed output with respect to the
    parameters and u); if `memory`, the compiled programs' `peak_bytes`.
    Returns a list of dicts, one per (L, layer), with keys layer, L,
    forward_s and, as asked, forward_backward_s, forward_peak_bytes and
    forward_backward_peak_bytes. `log`, if given, is called with a line per row.
    """
    from flax import nnx

    if not layers:
        raise ValueError("layers must name at least one layer")
    lengths = list(lengths)
    if not lengths or any(isinstance(L, bool) or int(L) != L or L < 1 for L in lengths):
        raise ValueError(f"lengths must be positive ints, got {lengths}")
    rows = []
    for L in lengths:
        u = jax.random.normal(jax.random.PRNGKey(0), (batch, int(L), d_model))
        for name, layer in layers.items():
            graph, state = nnx.split(layer)

            def fwd(state, u, graph=graph):
                return nnx.merge(graph, state)(u)

            def fwd_bwd(state, u):
                return jax.grad(lambda s, u: fwd(s, u).sum(), argnums=(0, 1))(state, u)

            row = {"layer": name, "L": int(L),
                   "forward_s": time_fn(jax.jit(fwd), state, u, repeats=repeats)}
            if backward:
                row["forward_backward_s"] = time_fn(jax.jit(fwd_bwd), state, u, repeats=repeats)
            if memory:
                row["forward_peak_bytes"] = peak_bytes(fwd, state, u)
                if backward:
                    row["forward_backward_peak_bytes"] = peak_bytes(fwd_bwd, state, u)
            rows.append(row)
            if log:
                log(f"  L={int(L):6d} {name:10s} fwd {row['forward_s'] * 1e3:9.2f} ms"
                    + (f"  fwd+bwd {row['forward_backward_s'] * 1e3:9.2f} ms" if backward else "")
                    + (f"  peak {(row.get('forward_backward_peak_bytes') or row.get('forward_peak_bytes') or 0) / 2**20:9.1f} MiB"
                       if memory else ""))
    return rows


def crossover(rows, key, *, fast="H3", slow="attention"):
    """The first L from which `fast`'s `key` (time or bytes) stays below
    `slow`'s at every longer L measured; None if it is not below at the
    longest. `rows` as returned by `layer_scaling`."""
    by = {}
    for r in rows:
        if r.get(key) is not None:
            by.setdefault(r["L"], {})[r["layer"]] = r[key]
    found = None
    for L in sorted(by, reverse=True):
        if fast in by[L] and slow in by[L] and by[L][fast] < by[L][slow]:
            found = L
        else:
            break
    return found
