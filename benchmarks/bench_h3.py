"""H3 vs causal softmax attention: layer time, peak memory, generation throughput.

1. Forward and forward+backward time of one layer (d_model 256, batch 1; H3
   with head_dim 1 and state size 64, i.e. 32 complex modes per diagonal SSM,
   the H3 authors' defaults; attention with 2 heads, as the
   memory-efficient `flash_attention` in blocks of FLASH_BLOCK positions (the
   baseline) and as the plain form that stores the L x L scores; on an NVIDIA
   GPU also as JAX's fused cuDNN kernel in bfloat16, `fused_attention`, which
   is skipped, and said to be, on any other backend) at
   L = 2048, 4096, 8192, 16384 (``--quick``: 512, 1024, 2048), and the peak
   memory of the compiled programs (XLA's own accounting of arguments,
   outputs and temporaries), by `annotated_s4.timing.layer_scaling`, the
   function chapter 7's figure calls. Prints the crossover lengths (the first
   L from which H3 stays faster, or smaller, at every longer L measured)
   against each attention, and the attention/H3 ratios at every L.
2. Generation throughput (tokens/s after the prompt) of a 2-layer model in RNN
   mode, H3's fixed-size state against attention's key-value cache, after
   prompts of 512 and 4096 tokens (batch 8, d_model 256, 128 new tokens;
   ``--quick``: 32), by `annotated_s4.timing.generation_throughput`: the
   prompt is fed once and excluded, every timed run decodes from the same
   state, and the runs alternate between configurations (median of 9 rounds;
   ``--quick``: 7).

Writes benchmarks/results/h3.json (chapter 7 loads the committed copy of the
full run, measured on a CPU) and h3_scaling.png; ``--quick`` writes
h3_quick.json and h3_quick_scaling.png instead; on a GPU the names end in
_gpu (h3_gpu.json), so a GPU's results never replace the CPU's. The JSON
records the device, the JAX and jaxlib versions and the CPU model
(`annotated_s4.timing.device_info`). Timings vary with the machine and its
load; the ratios are what to compare.

``--lengths L ...`` sweeps those lengths instead, and writes where ``--quick``
writes.

    python benchmarks/bench_h3.py [--quick] [--lengths L ...]
"""

from __future__ import annotations

import argparse
import json
import pathlib

import jax
from flax import nnx

from annotated_s4 import CausalSelfAttention, H3Layer, StackedModel
from annotated_s4.timing import (crossover, device_info, generation_throughput, layer_scaling,
                                 result_stem)

RESULTS = pathlib.Path(__file__).resolve().parent / "results"
D_MODEL, HEAD_DIM, STATE_SIZE, N_HEADS, VOCAB = 256, 1, 64, 2, 64
FLASH_BLOCK = 512
ATTENTIONS = ("flash attention", "attention")    # the baseline first
FUSED = "cuDNN attention (bfloat16)"             # a GPU's fused kernel, where there is one


def h3_layer(H, rngs):
    return H3Layer(H, rngs=rngs, head_dim=HEAD_DIM, state_size=STATE_SIZE)


def attention_layer(H, rngs, max_len, flash_block=None, fused=False):
    return CausalSelfAttention(H, rngs=rngs, n_heads=N_HEADS, max_len=max_len,
                               flash_block=flash_block, fused=fused)


def attentions():
    """The attention forms measured here: the fused kernel only on a GPU."""
    return ATTENTIONS + ((FUSED,) if jax.default_backend() == "gpu" else ())


def layer_sweep(lengths, repeats):
    layers = {"H3": h3_layer(D_MODEL, nnx.Rngs(0)),
              "flash attention": attention_layer(D_MODEL, nnx.Rngs(0), max(lengths), FLASH_BLOCK),
              "attention": attention_layer(D_MODEL, nnx.Rngs(0), max(lengths))}
    if FUSED in attentions():
        layers[FUSED] = attention_layer(D_MODEL, nnx.Rngs(0), max(lengths), fused=True)
    return layer_scaling(layers, lengths, D_MODEL, repeats=repeats,
                         log=lambda line: print(line, flush=True))


def generation(prompts, n_new, batch, repeats):
    def model(layer):
        return lambda max_len: StackedModel(
            lambda H, rngs: layer(H, rngs, max_len), VOCAB, D_MODEL, 2, rngs=nnx.Rngs(0),
            vocab_size=VOCAB, classification=False)

    return generation_throughput(
        {"H3": model(lambda H, rngs, max_len: h3_layer(H, rngs)),
         "attention": model(attention_layer)},
        prompts, n_new, batch=batch, repeats=repeats, log=lambda line: print(line, flush=True))


def summarize(rows, gen, lengths, prompts):
    table = {}
    for r in rows:
        table.setdefault(r["L"], {})[r["layer"]] = r
    keys = ("forward_s", "forward_backward_s", "forward_peak_bytes", "forward_backward_peak_bytes")
    ratios = {
        name: {str(L): {key: t[name][key] / t["H3"][key] for key in keys
                        if t["H3"].get(key) and t[name].get(key)}
               for L, t in sorted(table.items())}
        for name in attentions()}
    tps = {str(P): {r["layer"]: r["tokens_per_s"] for r in gen if r["prompt"] == P}
           for P in prompts}
    first, last = str(min(prompts)), str(max(prompts))
    return {
        "crossover_L": {
            name: {key: crossover(rows, key, slow=name)
                   for key in ("forward_s", "forward_backward_s", "forward_backward_peak_bytes")}
            for name in attentions()},
        "attention_over_H3": ratios,
        "L_max": max(lengths),
        "generation_tokens_per_s": tps,
        "generation_change_from_prompt": {
            name: tps[last][name] / tps[first][name] - 1 for name in ("H3", "attention")},
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="reduced sweep (about a minute)")
    parser.add_argument("--lengths", type=int, nargs="+", metavar="L",
                        help="the layer sweep's lengths, in place of the sweep's own "
                             "(e.g. a GPU lent for a few minutes: --lengths 2048 4096 8192)")
    args = parser.parse_args(argv)
    if args.quick:
        lengths, repeats, prompts, n_new, batch, rounds = [1024, 2048], 2, [512, 4096], 32, 8, 7
    else:
        lengths, repeats, prompts, n_new, batch, rounds = (
            [2048, 4096, 8192, 16384], 5, [512, 4096], 128, 8, 9)
    if args.lengths:
        if any(L < 2 for L in args.lengths):
            parser.error(f"--lengths must be at least 2, got {args.lengths}")
        lengths = sorted(set(args.lengths))
    device = device_info()
    print(f"device {device['device_kind']} ({device['platform']}), CPU {device['cpu']}, "
          f"jax {device['jax']}; d_model {D_MODEL}, H3 head_dim {HEAD_DIM} "
          f"state {STATE_SIZE}, attention heads {N_HEADS}, batch 1")
    rows = layer_sweep(lengths, repeats)
    gen = generation(prompts, n_new, batch, rounds)
    summary = summarize(rows, gen, lengths, prompts)

    peak = lambda r: (r.get("forward_backward_peak_bytes") or 0) / 2**20  # noqa: E731
    skipped = {} if FUSED in attentions() else {
        FUSED: f"needs an NVIDIA GPU; the backend is {jax.default_backend()}"}
    for name in attentions():
        print(f"\n{name} against H3")
        print("     L   H3 fwd (ms)  attn fwd (ms)  attn/H3   H3 f+b (ms)  attn f+b (ms)  attn/H3"
              "  H3 peak (MiB)  attn peak (MiB)")
        for L in lengths:
            h, a = (next(r for r in rows if r["L"] == L and r["layer"] == n) for n in ("H3", name))
            print(f"{L:6d} {h['forward_s'] * 1e3:12.1f} {a['forward_s'] * 1e3:14.1f} "
                  f"{a['forward_s'] / h['forward_s']:8.2f} {h['forward_backward_s'] * 1e3:13.1f} "
                  f"{a['forward_backward_s'] * 1e3:14.1f} "
                  f"{a['forward_backward_s'] / h['forward_backward_s']:8.2f} "
                  f"{peak(h):14.1f} {peak(a):16.1f}")
    for name, why in skipped.items():
        print(f"\n{name}: skipped ({why})")
    print("\nprompt   H3 tokens/s   attention tokens/s   H3/attention")
    for P, t in summary["generation_tokens_per_s"].items():
        print(f"{P:>6} {t['H3']:13.0f} {t['attention']:20.0f} {t['H3'] / t['attention']:14.2f}")
    print("\n" + json.dumps({k: v for k, v in summary.items() if k != "attention_over_H3"}, indent=1))

    RESULTS.mkdir(parents=True, exist_ok=True)
    out = {"command": "python benchmarks/bench_h3.py" + (" --quick" if args.quick else "")
           + (" --lengths " + " ".join(map(str, lengths)) if args.lengths else ""),
           "backend": jax.default_backend(), "device": device, "quick": args.quick,
           "skipped": skipped,
           "config": {"d_model": D_MODEL, "head_dim": HEAD_DIM, "state_size": STATE_SIZE,
                      "attention_heads": N_HEADS, "flash_block": FLASH_BLOCK, "layer_batch": 1, "generation_batch": batch,
                      "new_tokens": n_new, "repeats": repeats, "generation_rounds": rounds},
           "layers": rows, "generation": gen, "summary": summary}
    # a quick run, or one of other lengths, never replaces the full results, nor a GPU's
    # the CPU's
    stem = result_stem("h3", args.quick or bool(args.lengths))
    (RESULTS / f"{stem}.json").write_text(json.dumps(out, indent=1))
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return out
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    for ax, key, title in ((axes[0], "forward_s", "forward"),
                           (axes[1], "forward_backward_s", "forward + backward")):
        for name in ("H3",) + attentions():
            ax.loglog([r["L"] for r in rows if r["layer"] == name],
                      [r[key] for r in rows if r["layer"] == name], "o-", base=2, label=name)
        ax.set(xlabel="sequence length L", ylabel="seconds",
               title=f"{title}, d_model {D_MODEL}, {device['device_kind']}")
        ax.legend()
    fig.tight_layout()
    fig.savefig(RESULTS / f"{stem}_scaling.png", dpi=100)
    return out


if __name__ == "__main__":
    main()
