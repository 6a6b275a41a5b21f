"""Mamba-2's SSD four ways: recurrent scan, associative scan, quadratic dual form, chunked.

One SSD layer's sequence map (scalar A per head; batch 1, H = 4 heads of
width P = 16, state size N = 16, float32) computed by

* ``recurrent``: `ssd_scan` with jax.lax.scan, L sequential steps;
* ``associative``: `ssd_scan` with jax.lax.associative_scan, O(log L) rounds;
* ``quadratic``: `ssd_quadratic`, y = M X with the L x L matrix M (lengths up
  to QUADRATIC_MAX_L only: M alone is H L^2 numbers);
* ``chunked``: `ssd_chunked` in chunks of CHUNK steps;

each jitted, median of several runs after a warm-up (`annotated_s4.timing.ssd_timings`),
at L = 256 .. 8192 (``--quick``: 128, 256, 512). Prints a table of medians,
the ratios to the chunked algorithm and the log-log slope of each column, and
writes benchmarks/results/selective.json (``--quick``: selective_quick.json;
on a GPU the names end in _gpu), recording the device, the JAX and jaxlib
versions and the CPU model (`annotated_s4.timing.device_info`). Timings vary
with the machine and its load.

    python benchmarks/bench_selective.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import pathlib

import jax

from annotated_s4.ssd import SSD_ALGORITHMS
from annotated_s4.timing import device_info, loglog_slope, result_stem, ssd_timings

RESULTS = pathlib.Path(__file__).resolve().parent / "results"
BATCH, H, P, N, CHUNK = 1, 4, 16, 16, 64
QUADRATIC_MAX_L = 4096
ALGORITHMS = tuple(SSD_ALGORITHMS)


def print_row(row):
    print(f"{row['L']:>6} " + " ".join("       -" if row[k] is None else f"{1e3 * row[k]:8.2f}"
                                       for k in ALGORITHMS) + "   "
          + " ".join("     -" if row[k] is None else f"{row[k] / row['chunked']:6.1f}"
                     for k in ALGORITHMS if k != "chunked"), flush=True)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="three short lengths")
    args = parser.parse_args(argv)
    lengths = [128, 256, 512] if args.quick else [256, 512, 1024, 2048, 4096, 8192]
    repeats = 3 if args.quick else 5
    out = {"backend": jax.default_backend(), "device": str(jax.devices()[0]),
           "device_info": device_info(), "quick": args.quick, "batch": BATCH, "H": H, "P": P,
           "N": N, "chunk": CHUNK,
           "dtype": "float32", "repeats": repeats, "lengths": lengths}
    print(f"backend {out['backend']} ({out['device']}), batch {BATCH}, H = {H}, P = {P}, "
          f"N = {N}, chunk {CHUNK}: median ms, then ratio to chunked")
    print(f"{'L':>6} " + " ".join(f"{k[:8]:>8}" for k in ALGORITHMS) + "   "
          + " ".join(f"{k[:6]:>6}" for k in ALGORITHMS if k != "chunked"))
    out["rows"] = ssd_timings(lengths, chunk=CHUNK, quadratic_max_L=QUADRATIC_MAX_L,
                              repeats=repeats, log=print_row, batch=BATCH, H=H, P=P, N=N)
    out["loglog_slopes"] = {k: loglog_slope([r["L"] for r in out["rows"]],
                                            [r[k] for r in out["rows"]]) for k in ALGORITHMS}
    print("log-log slope of time against L: "
          + ", ".join(f"{k} {s:.2f}" for k, s in out["loglog_slopes"].items()))
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / (result_stem("selective", quick=args.quick) + ".json")
    path.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
