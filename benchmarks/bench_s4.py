"""Benchmark the S4 kernel and layers.

1. Kernel time for one HiPPO SSM (N = 64) at L = 1k, 4k, 16k: the naive
   power iteration (`K_conv`, O(N^2 L), sequential), the generating
   function with one N x N solve per root (`K_gen_inverse`, O(N^3 L)), and the
   DPLR kernel (`kernel_DPLR`, O(N L) Cauchy product + FFT); and the DPLR
   kernel of all H channels of an S4Layer at once (what CNN mode computes).
2. Layer forward + backward time (S4Layer and S4DLayer, H = 128, N = 64,
   batch 8) at the same lengths, beside the forward + backward time of the
   layer's kernel alone (all H channels; the rest is the convolution).
3. The recurrent step at N = 64, H = 128: S4Layer's O(N) DPLR step
   (`dplr_step`: a diagonal plus rank-one product, then a Woodbury solve)
   against the dense step with Ab = A1 A0 formed (`discrete_DPLR`, O(N^2)),
   both inside one compiled `lax.scan` (no per-call overhead): microseconds
   per token at batch 1, and generation tokens/s of a decoder that feeds
   each output back as the next input (batch 16).
4. Generation: producing L outputs one at a time in RNN mode (one cached
   step per output) versus recomputing the CNN-mode forward pass on the growing
   prefix (what a convolution-only model would have to do), at several L.

The kernel measurements are `annotated_s4.timing.kernel_scaling`, the same
function chapter 5 calls for its live scaling figure; that figure times the
three single-SSM kernels only (no H-channel kernel), at L = 256 to 16k with
3 repeats, where this script uses 5 (3 with --quick).

Usage:  python benchmarks/bench_s4.py [--quick] [--step-only]
--quick runs a reduced sweep (CPU CI budgets): L = 1k, 4k, H = 32, and
generation at L = 32, 64, 128 (the step comparison keeps N = 64, H = 128).
--step-only runs section 3 alone.
Writes benchmarks/results/s4.json and s4.png (--quick: s4_quick.json and
s4_quick.png; --step-only: s4_step.json); on a GPU the names end in _gpu
(s4_gpu.json), so that one device's results never replace another's. The
JSON records the device, the JAX and jaxlib versions and the CPU model
(`annotated_s4.timing.device_info`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from annotated_s4 import S4DLayer, S4Layer
from annotated_s4.s4 import discrete_DPLR, dplr_rnn, dplr_step, unfold_conj
from annotated_s4.timing import (device_info, kernel_scaling, linearity, loglog_slope,
                                 result_stem, time_fn)

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def fwd_bwd(layer_cls, H, N, L, batch, kernel_only=False):
    """A layer's forward + backward on a batch of inputs, or (kernel_only)
    that of its kernel alone, all H channels."""
    layer = layer_cls(H, N, L, rngs=nnx.Rngs(0))
    u = jax.random.normal(jax.random.PRNGKey(1), (batch, L, H))
    out = (lambda m, u: m.kernel(L)) if kernel_only else (lambda m, u: m(u))

    @nnx.jit
    def step(layer, u):
        return nnx.grad(lambda m: jnp.mean(out(m, u) ** 2))(layer)

    return lambda: step(layer, u)


def generation(layer_cls, H, N, L, batch, repeats):
    """Seconds to produce L outputs: RNN steps vs CNN forward on every prefix."""
    layer = layer_cls(H, N, L, rngs=nnx.Rngs(0))
    u = jax.random.normal(jax.random.PRNGKey(2), (batch, L, H))
    step = nnx.jit(lambda layer, u_t: layer.step(u_t))
    cnn = nnx.jit(lambda layer, u: layer(u))

    def rnn_all():
        layer.init_cache(batch)
        y = None
        for k in range(L):
            y = step(layer, u[:, k])
        return y

    def cnn_all():
        # Without a recurrence, each new output needs a forward pass over the
        # prefix; padding the prefix to L keeps a single compiled shape.
        y = None
        for k in range(L):
            y = cnn(layer, jnp.where(jnp.arange(L)[None, :, None] <= k, u, 0.0))[:, k]
        return y

    return {"rnn": time_fn(rnn_all, repeats=repeats), "cnn": time_fn(cnn_all, repeats=repeats)}


def step_fns(H, N, L):
    """The O(N) and the dense one-token step of one S4Layer's H channels (pure functions)."""
    layer = S4Layer(H, N, L, rngs=nnx.Rngs(0))
    Lambda, P, B, C, dt = layer.ssm_params()
    D = layer.D[...]
    Bb, Cb = jax.vmap(lambda C, s: dplr_rnn(Lambda, P, P, B, C, s, L, conj=True))(C, dt)
    Ab, Bd, Cd = jax.vmap(lambda C, s: discrete_DPLR(*unfold_conj(Lambda, P, P, B, C), s, L))(
        C, dt)
    Bd, Cd = Bd[..., 0], Cd[:, 0]

    def fast(x, u):  # x (batch, H, N/2): what S4Layer.step computes
        x = dplr_step(x, u, Lambda, P, P, Bb, dt[:, None], conj=True)
        return x, 2.0 * jnp.einsum("hn,bhn->bh", Cb, x).real + D * u

    def dense(x, u):  # x (batch, H, N): Ab (H, N, N) formed
        x = jnp.einsum("hnm,bhm->bhn", Ab, x) + Bd * u[..., None]
        return x, jnp.einsum("hn,bhn->bh", Cd, x).real + D * u

    return {"dplr_O(N)": (fast, N // 2, Bb.dtype), "dense": (dense, N, Ab.dtype)}


def recurrence(H, N, T, batch, repeats, feedback):
    """Median seconds for T tokens of each step inside one jitted lax.scan.

    feedback=False: the inputs are given (teacher forcing); True: a decoder,
    each output (through tanh) is the next input, as in generation.
    """
    u = jax.random.normal(jax.random.PRNGKey(3), (T, batch, H))
    out = {}
    for name, (fn, n_state, dtype) in step_fns(H, N, T).items():
        x0 = jnp.zeros((batch, H, n_state), dtype)

        def body(carry, u_t, fn=fn):
            x, prev = carry
            x, y = fn(x, jnp.tanh(prev) if feedback else u_t)
            return (x, y), y

        run = jax.jit(lambda x0, u, body=body: jax.lax.scan(body, (x0, u[0]), u)[1])
        out[name] = time_fn(lambda run=run, x0=x0: run(x0, u), repeats=repeats)
    return out


def step_section(out, repeats, quick):
    N, H, T = 64, 128, (1024 if quick else 4096)
    print(f"\nrecurrent step, N = {N}, H = {H}: {T} tokens in one compiled lax.scan")
    per_token = recurrence(H, N, T, 1, repeats, feedback=False)
    gen_batch = 16
    gen = recurrence(H, N, T, gen_batch, repeats, feedback=True)
    res = {"N": N, "H": H, "tokens": T,
           "us_per_token_batch1": {k: 1e6 * v / T for k, v in per_token.items()},
           "generation_batch": gen_batch,
           "generation_tokens_per_s": {k: gen_batch * T / v for k, v in gen.items()}}
    res["step_speedup"] = per_token["dense"] / per_token["dplr_O(N)"]
    res["generation_speedup"] = gen["dense"] / gen["dplr_O(N)"]
    out["rnn_step"] = res
    print(f"{'step':>10} {'us/token (batch 1)':>19} {f'gen tokens/s (batch {gen_batch})':>26}")
    for k in per_token:
        print(f"{k:>10} {res['us_per_token_batch1'][k]:19.1f} "
              f"{res['generation_tokens_per_s'][k]:26.0f}")
    print(f"O(N) step {res['step_speedup']:.1f}x faster per token, "
          f"{res['generation_speedup']:.1f}x in generation")
    sys.stdout.flush()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="reduced sweep for CPU CI")
    parser.add_argument("--step-only", action="store_true", help="only the recurrent step")
    args = parser.parse_args(argv)
    quick = args.quick
    lengths = [1024, 4096] if quick else [1024, 4096, 16384]
    H = 32 if quick else 128
    N, batch = 64, 8
    repeats = 3 if quick else 5
    out = {"backend": jax.default_backend(), "device": device_info(), "quick": quick,
           "N": N, "H": H, "batch": batch, "lengths": lengths, "kernel": {}, "layer": {}}

    print(f"device {out['device']['device_kind']} ({out['backend']}), CPU "
          f"{out['device']['cpu']}, N = {N}, H = {H}, batch = {batch}")
    step_section(out, repeats, quick)
    if args.step_only:
        return _write(out, plot_it=False)
    print("\nkernel time for one SSM (median ms)")
    # 16k dense 64 x 64 solves per call take minutes on a CPU: skip them there
    max_L = {"generating_function": 4096} if out["backend"] == "cpu" else None
    times = kernel_scaling(lengths, N=N, H=H, max_L=max_L, repeats=repeats)
    print(f"{'L':>6} {'naive':>10} {'gen. fn':>10} {'DPLR':>10} {'naive/DPLR':>11} "
          f"{'DPLR x H':>10}")
    for i, L in enumerate(lengths):
        row = {name: t[i] for name, t in times.items()}
        out["kernel"][L] = row
        g = "-" if row["generating_function"] is None else f"{1e3 * row['generating_function']:10.2f}"
        print(f"{L:>6} {1e3 * row['naive']:10.2f} {g:>10} {1e3 * row['dplr']:10.2f} "
              f"{row['naive'] / row['dplr']:11.1f} {1e3 * row['dplr_H_channels']:10.2f}")
    sys.stdout.flush()

    print(f"\nlayer forward + backward (median ms), H = {H}, N = {N}, batch = {batch}, "
          "beside the forward + backward of the layer's kernel alone")
    print(f"{'L':>6} {'S4':>10} {'S4 kernel':>10} {'share':>6} {'S4D':>10} {'S4D kernel':>11} "
          f"{'share':>6} {'S4/S4D':>8}")
    for L in lengths:
        row = {
            "s4": time_fn(fwd_bwd(S4Layer, H, N, L, batch), repeats=repeats),
            "s4_kernel": time_fn(fwd_bwd(S4Layer, H, N, L, batch, kernel_only=True),
                                 repeats=repeats),
            "s4d": time_fn(fwd_bwd(S4DLayer, H, N, L, batch), repeats=repeats),
            "s4d_kernel": time_fn(fwd_bwd(S4DLayer, H, N, L, batch, kernel_only=True),
                                  repeats=repeats),
        }
        out["layer"][L] = row
        print(f"{L:>6} {1e3 * row['s4']:10.1f} {1e3 * row['s4_kernel']:10.1f} "
              f"{row['s4_kernel'] / row['s4']:6.0%} {1e3 * row['s4d']:10.1f} "
              f"{1e3 * row['s4d_kernel']:11.1f} {row['s4d_kernel'] / row['s4d']:6.0%} "
              f"{row['s4'] / row['s4d']:8.2f}")
        sys.stdout.flush()

    # The CNN side runs a whole forward pass per output, O(L^2) in all: on a
    # CPU, L = 1024 alone would take many minutes, so stop at 512 there.
    cpu = out["backend"] == "cpu"
    gen_lengths = ([32, 64, 128] if quick else
                   [128, 256, 512] if cpu else [128, 256, 512, 1024])
    gen_repeats = 1 if quick or cpu else 3
    print(f"\ngeneration, H = {H}, N = {N}, batch = {batch} (median s of {gen_repeats})")
    out["generation"] = {"lengths": gen_lengths}
    for name, cls in [("s4", S4Layer), ("s4d", S4DLayer)]:
        rows = [generation(cls, H, N, Lg, batch, repeats=gen_repeats) for Lg in gen_lengths]
        out["generation"][name] = rows
        for Lg, row in zip(gen_lengths, rows):
            print(f"{name:>4} L = {Lg:5d}: RNN {row['rnn']:.3f} s, CNN on every prefix "
                  f"{row['cnn']:.3f} s, ratio {row['cnn'] / row['rnn']:.1f}x")

    # how the cost grows: slopes of log time vs log L (1.0 = linear)
    slopes = {
        "dplr_kernel": loglog_slope(lengths, times["dplr"]),
        "dplr_kernel_H_channels": loglog_slope(lengths, times["dplr_H_channels"]),
        "naive_kernel": loglog_slope(lengths, times["naive"]),
        "s4_layer_fwd_bwd": loglog_slope(lengths, [out["layer"][L]["s4"] for L in lengths]),
    }
    out["loglog_slopes"] = slopes
    print("\ntime ~ L^slope: " + ", ".join(f"{k} {v:.2f}" for k, v in slopes.items()))
    for k in ("dplr_kernel", "dplr_kernel_H_channels"):
        print(f"{k}: slope {slopes[k]:.2f}, {linearity(slopes[k])}")

    return _write(out, plot_it=True)


def _write(out, plot_it):
    os.makedirs(RESULTS, exist_ok=True)
    stem = result_stem("s4" if plot_it else "s4_step", out["quick"])
    with open(os.path.join(RESULTS, f"{stem}.json"), "w") as f:
        json.dump(out, f, indent=2)
    print(f"wrote {RESULTS}/{stem}.json")
    if plot_it:
        plot(out, os.path.join(RESULTS, f"{stem}.png"))
        print(f"wrote {RESULTS}/{stem}.png")
    return out


def plot(out, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    Ls = out["lengths"]
    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(15, 3.6))
    for name, marker in [("naive", "s"), ("generating_function", "^"), ("dplr", "o"),
                         ("dplr_H_channels", "D")]:
        pts = [(L, out["kernel"][L][name]) for L in Ls if out["kernel"][L][name] is not None]
        ax1.loglog(*zip(*pts), marker + "-", label=name.replace("_", " "))
    ax1.loglog(Ls, [out["kernel"][Ls[0]]["dplr_H_channels"] * L / Ls[0] for L in Ls], "k:",
               label="linear")
    ax1.set_xlabel("L"); ax1.set_ylabel("seconds"); ax1.set_title("kernel, N = 64")
    ax1.legend(fontsize=8)
    for (name, marker), color in zip([("s4", "o"), ("s4d", "s")], ("C0", "C1")):
        ax2.loglog(Ls, [out["layer"][L][name] for L in Ls], marker + "-", color=color,
                   label=name.upper())
        ax2.loglog(Ls, [out["layer"][L][name + "_kernel"] for L in Ls], marker + "--",
                   color=color, label=f"{name.upper()} kernel alone")
    ax2.set_xlabel("L"); ax2.set_title(f"layer fwd+bwd, H = {out['H']}, batch = {out['batch']}")
    ax2.legend(fontsize=8)
    gL = out["generation"]["lengths"]
    for name, marker in [("s4", "o"), ("s4d", "s")]:
        for mode, ls in [("rnn", "-"), ("cnn", "--")]:
            ax3.loglog(gL, [r[mode] for r in out["generation"][name]], marker + ls,
                       label=f"{name.upper()} {'RNN steps' if mode == 'rnn' else 'CNN per prefix'}")
    ax3.set_xlabel("generated length L"); ax3.set_title("generation")
    ax3.legend(fontsize=8)
    fig.suptitle(f"bench_s4 on {out['device']['device_kind']} ({out['backend']})", fontsize=10)
    plt.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    t0 = time.time()
    main()
    print(f"total {time.time() - t0:.0f} s")
