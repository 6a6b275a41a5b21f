"""ETSC benchmarks: the paper's Figure 2 (ETSC vs gradient descent: time and
relative error) and Figure 3 (decoding time per token and memory of the FFT,
Cache and SSM strategies against sequence length, feature dimension, layers).

    python benchmarks/bench_toeplitz.py [--quick | --headline]

(``--quick``: reduced sweep, no n = 2048 gradient run, under two minutes on a
2-core CPU.) The SSM decoders come in two forms, the full n modes (``ssm``)
and the half-state conversion with n/2 complex modes (``ssm_half``, from
``etsc(t, half=True)``), which computes the same function; the script prints
the per-token speed-up of the half form.

Prints tables of medians, writes benchmarks/results/toeplitz.json and
benchmarks/results/toeplitz_fig2.png, toeplitz_fig3.png. ``--headline`` runs
only the n = 2048 ETSC-vs-gradient comparison (same d, compilation excluded
for both) and writes benchmarks/results/toeplitz_headline.json. A quick run's
names have _quick after "toeplitz", and on a GPU every name ends in _gpu, so
that one device's results never replace another's; the JSON records the
device, the JAX and jaxlib versions and the CPU model.

Timing is like for like: ETSC and the gradient fit run at the same d, each
warmed up once (so neither time includes compilation) before being timed.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import time

import jax
import jax.numpy as jnp
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from annotated_s4.timing import device_info, result_stem, time_fn  # noqa: E402
from annotated_s4.decoders import CacheDecoder, FFTDecoder, SSMDecoder  # noqa: E402
from annotated_s4.toeplitz import etsc, fit_toeplitz_gradient, ssm_to_toeplitz  # noqa: E402

RESULTS = pathlib.Path(__file__).parent / "results"


def kernel(n, d, seed=0):
    t = jax.random.normal(jax.random.PRNGKey(seed), (n, d))
    return t * jnp.exp(-3 * jnp.arange(n) / n)[:, None]


def rel(a, b):
    return float(jnp.linalg.norm(a - b) / jnp.linalg.norm(b))


def run_etsc(n, d):
    t = kernel(n, d)
    f = jax.jit(etsc)
    seconds = time_fn(f, t, warmup=1, repeats=5)
    lambd, b = f(t)
    return {"n": n, "d": d, "seconds": seconds, "rel_error": rel(ssm_to_toeplitz(lambd, b, n), t)}


def run_gradient(n, d, steps, repeats=1):
    """Gradient fit with h = n states; the first (compiling) call is timed
    separately and excluded from `seconds`."""
    t = kernel(n, d)

    def fit():
        return fit_toeplitz_gradient(t, n, steps=steps, lr=1e-2)

    start = time.perf_counter()
    lambd, b, losses = jax.block_until_ready(fit())
    first = time.perf_counter() - start
    seconds = time_fn(fit, warmup=0, repeats=repeats)
    t_pred = ssm_to_toeplitz(lambd, b, n)
    return {"n": n, "d": d, "steps": steps, "seconds": seconds,
            "first_call_seconds": first, "rel_error": rel(t_pred, t),
            "final_loss": float(losses[-1])}


def headline(steps):
    """ETSC vs gradient at n = 2048, d = 1 (the largest d the gradient's
    n * h * d Vandermonde tensor allows on a CPU), same d for both."""
    e, g = run_etsc(2048, 1), run_gradient(2048, 1, steps)
    out = {"etsc": e, "gradient": g, "time_ratio": g["seconds"] / e["seconds"]}
    print(f"n = 2048, d = 1, h = n, {steps} Adam steps (compilation excluded for both):")
    print(f"  ETSC     {e['seconds']:.3g} s   relative error {e['rel_error']:.2g}")
    print(f"  gradient {g['seconds']:.3g} s   relative error {g['rel_error']:.2g} "
          f"(first call, with compilation: {g['first_call_seconds']:.3g} s)")
    print(f"  time ratio gradient / ETSC: {out['time_ratio']:.3g}")
    return out


def fig2(quick, steps=None):
    ns = [64, 256, 1024, 8192] if quick else [64, 128, 256, 512, 1024, 2048, 4096, 8192]
    ds = [64, 4096] if quick else [64, 256, 1024, 4096, 16384]
    steps = steps or (50 if quick else 300)
    budget = 2 ** 22 if quick else 2 ** 24  # n * h * d complex entries per step
    out = {"a": [], "b": [], "gradient_a": [], "gradient_b": [], "steps": steps,
           "gradient_budget": budget}
    for n in ns:
        out["a"].append(run_etsc(n, 64))
        if n * n * 64 <= budget:
            out["gradient_a"].append(run_gradient(n, 64, steps))
    for d in ds:
        out["b"].append(run_etsc(2048, d))
        if 2048 * 2048 * d <= budget:
            out["gradient_b"].append(run_gradient(2048, d, steps))
    if not quick:  # the headline comparison at n = 2048: one channel, the largest that fits
        out["n2048_single_channel"] = headline(steps)
    return out


def decoder_stack(kind, n, d, layers, h_fixed):
    """`layers` decoders in sequence (layer l's output feeds layer l+1)."""
    decs = []
    for l in range(layers):
        t = kernel(n, d, seed=l)
        if kind == "fft":
            decs.append(FFTDecoder(t))
        elif kind == "cache":
            decs.append(CacheDecoder(t))
        elif kind == "ssm":  # exact: h = n states
            decs.append(SSMDecoder(*etsc(t)))
        elif kind == "ssm_half":  # exact, n/2 complex modes (conjugate pairs): same kernel
            decs.append(SSMDecoder(*etsc(t, half=True)))
        elif kind == "ssm_fixed":  # a fixed state size: the first h_fixed lags converted
            decs.append(SSMDecoder(*etsc(t[:h_fixed])))
        else:  # ssm_fixed_half: the same, h_fixed/2 complex modes
            decs.append(SSMDecoder(*etsc(t[:h_fixed], half=True)))
    return decs


def fixed_state_error(n, d, h_fixed):
    """Relative error of the ssm_fixed decoders' kernel against the full one at
    length n (0 when n <= h_fixed): converted from the first h_fixed lags, the
    SSM's roots of unity repeat its kernel every h_fixed lags beyond them (it
    does not stop there), so it computes a different function."""
    t = kernel(n, d)
    if n <= h_fixed:
        return 0.0
    return rel(ssm_to_toeplitz(*etsc(t[:h_fixed], half=True), n), t)


def per_token(kind, n, d, layers, h_fixed=512, tokens=32):
    decs = decoder_stack(kind, n, d, layers, h_fixed)

    def run(states, xs):
        def body(states, x):
            new = []
            for dec, s in zip(decs, states):
                s, x = dec.step(s, x)
                new.append(s)
            return new, x
        return jax.lax.scan(body, states, xs)

    states = [dec.empty_cache() for dec in decs]
    # start late in the sequence: position n - tokens (matters for FFT/Cache
    # only through masking; their arrays are sized n from the start)
    if kind in ("fft", "cache"):
        states = [(s[0], jnp.asarray(n - tokens, jnp.int32)) for s in states]
    xs = jax.random.normal(jax.random.PRNGKey(9), (tokens, d))
    f = jax.jit(run)
    seconds = time_fn(f, states, xs, warmup=1, repeats=5) / tokens
    mem = f.lower(states, xs).compile().memory_analysis()
    state_bytes = sum(x.nbytes for x in jax.tree_util.tree_leaves(states))
    kernel_bytes = sum(x.nbytes for dec in decs for x in jax.tree_util.tree_leaves(
        [getattr(dec, a) for a in ("t", "t_hat", "t_rev_padded", "b", "roots") if hasattr(dec, a)]))
    return {"kind": kind, "n": n, "d": d, "layers": layers, "seconds_per_token": seconds,
            "fixed_state_kernel_error": (fixed_state_error(n, d, h_fixed)
                                        if kind.startswith("ssm_fixed") else 0.0),
            "state_bytes": state_bytes, "model_bytes": kernel_bytes,
            "temp_bytes": int(getattr(mem, "temp_size_in_bytes", 0) or 0)}


KINDS = ["fft", "cache", "ssm", "ssm_half", "ssm_fixed", "ssm_fixed_half"]


def fig3(quick):
    ns = [512, 2048, 8192] if quick else [256, 512, 1024, 2048, 4096, 8192, 16384]
    ds = [16, 128] if quick else [16, 32, 64, 128, 256, 512]
    ls = [1, 4] if quick else [1, 2, 4, 8]
    out = {"n": [], "d": [], "layers": [], "h_fixed": 512}
    for n in ns:
        for k in KINDS:
            out["n"].append(per_token(k, n, 64, 2))
    for d in ds:
        for k in KINDS:
            out["d"].append(per_token(k, 2048, d, 2))
    for L in ls:
        for k in KINDS:
            out["layers"].append(per_token(k, 2048, 64, L))
    return out


def table(rows, keys):
    print("  ".join(f"{k:>14}" for k in keys))
    for r in rows:
        print("  ".join(f"{r[k]:>14.4g}" if isinstance(r[k], float) else f"{r[k]:>14}" for k in keys))


def plot(res, stem):
    f2 = res["fig2"]
    fig, ax = plt.subplots(1, 4, figsize=(17, 3.6))
    for key, x, col, title in (("a", "n", 0, "d = 64"), ("b", "d", 2, "n = 2048")):
        e, g = f2[key], f2["gradient_" + key]
        ax[col].loglog([r[x] for r in e], [r["seconds"] for r in e], "o-", label="ETSC")
        ax[col + 1].loglog([r[x] for r in e], [r["rel_error"] for r in e], "o-", label="ETSC")
        if g:
            ax[col].loglog([r[x] for r in g], [r["seconds"] for r in g], "s-", label="gradient")
            ax[col + 1].loglog([r[x] for r in g], [r["rel_error"] for r in g], "s-", label="gradient")
        ax[col].set(xlabel=x, ylabel="seconds", title=f"time, {title}")
        ax[col + 1].set(xlabel=x, ylabel="relative error", title=f"error, {title}",
                        ylim=(1e-8, 3))
        ax[col].legend()
    fig.tight_layout()
    fig.savefig(RESULTS / f"{stem}_fig2.png", dpi=110)
    f3 = res["fig3"]
    fig, ax = plt.subplots(2, 3, figsize=(14, 7))
    for col, key in enumerate(("n", "d", "layers")):
        for k in KINDS:
            rows = [r for r in f3[key] if r["kind"] == k]
            xs = [r[key] for r in rows]
            ax[0, col].loglog(xs, [r["seconds_per_token"] * 1e3 for r in rows], "o-", label=k)
            ax[1, col].loglog(xs, [(r["state_bytes"] + r["temp_bytes"]) / 2 ** 20 for r in rows],
                              "o-", label=k)
        ax[0, col].set(xlabel=key, ylabel="ms per token")
        ax[1, col].set(xlabel=key, ylabel="state + temporaries (MiB)")
    ax[0, 0].legend()
    fig.tight_layout()
    fig.savefig(RESULTS / f"{stem}_fig3.png", dpi=110)


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="reduced sweep (CPU CI)")
    parser.add_argument("--headline", action="store_true",
                        help="only ETSC vs gradient at n = 2048 (time ratio and errors)")
    parser.add_argument("--steps", type=int, default=None, help="Adam steps for the gradient")
    args = parser.parse_args()
    RESULTS.mkdir(parents=True, exist_ok=True)
    if args.headline:
        res = {"backend": jax.default_backend(), "device": device_info(),
               **headline(args.steps or 300)}
        path = RESULTS / f"{result_stem('toeplitz_headline')}.json"
        path.write_text(json.dumps(res, indent=1))
        print(f"wrote {path}")
        return
    res = {"backend": jax.default_backend(), "device": device_info(), "quick": args.quick}
    stem = result_stem("toeplitz", args.quick)
    res["fig2"] = fig2(args.quick, args.steps)
    print("Figure 2 (a): d = 64")
    table(res["fig2"]["a"], ["n", "seconds", "rel_error"])
    print("gradient:")
    table(res["fig2"]["gradient_a"], ["n", "seconds", "rel_error"])
    print("Figure 2 (b): n = 2048")
    table(res["fig2"]["b"], ["d", "seconds", "rel_error"])
    print("gradient:")
    table(res["fig2"]["gradient_b"], ["d", "seconds", "rel_error"])
    res["fig3"] = fig3(args.quick)
    for key in ("n", "d", "layers"):
        print(f"Figure 3: per-token decoding against {key}")
        rows = res["fig3"][key]
        base = {(r[key]): r["seconds_per_token"] for r in rows if r["kind"] == "ssm_fixed"}
        for r in rows:
            r["ratio_to_ssm_fixed"] = r["seconds_per_token"] / base[r[key]]
        table(rows, ["kind", key, "seconds_per_token", "ratio_to_ssm_fixed", "state_bytes",
                     "temp_bytes", "fixed_state_kernel_error"])
    # half the states: n/2 complex modes + 2 Re(...) against the full n modes
    res["half_speedup"] = {}
    for key in ("n", "d", "layers"):
        rows = res["fig3"][key]
        sec = {(r["kind"], r[key]): r["seconds_per_token"] for r in rows}
        res["half_speedup"][key] = [
            {key: x, "exact_full_over_half": sec[("ssm", x)] / sec[("ssm_half", x)],
             "fixed_full_over_half": sec[("ssm_fixed", x)] / sec[("ssm_fixed_half", x)]}
            for x in sorted({r[key] for r in rows})]
        print(f"half-state speed-up (full / half seconds per token) against {key}")
        table(res["half_speedup"][key], [key, "exact_full_over_half", "fixed_full_over_half"])
    (RESULTS / f"{stem}.json").write_text(json.dumps(res, indent=1))
    plot(res, stem)
    print(f"wrote {RESULTS / stem}.json, {stem}_fig2.png and {stem}_fig3.png")


if __name__ == "__main__":
    main()
