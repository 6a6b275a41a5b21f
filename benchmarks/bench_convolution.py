"""Applying an SSM to a sequence: FFT convolution vs direct convolution vs scan.

    python benchmarks/bench_convolution.py [--quick] [--N 64] [--repeats 5]

For L from 256 to 16384: the zero-padded FFT convolution (O(L log L)), the
direct causal sum (O(L^2)) and the recurrence by jax.lax.scan (O(N^2 L)),
each jitted, timed after a warm-up (medians of several runs). Prints a table
and writes benchmarks/results/convolution.json and convolution.png (--quick:
convolution_quick.*; on a GPU the names end in _gpu), recording the device, the
JAX and jaxlib versions and the CPU model.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import jax

from annotated_s4.timing import convolution_timings, device_info, result_stem

RESULTS = Path(__file__).resolve().parent / "results"


def run(lengths, N=64, repeats=5):
    rows = []
    for L in lengths:  # one length at a time, so the table grows as it runs
        row = convolution_timings([L], N=N, repeats=repeats)[0]
        rows.append(row)
        print(f"{L:>6} {1e3 * row['fft_s']:>10.3f} {1e3 * row['direct_s']:>11.3f} {1e3 * row['scan_s']:>9.3f}"
              f" {row['direct_s'] / row['fft_s']:>12.1f} {row['scan_s'] / row['fft_s']:>10.1f}", flush=True)
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="L up to 4096 only")
    parser.add_argument("--N", type=int, default=64, help="state size")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    lengths = [256, 1024, 4096] if args.quick else [256, 512, 1024, 2048, 4096, 8192, 16384]
    device = device_info()
    print(f"device: {device['device_kind']} ({device['platform']}), CPU {device['cpu']}, "
          f"N = {args.N}")
    print(f"{'L':>6} {'FFT ms':>10} {'direct ms':>11} {'scan ms':>9} {'direct/FFT':>12} {'scan/FFT':>10}")
    rows = run(lengths, args.N, args.repeats)
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = {"backend": jax.default_backend(), "device": device, "quick": args.quick,
           "N": args.N, "rows": rows}
    stem = result_stem("convolution", args.quick)
    (RESULTS / f"{stem}.json").write_text(json.dumps(out, indent=2))

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for key, label in [("fft_s", "FFT"), ("direct_s", "direct"), ("scan_s", "scan")]:
        ax.loglog([r["L"] for r in rows], [r[key] for r in rows], "o-", label=label)
    ax.set(xlabel="L", ylabel="seconds", title=f"Applying an N = {args.N} SSM ({device['device_kind']})")
    ax.legend()
    fig.tight_layout()
    fig.savefig(RESULTS / f"{stem}.png", dpi=100)
    print(f"wrote {RESULTS / stem}.json and {stem}.png")


if __name__ == "__main__":
    main()
