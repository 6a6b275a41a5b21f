"""Wall-clock timing shared by the benchmarks and the chapters' speed figures.

The benchmark scripts run the full sweeps; the chapters call the same functions
on short sweeps, so a figure in the book is produced by the benchmark's own
measuring code. These are harnesses: the chapters call them, they do not show them.
"""

from __future__ import annotations

import functools
import importlib.metadata
import os
import platform
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from . import _checks as checks
from .hippo import make_DPLR_HiPPO
from .layers import S4Layer
from .s4 import K_gen_inverse, conv_from_gen, hippo_ssm, kernel_DPLR
from .ssd import SSD_ALGORITHMS
from .ssm import K_conv, causal_convolution, discretize, random_SSM, scan_SSM

__all__ = ["time_fn", "peak_bytes", "training_peak_bytes", "convolution_timings",
           "layer_scaling", "crossover", "KERNELS", "kernel_fns", "layer_kernel_fn",
           "kernel_scaling", "loglog_slope", "linearity", "generation_throughput", "op_count",
           "device_info", "result_stem", "ssd_inputs", "ssd_timings"]


def _cpu_model():
    """The host processor's name, from /proc/cpuinfo (Linux) or `platform`."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip().lower() in ("model name", "hardware", "cpu model"):
                    return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or None


def _version(package):
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def device_info():
    """What a measurement ran on, for a benchmark to record beside its
    timings: JAX's platform ("cpu", "gpu", "tpu"), the kind and number of its
    devices, the JAX and jaxlib versions (and the CUDA plugin's, if any),
    and the host's CPU model and the cores this process may use."""
    device = jax.devices()[0]
    info = {"platform": device.platform, "device_kind": device.device_kind,
            "device_count": jax.device_count(), "jax": jax.__version__,
            "jaxlib": _version("jaxlib"), "cpu": _cpu_model(),
            "cpu_cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
            else os.cpu_count()}
    plugins = {p: v for p in ("jax-cuda13-plugin", "jax-cuda12-plugin")
               if (v := _version(p)) is not None}
    if plugins:
        info["cuda_plugin"] = plugins
    return info


def result_stem(stem, quick=False, platform_name=None):
    """The name (without extension) a benchmark writes its results under:
    `stem`, then ``_quick`` for a reduced sweep, then the platform for any
    platform but the CPU (``h3_gpu``), so that results measured on one kind
    of device never replace another's."""
    platform_name = platform_name or jax.default_backend()
    return stem + ("_quick" if quick else "") + ("" if platform_name == "cpu"
                                                 else f"_{platform_name}")


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


def op_count(fn, *args):
    """XLA's count of the work in `fn(*args)`: a dict with the floating-point
    operations ("flops") and the transcendental functions, exp, log, sin and the
    like ("transcendentals").

    Counted on the program as traced and lowered for the CPU, before the
    compiler rewrites it, whatever device the arrays live on: the arguments
    enter only by their shapes and dtypes (`jax.ShapeDtypeStruct`s, which may
    also be passed directly), so the same program gives the same count on
    every machine, where a time does not. (A GPU's lowered program has no
    such count: its PJRT plugin offers one only after compilation, which has
    already rewritten the program.) A loop body (`jax.lax.scan`) is counted
    once, whatever its number of iterations: count a recurrence by its step.
    The matrix products' precision does not enter the count (a GPU's TF32
    rounds inside its multipliers, adding no operation), so the program is
    lowered at float32 precision, which also keeps `precision.emulate_tf32`'s
    rounding operations out of it.
    """
    abstract = jax.tree.map(_abstract, args)
    with (jax.default_device(jax.local_devices(backend="cpu")[0]),
          jax.default_matmul_precision("float32")):
        lowered = jax.jit(fn).trace(*abstract).lower(lowering_platforms=("cpu",))
        cost = lowered.cost_analysis()
    if isinstance(cost, (list, tuple)):      # some JAX versions: one dict per device
        cost = cost[0]
    if not cost:
        raise RuntimeError("XLA gave no operation count for the program lowered for the CPU")
    return {key: float(cost.get(key, 0.0)) for key in ("flops", "transcendentals")}


def _abstract(x):
    """The shape and dtype of an argument (weak type included), with no device."""
    t = x if isinstance(x, jax.ShapeDtypeStruct) else jax.typeof(x)
    return jax.ShapeDtypeStruct(t.shape, t.dtype, weak_type=t.weak_type)


def convolution_timings(lengths, N=64, repeats=5, seed=3):
    """Three ways to apply an N-state SSM to a sequence of each length L.

    A random SSM made stable (A - N I), so outputs stay finite at every
    length. For each L: median seconds of the zero-padded FFT convolution
    with the kernel K, of the direct causal sum, and of the recurrence by
    `jax.lax.scan` (`scan_SSM`) on the discretized matrices, all jitted, each
    from what it is given (K, or Ab, Bb, Cb), none building it
    (benchmarks/bench_convolution.py runs the full sweep).
    The FFT and scan outputs are checked to agree, relative to the output's size.
    Returns a list of dicts with keys L, fft_s, direct_s, scan_s, and the work
    of each, XLA's count of floating-point operations (`op_count`): fft_flops,
    direct_flops, scan_flops (for the scan, L times the count of one step:
    XLA counts a loop's body once).
    """
    A, B, C = random_SSM(jax.random.PRNGKey(seed), N)
    A = A - N * jnp.eye(N)
    fft = jax.jit(lambda u, K: causal_convolution(u, K))
    direct = jax.jit(lambda u, K: causal_convolution(u, K, nofft=True))
    # the scan, like the FFT on a given K, starts from given matrices (Ab, Bb, Cb)
    scan = jax.jit(lambda Ab, Bb, Cb, u: scan_SSM(Ab, Bb, Cb, u[:, None], jnp.zeros(N))[1][:, 0])
    one_step = op_count(scan, *discretize(A, B, C, dt=1.0), jnp.zeros(1))["flops"]
    rows = []
    for L in lengths:
        u = jax.random.normal(jax.random.PRNGKey(seed + 1), (L,))
        # the check is float32's: in TF32 (a GPU's default) the two differ by far more
        with jax.default_matmul_precision("float32"):
            discrete = discretize(A, B, C, 1.0 / L)
            K = K_conv(*discrete, L)
            y_fft, y_scan = fft(u, K), scan(*discrete, u)
        if not jnp.allclose(y_fft, y_scan, atol=1e-4 * float(jnp.abs(y_scan).max())):
            raise RuntimeError(f"FFT convolution and scan disagree at L = {L}")
        rows.append({"L": L,
                     "fft_s": time_fn(fft, u, K, repeats=repeats),
                     "direct_s": time_fn(direct, u, K, repeats=repeats),
                     "scan_s": time_fn(scan, *discrete, u, repeats=repeats),
                     "fft_flops": op_count(fft, u, K)["flops"],
                     "direct_flops": op_count(direct, u, K)["flops"],
                     "scan_flops": L * one_step})
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


def _layer_programs(layer):
    """(state, fwd, fwd_bwd) for an NNX layer: its state, and pure functions of
    (state, u) for the forward pass and for the gradient of the summed output
    with respect to the state and u (one training step's work)."""
    graph, state = nnx.split(layer)

    def fwd(state, u):
        return nnx.merge(graph, state)(u)

    def fwd_bwd(state, u):
        return jax.grad(lambda s, u: fwd(s, u).sum(), argnums=(0, 1))(state, u)

    return state, fwd, fwd_bwd


def training_peak_bytes(layer, u):
    """`peak_bytes` of the layer's forward+backward pass on u (the gradient
    of the summed output with respect to the parameters and u), as
    `layer_scaling` reports it; compiles, does not run."""
    state, _, fwd_bwd = _layer_programs(layer)
    return peak_bytes(fwd_bwd, state, u)


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
    if not layers:
        raise ValueError("layers must name at least one layer")
    lengths = list(lengths)
    if not lengths or any(isinstance(L, bool) or int(L) != L or L < 1 for L in lengths):
        raise ValueError(f"lengths must be positive ints, got {lengths}")
    rows = []
    for L in lengths:
        u = jax.random.normal(jax.random.PRNGKey(0), (batch, int(L), d_model))
        for name, layer in layers.items():
            state, fwd, fwd_bwd = _layer_programs(layer)
            row = {"layer": name, "L": int(L),
                   "forward_s": time_fn(jax.jit(fwd), state, u, repeats=repeats)}
            if backward:
                row["forward_backward_s"] = time_fn(jax.jit(fwd_bwd), state, u, repeats=repeats)
            if memory:
                row["forward_peak_bytes"] = peak_bytes(fwd, state, u)
                if backward:
                    row["forward_backward_peak_bytes"] = training_peak_bytes(layer, u)
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


# --------------------------------------------------------------------------
# The S4 kernel (benchmarks/bench_s4.py)
# --------------------------------------------------------------------------
#: The kernel computations `kernel_scaling` knows, in the order S4 derives them.
KERNELS = ("naive", "generating_function", "dplr", "dplr_H_channels")


def kernel_fns(N, L):
    """The three kernel computations for the HiPPO SSM (float32), as jitted thunks.

    naive: the power iteration `K_conv`, O(N^2 L), L dependent steps;
    generating_function: `K_gen_inverse` at the L roots of unity, one N x N
    solve per root, O(N^3 L); dplr: `kernel_DPLR`, O(N L) Cauchy sums + FFT.
    """
    N, L = checks.positive_int(N, "N"), checks.positive_int(L, "L")
    dt = 1.0 / L
    C0 = np.random.RandomState(0).randn(N) / np.sqrt(N)
    Ab, Bb, Cb = hippo_ssm(N, C0, dt, jnp.float32)
    Lambda, P, B, _ = make_DPLR_HiPPO(N)
    c64 = lambda x: jnp.asarray(x, jnp.complex64)  # noqa: E731
    Ct = c64(np.random.RandomState(1).randn(N))
    naive = jax.jit(lambda: K_conv(Ab, Bb, Cb, L))
    gen = jax.jit(lambda: conv_from_gen(K_gen_inverse(Ab, Bb, Cb, L), L))
    dplr = jax.jit(lambda: kernel_DPLR(c64(Lambda), c64(P), c64(P), c64(B), Ct, dt, L))
    return {"naive": naive, "generating_function": gen, "dplr": dplr}


def layer_kernel_fn(H, N, L):
    """The H-channel DPLR kernel of an S4Layer's parameters (what CNN mode computes).

    Jitted as a pure function of the parameters, so that the time is the
    kernel's and not the module bookkeeping of `nnx.jit` (a few ms per call).
    """
    Lambda, P, B, C, dt = S4Layer(H, N, L, rngs=nnx.Rngs(0)).ssm_params()

    @jax.jit
    def kernel(Lambda, P, B, C, dt):
        return jax.vmap(lambda C, s: kernel_DPLR(Lambda, P, P, B, C, s, L, conj=True))(C, dt)

    return lambda: kernel(Lambda, P, B, C, dt)


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
    lengths = [checks.positive_int(L, "L") for L in lengths]
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


# --------------------------------------------------------------------------
# Generation throughput in RNN mode (benchmarks/bench_h3.py)
# --------------------------------------------------------------------------
def _prefilled_decoder(model, prompt, n_new):
    """(decode, state, token): `model` (in RNN mode, cache initialised) fed
    `prompt` (batch, prompt length) once, compiled; decode(state, token) then generates
    `n_new` tokens greedily from that state in one compiled `nnx.scan` and
    returns the last, so every call starts from the same state."""
    graph, state = nnx.split(model)

    def greedy(model, tok):             # one step; the most likely next token
        return model, model.step(tok).argmax(-1).astype(jnp.int32)

    def feed(state, tokens):            # tokens (T, batch) in; the state after them
        model = nnx.merge(graph, state)
        model, out = nnx.scan(greedy, in_axes=(nnx.Carry, 0),
                              out_axes=(nnx.Carry, 0))(model, tokens)
        return nnx.state(model), out[-1]

    def decode(state, tok):             # feed back the argmax n_new times
        model = nnx.merge(graph, state)

        def feedback(carry, _):
            model, nxt = greedy(*carry)
            return (model, nxt), nxt

        (_, last), _ = nnx.scan(feedback, in_axes=(nnx.Carry, None),
                                out_axes=(nnx.Carry, 0), length=n_new)((model, tok), None)
        return last

    start = jnp.full((prompt.shape[0], 1), model.start_token, jnp.int32)
    state, tok = jax.block_until_ready(
        jax.jit(feed)(state, jnp.concatenate([start, prompt], 1).T))
    return jax.jit(decode), state, tok


def generation_throughput(models, prompts, n_new, *, batch=8, repeats=3, seed=1, log=None):
    """Tokens per second of greedy decoding after prompts of several lengths.

    `models` maps a name to a function of max_len that builds a next-token
    `StackedModel` (with vocab_size) able to hold max_len positions. For every
    name and prompt length: the prompt is fed once in RNN mode (prefill,
    compiled, not timed); then `n_new` tokens are generated from the state it
    left (`_prefilled_decoder`). The runs go round-robin over all (name, prompt
    length) pairs, `repeats` + 1 rounds, the first round compiling and not
    counted, so that a slow period of the machine does not fall on one
    configuration only. Returns rows with layer, prompt, new_tokens, batch,
    decode_s (median) and tokens_per_s.
    """
    n_new, batch = checks.positive_int(n_new, "n_new"), checks.positive_int(batch, "batch")
    repeats = checks.positive_int(repeats, "repeats")
    runs = {}
    for name, make_model in models.items():
        for length in prompts:
            length = checks.positive_int(length, "prompt length")
            model = make_model(length + n_new + 1)
            model.eval()
            model.init_cache(batch)
            prompt = jax.random.randint(jax.random.PRNGKey(seed), (batch, length), 0,
                                        model.vocab_size)
            runs[name, length] = (*_prefilled_decoder(model, prompt, n_new), [])
    for round_ in range(repeats + 1):
        for decode, state, tok, times in runs.values():
            t0 = time.perf_counter()
            jax.block_until_ready(decode(state, tok))
            if round_:                                   # round 0 compiles
                times.append(time.perf_counter() - t0)
    rows = []
    for (name, length), (*_, times) in runs.items():
        seconds = statistics.median(times)
        rows.append({"layer": name, "prompt": length, "new_tokens": n_new, "batch": batch,
                     "repeats": repeats, "decode_s": seconds,
                     "tokens_per_s": batch * n_new / seconds})
        if log:
            log(f"  prompt {length:5d} {name:10s} {batch * n_new / seconds:10.0f} tokens/s")
    return rows


def ssd_inputs(L, *, batch=1, H=4, P=16, N=16, seed=0):
    """Random X, a, B, C of one SSD layer, as Mamba-2 makes them: steps
    Delta = softplus(normal - 4) (about 0.02), one decay rate A_h per head
    between -1 and -e^2, a = Delta A, X = Delta x."""
    kx, kd, kb, kc = jax.random.split(jax.random.PRNGKey(seed), 4)
    dt = jax.nn.softplus(jax.random.normal(kd, (batch, L, H)) - 4.0)
    A = -jnp.exp(jnp.linspace(0.0, 2.0, H))
    X = jax.random.normal(kx, (batch, L, H, P)) * dt[..., None]
    return (X, dt * A, jax.random.normal(kb, (batch, L, H, N)),
            jax.random.normal(kc, (batch, L, H, N)))


def ssd_timings(lengths, *, chunk=64, quadratic_max_L=4096, repeats=5, log=None, **sizes):
    """Seconds per call (median, `time_fn`) of each of `ssd.SSD_ALGORITHMS`,
    jitted, on `ssd_inputs(L, **sizes)` for each L of `lengths`: a list of rows
    {"L": L, name: seconds}, the dual form None beyond `quadratic_max_L` (its
    matrix M alone holds H L^2 numbers). `log(row)` is called after each row."""
    chunk = checks.positive_int(chunk, "chunk")
    fns = {name: jax.jit(functools.partial(fn, chunk=chunk)) for name, fn in SSD_ALGORITHMS.items()}
    rows = []
    for L in lengths:
        args, row = ssd_inputs(checks.positive_int(L, "length"), **sizes), {"L": L}
        for name, fn in fns.items():
            skip = name == "quadratic" and L > quadratic_max_L
            row[name] = None if skip else time_fn(fn, *args, repeats=repeats)
        rows.append(row)
        if log is not None:
            log(row)
    return rows
