"""H3 vs causal softmax attention: layer time, peak memory, generation throughput.

1. Forward and forward+backward time of one layer at d_model 256, batch 1, for
   L = 256 ... 16384 (``--quick``: 256 ... 2048), and the peak memory of the
   compiled program (XLA's own accounting of arguments, outputs and
   temporaries). Prints the crossover lengths (the first L from which H3
   stays faster, or smaller, at every longer L measured) and the attention/H3
   ratios of time and memory at the longest L. The measuring function is
   `annotated_s4.timing.layer_scaling`, which chapter 7 calls at small sizes.
2. Generation throughput (tokens/s) of a 2-layer model in RNN mode: H3's
   fixed-size state vs attention with a key-value cache, after prompts of 512,
   1024 and 1536 tokens, generating 128 tokens (the setting of Table 7 of the
   H3 paper, scaled down: batch 8, d_model 256; ``--quick``: 32 tokens).
   Only the generation of new tokens is timed: the prompt is fed first
   (prefill, in RNN mode) and excluded. Median of several runs after a
   warm-up run that compiles.

Writes benchmarks/results/h3.json and h3_scaling.png. Timings on a shared CPU
are noisy; compare ratios, not absolute numbers.

    python benchmarks/bench_h3.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import time

import annotated_s4  # noqa: F401  (sets the XLA flag before any computation)
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from annotated_s4 import CausalSelfAttention, H3Layer, StackedModel
from annotated_s4.timing import crossover, layer_scaling

RESULTS = pathlib.Path(__file__).resolve().parent / "results"


def make_layers(d_model, max_len, head_dim, n_heads):
    h3 = H3Layer(d_model, rngs=nnx.Rngs(0), head_dim=head_dim, state_size=64)
    attn = CausalSelfAttention(d_model, rngs=nnx.Rngs(0), n_heads=n_heads, max_len=max_len)
    return {"H3": h3, "attention": attn}


def layer_sweep(lengths, d_model, head_dim, n_heads, repeats):
    layers = make_layers(d_model, max(lengths), head_dim, n_heads)
    return layer_scaling(layers, lengths, d_model, repeats=repeats,
                         log=lambda line: print(line, flush=True))


def generation(prompts, n_new, d_model, batch, head_dim, n_heads, repeats):
    rows = []
    vocab = 64
    for name in ("H3", "attention"):
        for P in prompts:
            max_len = P + n_new + 1
            layer = ((lambda H, rngs: H3Layer(H, rngs=rngs, head_dim=head_dim, state_size=64))
                     if name == "H3" else
                     (lambda H, rngs, m=max_len: CausalSelfAttention(H, rngs=rngs, n_heads=n_heads,
                                                                    max_len=m)))
            model = StackedModel(layer, vocab, d_model, 2, rngs=nnx.Rngs(0),
                                 vocab_size=vocab, classification=False)
            model.eval()
            prompt = jax.random.randint(jax.random.PRNGKey(1), (batch, P), 0, vocab)

            @nnx.jit
            def prefill(model, prompt):
                # feed the prompt token by token (RNN mode), as the state or
                # KV cache must be built either way
                def body(model, tok):
                    return model, model.step(tok)
                start = jnp.full((batch,), model.start_token, jnp.int32)
                toks = jnp.concatenate([start[:, None], prompt], 1).T
                _, logp = nnx.scan(body, in_axes=(nnx.Carry, 0), out_axes=(nnx.Carry, 0))(model, toks)
                return logp[-1].argmax(-1)

            @nnx.jit
            def decode(model, tok):
                def body(model, tok):
                    nxt = model.step(tok).argmax(-1).astype(jnp.int32)
                    return model, nxt
                def loop(carry, _):
                    model, tok = carry
                    model, nxt = body(model, tok)
                    return (model, nxt), nxt
                (_, _), out = nnx.scan(loop, in_axes=(nnx.Carry, None), out_axes=(nnx.Carry, 0),
                                       length=n_new)((model, tok), None)
                return out

            times = []
            for run in range(repeats + 1):              # run 0 compiles: not counted
                model.init_cache(batch)
                tok = jax.block_until_ready(prefill(model, prompt).astype(jnp.int32))
                start = time.perf_counter()             # prefill excluded
                jax.block_until_ready(decode(model, tok))
                if run:
                    times.append(time.perf_counter() - start)
            seconds = statistics.median(times)
            rows.append({"layer": name, "prompt": P, "new_tokens": n_new, "batch": batch,
                         "repeats": repeats, "decode_s": seconds,
                         "tokens_per_s": batch * n_new / seconds})
            print(f"  prompt {P:5d} {name:10s} {batch * n_new / seconds:10.0f} tokens/s", flush=True)
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="reduced sweep for CPU CI")
    args = parser.parse_args(argv)
    d_model, head_dim, n_heads = 256, 1, 2
    if args.quick:
        lengths, repeats, prompts, n_new, batch = [256, 512, 1024, 2048], 3, [512, 1024, 1536], 32, 8
    else:
        lengths, repeats, prompts, n_new, batch = (
            [256, 512, 1024, 2048, 4096, 8192, 16384], 3, [512, 1024, 1536], 128, 8)
    gen_repeats = 3
    print(f"backend {jax.default_backend()}; d_model {d_model}, H3 head_dim {head_dim}, "
          f"attention heads {n_heads}, batch 1 (few heads: at L = 16384 one head's scores take 1 GiB)")
    rows = layer_sweep(lengths, d_model, head_dim, n_heads, repeats)
    gen = generation(prompts, n_new, d_model, batch, head_dim, n_heads, gen_repeats)

    print("\n     L   H3 fwd (ms)  attn fwd (ms)  attn/H3   H3 f+b (ms)  attn f+b (ms)  attn/H3")
    table = {}
    for r in rows:
        table.setdefault(r["L"], {})[r["layer"]] = r
    for L, t in sorted(table.items()):
        h, a = t["H3"], t["attention"]
        print(f"{L:6d} {h['forward_s'] * 1e3:12.2f} {a['forward_s'] * 1e3:14.2f} "
              f"{a['forward_s'] / h['forward_s']:8.2f} {h['forward_backward_s'] * 1e3:13.2f} "
              f"{a['forward_backward_s'] * 1e3:14.2f} "
              f"{a['forward_backward_s'] / h['forward_backward_s']:8.2f}")
    Lmax = max(lengths)
    summary = {
        "crossover_forward_L": crossover(rows, "forward_s"),
        "crossover_forward_backward_L": crossover(rows, "forward_backward_s"),
        "ratio_forward_at_Lmax": table[Lmax]["attention"]["forward_s"] / table[Lmax]["H3"]["forward_s"],
        "ratio_forward_backward_at_Lmax": (table[Lmax]["attention"]["forward_backward_s"]
                                           / table[Lmax]["H3"]["forward_backward_s"]),
        "crossover_forward_backward_memory_L": crossover(rows, "forward_backward_peak_bytes"),
        "memory_ratio_forward_backward_at_Lmax": (
            table[Lmax]["attention"]["forward_backward_peak_bytes"]
            / table[Lmax]["H3"]["forward_backward_peak_bytes"]
            if table[Lmax]["H3"].get("forward_backward_peak_bytes") else None),
        "peak_GiB_forward_backward_at_Lmax": {
            name: (table[Lmax][name]["forward_backward_peak_bytes"] or 0) / 2**30
            for name in ("H3", "attention")},
        "L_max": Lmax,
        "generation_tokens_per_s": {
            str(r["prompt"]): {} for r in gen},
    }
    for r in gen:
        summary["generation_tokens_per_s"][str(r["prompt"])][r["layer"]] = r["tokens_per_s"]
    print("\nprompt   H3 tokens/s   attention tokens/s   H3/attention")
    for P in prompts:
        h = next(r for r in gen if r["layer"] == "H3" and r["prompt"] == P)
        a = next(r for r in gen if r["layer"] == "attention" and r["prompt"] == P)
        print(f"{P:6d} {h['tokens_per_s']:13.0f} {a['tokens_per_s']:20.0f} "
              f"{h['tokens_per_s'] / a['tokens_per_s']:14.2f}")
    print("\n" + json.dumps(summary, indent=1))

    RESULTS.mkdir(parents=True, exist_ok=True)
    out = {"backend": jax.default_backend(), "quick": args.quick, "d_model": d_model,
           "layers": rows, "generation": gen, "summary": summary}
    (RESULTS / "h3.json").write_text(json.dumps(out, indent=1))
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
        for ax, key, title in ((axes[0], "forward_s", "forward"),
                               (axes[1], "forward_backward_s", "forward + backward")):
            for name in ("H3", "attention"):
                ax.loglog([r["L"] for r in rows if r["layer"] == name],
                          [r[key] for r in rows if r["layer"] == name], "o-", base=2, label=name)
            ax.set(xlabel="sequence length L", ylabel="seconds", title=f"{title}, d_model {d_model}")
            ax.legend()
        fig.tight_layout()
        fig.savefig(RESULTS / "h3_scaling.png", dpi=100)
    except ImportError:
        pass
    return out


if __name__ == "__main__":
    main()
