"""The first call: how long a reader waits the first time a layer runs.

Each measurement runs in a fresh Python process, so that nothing is compiled
or cached yet: the time to import the package, to construct the layer, and
its first call, eagerly (as a notebook's first cell calls it: CNN mode on a
batch) and compiled with its gradient (a training step's first call). The
layers are S4Layer and S4DLayer at H = 128, N = 64, L = 1024, batch 8, the
configuration of `bench_s4.py`'s layer rows. Median of `--repeats` processes.

Writes benchmarks/results/first_call.json (--quick: first_call_quick.json; on
a GPU the names end in _gpu), recording the device, the JAX and jaxlib
versions and the CPU model (read in this process, after the measured ones).

    python benchmarks/bench_first_call.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import subprocess
import sys

RESULTS = pathlib.Path(__file__).resolve().parent / "results"

PROGRAM = """
import json, sys, time
t0 = time.perf_counter()
import jax, jax.numpy as jnp
from flax import nnx
import annotated_s4
t1 = time.perf_counter()
layer = getattr(annotated_s4, sys.argv[1])(128, 64, 1024, rngs=nnx.Rngs(0))
u = jax.block_until_ready(jax.random.normal(jax.random.PRNGKey(0), (8, 1024, 128)))
t2 = time.perf_counter()
jax.block_until_ready(layer(u))
t3 = time.perf_counter()
grad = nnx.jit(nnx.grad(lambda m, u: jnp.mean(m(u) ** 2)))
jax.block_until_ready(jax.tree.leaves(nnx.state(grad(layer, u))))
t4 = time.perf_counter()
print(json.dumps({"import_s": t1 - t0, "construct_s": t2 - t1, "first_call_s": t3 - t2,
                  "first_grad_call_s": t4 - t3}))
"""


def measure(layer):
    out = subprocess.run([sys.executable, "-c", PROGRAM, layer], check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="fresh processes per layer")
    parser.add_argument("--quick", action="store_true", help="one process per layer")
    args = parser.parse_args(argv)
    repeats = 1 if args.quick else args.repeats
    rows = {}
    print("layer       import (s)  construct (s)  first call (s)  first grad call (s)")
    for layer in ("S4Layer", "S4DLayer"):
        runs = [measure(layer) for _ in range(repeats)]
        rows[layer] = {key: statistics.median(r[key] for r in runs) for key in runs[0]}
        r = rows[layer]
        print(f"{layer:10s} {r['import_s']:11.2f} {r['construct_s']:14.2f} "
              f"{r['first_call_s']:15.2f} {r['first_grad_call_s']:20.2f}")
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = {"command": "python benchmarks/bench_first_call.py" + (" --quick" if args.quick else ""),
           "config": {"H": 128, "N": 64, "L": 1024, "batch": 8, "repeats": repeats},
           "layers": rows}
    from annotated_s4.timing import device_info, result_stem

    out["device"] = device_info()
    stem = result_stem("first_call", args.quick, out["device"]["platform"])
    (RESULTS / f"{stem}.json").write_text(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()
