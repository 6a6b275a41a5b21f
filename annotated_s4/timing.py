"""Wall-clock timing shared by the benchmarks and the chapters' speed figures."""

from __future__ import annotations

import statistics
import time

import jax

__all__ = ["time_fn"]


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
