"""Checkpoints and run directories, without pickle.

A checkpoint is one .npz file: the leaves of the NNX state of a model (and,
for a run that may be resumed, of its optimizer) in tree order, each with its
path in the state tree, plus the step and a JSON string of extra data. Paths
and shapes are checked on loading, so that a checkpoint written for another
architecture is refused with a message instead of misread; a parameter renamed
since a checkpoint was written (`RENAMED`) loads under its new name. PRNG keys
(dropout streams) are stored as their raw key data. A finished run may store
its real floating-point arrays at a lower precision (``dtype="float16"``: half
the file); loading casts every array back to the model's own dtype, so the
model then holds exactly the rounded weights that `round_weights` gives. The
file is compressed (`np.savez_compressed`); uncompressed files load the same way.

A run directory, as the command line writes it, holds `config.json` (the
command's options), `history.json` (the learning curve), `metrics.json` (the
final test metrics) and `checkpoint.npz`. The learning curve is written
compactly (`write_history`): one line per series, each training loss at the
float32 precision it was computed in, each step's wall time to four digits.
"""

from __future__ import annotations

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

__all__ = ["CHECKPOINT", "RUN_FILES", "CHECKPOINT_DTYPES", "save_checkpoint",
           "load_checkpoint", "round_weights", "read_checkpoint_info", "read_run",
           "write_json", "write_history"]

CHECKPOINT = "checkpoint.npz"
RUN_FILES = ("config.json", "history.json", "metrics.json", CHECKPOINT)
# The precisions a checkpoint may store its real floating-point arrays at
# (those .npz holds natively; float16 halves a float32 model's file).
CHECKPOINT_DTYPES = ("float32", "float16")
# Parameters renamed since checkpoints were first written, old name -> new:
# applied to every component of a saved path (optimizer-state paths hold the
# parameter names too), so that old checkpoints keep loading.
RENAMED = {"log_step": "log_dt"}


def _path_str(path):
    return "/".join(str(getattr(k, "key", getattr(k, "idx", getattr(k, "name", k))))
                    for k in path)


def _current_path(saved):
    """A saved path string with its renamed components (`RENAMED`) under their
    current names."""
    return "/".join(RENAMED.get(part, part) for part in saved.split("/"))


def _nodes(model, optimizer):
    return model if optimizer is None else (model, optimizer)


def _state(nodes):
    """The state a checkpoint keeps: everything but RNN-mode caches (which
    `init_cache` rebuilds from the parameters)."""
    return nnx.state(nodes, nnx.Not(nnx.Cache))


def _checkpoint_dtype(dtype):
    if dtype is not None and str(np.dtype(dtype)) not in CHECKPOINT_DTYPES:
        raise ValueError(f"dtype must be one of {CHECKPOINT_DTYPES} (or None: the model's "
                         f"own), got {dtype!r}")
    return None if dtype is None else np.dtype(dtype)


def _is_real_float(leaf):
    return jnp.issubdtype(leaf.dtype, jnp.floating)


def save_checkpoint(directory, model, optimizer=None, step=0, extra=None, dtype=None):
    """Write the state of `model` (and `optimizer`, if given) and `step` to
    directory/checkpoint.npz, atomically (a crash leaves the old file); with
    `dtype` (one of `CHECKPOINT_DTYPES`), its real floating-point arrays are
    stored rounded to that precision."""
    dtype = _checkpoint_dtype(dtype)
    os.makedirs(directory, exist_ok=True)
    leaves = jax.tree_util.tree_leaves_with_path(_state(_nodes(model, optimizer)))
    arrays, paths = {}, []
    for i, (path, leaf) in enumerate(leaves):
        if jnp.issubdtype(leaf.dtype, jax.dtypes.prng_key):
            leaf = jax.random.key_data(leaf)
        elif dtype is not None and _is_real_float(leaf):
            leaf = leaf.astype(dtype)
        arrays[f"leaf_{i:05d}"] = np.asarray(leaf)
        paths.append(_path_str(path))
    arrays["paths"] = np.array(paths, dtype=str)
    arrays["step"] = np.array(step, dtype=np.int64)
    arrays["extra"] = np.array(json.dumps(extra or {}))
    tmp = os.path.join(directory, CHECKPOINT + ".tmp.npz")
    np.savez_compressed(tmp, **arrays)
    os.replace(tmp, os.path.join(directory, CHECKPOINT))


def _checkpoint_path(directory):
    path = os.path.join(directory, CHECKPOINT)
    if not os.path.exists(path):
        raise FileNotFoundError(f"no checkpoint at {path}")
    return path


def read_checkpoint_info(directory):
    """(step, extra, has_optimizer) of directory/checkpoint.npz, without loading
    the arrays."""
    with np.load(_checkpoint_path(directory), allow_pickle=False) as f:
        has_optimizer = any(str(p).startswith("1/") for p in f["paths"])
        return int(f["step"]), json.loads(str(f["extra"])), has_optimizer


def load_checkpoint(directory, model, optimizer=None):
    """Restore `model` (and `optimizer`) in place from directory/checkpoint.npz.
    The model may be abstract (built by `nnx.eval_shape`, its arrays only
    shapes): every array it has is then filled from the file.

    Returns (step, extra). Raises FileNotFoundError if there is no checkpoint
    and ValueError if it was written for a different model or optimizer.
    """
    path = _checkpoint_path(directory)
    nodes = _nodes(model, optimizer)
    leaves_with_path, treedef = jax.tree_util.tree_flatten_with_path(_state(nodes))
    with np.load(path, allow_pickle=False) as f:
        paths = [_current_path(str(p)) for p in f["paths"]]
        expected = [_path_str(p) for p, _ in leaves_with_path]
        # matched by path: a renamed leaf may sort elsewhere in the tree's order
        index = {p: i for i, p in enumerate(paths)}
        if len(index) != len(paths) or sorted(paths) != sorted(expected):
            missing = sorted(set(expected) - set(paths))[:3]
            unexpected = sorted(set(paths) - set(expected))[:3]
            raise ValueError(
                f"checkpoint {path} does not match this model"
                f"{'' if optimizer is None else '/optimizer'} ({len(paths)} saved "
                f"arrays, {len(expected)} expected; missing e.g. {missing}, "
                f"not in the model e.g. {unexpected})")
        new = []
        for name, (_, leaf) in zip(expected, leaves_with_path):
            saved = f[f"leaf_{index[name]:05d}"]
            if jnp.issubdtype(leaf.dtype, jax.dtypes.prng_key):
                # an abstract key (a model built by nnx.eval_shape) names no
                # implementation: the default one, which must give its dtype
                impl = jax.random.key_impl(leaf) if isinstance(leaf, jax.Array) else None
                value = jax.random.wrap_key_data(saved, impl=impl)
                if value.dtype != leaf.dtype:
                    raise ValueError(f"checkpoint {path}: key {name} is {value.dtype}, "
                                     f"the model expects {leaf.dtype}")
            else:
                if saved.shape != leaf.shape:
                    raise ValueError(f"checkpoint {path}: array {name} has shape "
                                     f"{saved.shape}, the model expects {leaf.shape}")
                value = jnp.asarray(saved, dtype=leaf.dtype)
            new.append(jax.device_put(value, getattr(leaf, "sharding", None)))
        step = int(f["step"])
        extra = json.loads(str(f["extra"]))
    nnx.update(nodes, jax.tree_util.tree_unflatten(treedef, new))
    return step, extra


def round_weights(model, dtype):
    """Round the real floating-point arrays of `model`'s saved state in place
    to `dtype` (one of `CHECKPOINT_DTYPES`), keeping their own dtype: the
    model becomes what a checkpoint saved with `dtype` loads as."""
    dtype = _checkpoint_dtype(dtype)
    state = _state(model)
    nnx.update(model, jax.tree_util.tree_map(
        lambda leaf: leaf.astype(dtype).astype(leaf.dtype)
        if not jnp.issubdtype(leaf.dtype, jax.dtypes.prng_key) and _is_real_float(leaf)
        else leaf, state))
    return model


def write_json(directory, name, obj):
    with open(os.path.join(directory, name), "w") as f:
        json.dump(obj, f, indent=1)
        f.write("\n")


def write_history(directory, history):
    """Write `history` (`fit`'s: "step", "train_loss", "seconds", "eval") to
    directory/history.json, one line per key. A training loss is a float32
    value, so its shortest float32 decimal is exact; a wall time keeps four
    significant digits. Half the size of `write_json`'s layout."""
    rounding = {"train_loss": lambda x: float(str(np.float32(x))),
                "seconds": lambda x: float(f"{x:.4g}")}
    lines = [f" {json.dumps(key)}: "
             + json.dumps([rounding[key](x) for x in value] if key in rounding else value)
             for key, value in history.items()]
    with open(os.path.join(directory, "history.json"), "w") as f:
        f.write("{\n" + ",\n".join(lines) + "\n}\n")


def read_run(directory):
    """The config, history and metrics of a run directory, as dicts; a clear
    FileNotFoundError naming the first file that is missing."""
    if not os.path.isdir(directory):
        raise FileNotFoundError(f"no run directory at {directory}")
    for name in RUN_FILES:
        if not os.path.exists(os.path.join(directory, name)):
            raise FileNotFoundError(f"run {directory} is missing {name}")
    out = {}
    for name in RUN_FILES[:3]:
        with open(os.path.join(directory, name)) as f:
            try:
                out[name[:-5]] = json.load(f)
            except json.JSONDecodeError as e:
                raise ValueError(f"{os.path.join(directory, name)} is not valid JSON: {e}")
    return out
