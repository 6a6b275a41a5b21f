"""One-off: store committed reference runs at the checkpoint precision that
their entry in `annotated_s4.reference.RUNS` now names (--checkpoint-dtype),
without retraining them.

For each such run whose config.json does not yet record that option: check
that the entry and config.json describe the same run apart from that option;
report the range of its weights against the precision's (largest magnitude,
nonzero values below the smallest normal number, values that round to zero);
round the weights, save them at that precision, record the option in
config.json (and in the checkpoint's copy of it), re-evaluate the run from
the stored weights (`reference.reevaluate`) and write those metrics to
metrics.json. Then the package's manifest of checksums is rewritten.

    PYTHONPATH=. python tools/half_precision_runs.py [NAME ...]

This is what training with the option would have recorded, except the
learning curve (history.json), which stays that of the float32 weights.
"""

import argparse
import os
import sys

import numpy as np

from annotated_s4 import reference
from annotated_s4.checkpoint import (read_checkpoint_info, read_run, round_weights,
                                     save_checkpoint, write_json)
from annotated_s4.config import EXTRA_KEYS, RunConfig
from annotated_s4.registry import parse
from annotated_s4.runner import load_run


def weight_range(path, dtype):
    """(values, largest |w|, nonzero values below dtype's smallest normal
    number, nonzero values that round to 0) over the real floating-point
    arrays of the checkpoint at `path`."""
    tiny = np.finfo(dtype).tiny
    n = largest = subnormal = flushed = 0
    with np.load(path, allow_pickle=False) as f:
        for key in f.files:
            w = f[key]
            if not key.startswith("leaf_") or w.dtype.kind != "f":
                continue
            nonzero = w != 0
            n += w.size
            largest = max(largest, float(np.abs(w).max()))
            subnormal += int((nonzero & (np.abs(w) < tiny)).sum())
            flushed += int((nonzero & (w.astype(dtype) == 0)).sum())
    if largest > np.finfo(dtype).max:
        raise ValueError(f"{path}: a weight of magnitude {largest} overflows {dtype}")
    return n, largest, subnormal, flushed


def convert(name, log=print):
    directory = reference.run_dir(name)
    config = parse(reference.RUNS[name] + ["--out", directory])
    dtype = config.checkpoint_dtype
    before = read_run(directory)
    if before["config"].get("checkpoint_dtype") == dtype:
        log(f"{name}: already stored at {dtype}")
        return None
    # The entry, less the new option, must be the run that was trained.
    old = {**RunConfig().recorded(), **before["config"], "checkpoint_dtype": dtype}
    recorded = {**config.recorded(), **{k: before["config"][k] for k in EXTRA_KEYS
                                        if k in before["config"]}}
    if recorded != old:
        raise ValueError(f"{name}: RUNS and {directory}/config.json disagree in "
                         f"{sorted(k for k in recorded if recorded[k] != old.get(k))}")
    n, largest, subnormal, flushed = weight_range(os.path.join(directory, "checkpoint.npz"),
                                                  dtype)
    model, _, _ = load_run(directory)
    step, extra, has_optimizer = read_checkpoint_info(directory)
    if has_optimizer:
        raise ValueError(f"{name}: the checkpoint holds an optimizer (an unfinished run)")
    round_weights(model, dtype)
    save_checkpoint(directory, model, None, step, {**extra, "config": recorded}, dtype=dtype)
    write_json(directory, "config.json", recorded)
    after, _ = reference.reevaluate(directory)
    write_json(directory, "metrics.json", {**before["metrics"], **after})
    log(f"{name}: {n} weights, max |w| {largest:.4g}, {subnormal} nonzero below "
        f"{np.finfo(dtype).tiny:.2g}, {flushed} rounded to 0")
    for k, v in after.items():
        log(f"  {k:20s} {before['metrics'][k]:.6f} -> {v:.6f} ({v - before['metrics'][k]:+.2e})")
    return before["metrics"], after


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", metavar="NAME")
    names = parser.parse_args(argv).names or [
        n for n, options in reference.RUNS.items() if "--checkpoint-dtype" in options]
    try:
        for name in names:
            convert(name)
    except (ValueError, FileNotFoundError) as e:
        sys.exit(f"error: {e}")
    reference.write_manifest()


if __name__ == "__main__":
    main()
