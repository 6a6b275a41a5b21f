"""Runs: train a configuration into a run directory, resume it, load and
re-evaluate it.

A run directory holds `config.json` (`RunConfig.recorded()`, plus the hash
of the text for a language model; `read_run` reads an older, flat one in the
present layout), `history.json` (the learning curve),
`metrics.json` (the final test metrics, written last) and `checkpoint.npz`.
With `--checkpoint-dtype float16` the finished run's weights are rounded to
half precision before its final metrics are computed and are stored so: the
metrics are those of the weights the checkpoint holds.
Metrics that need another run (a generator scored by a trained classifier)
are computed after training, by a function passed as `extra_metrics`
(`annotated_s4.reference.cross_run_metrics`).

Re-evaluating a run is a measurement, repeated on whatever device is at hand,
so it is compared with the recorded metrics within a tolerance derived from
float32 arithmetic (`compare`; derived above `rounding_bound`). The
re-evaluation runs at `jax.default_matmul_precision("float32")`: a GPU's
TF32 products (10-bit mantissa) would move the logits far more than float32
rounding does.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import math
import os
import time

try:
    import fcntl
except ImportError:  # Windows: no locking (the cache is for make test)
    fcntl = None

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from . import checkpoint as _checkpoint
from .checkpoint import (CHECKPOINT, load_checkpoint, read_checkpoint_info, round_weights,
                         save_checkpoint, write_json)
from .config import EXTRA_KEYS, RunConfig
from .registry import (build_model, build_optimizer, count_params, load_dataset, resolve,
                       test_metrics)
from .models import eval_mode
from .train import evaluate, fill_batch, fit, make_mesh, seconds_per_step

__all__ = ["run", "config_of", "read_config", "read_run", "load_run", "evaluate_run",
           "UNIT_ROUNDOFF", "ROUNDING_UNITS", "SIGMAS", "RECORDED_BATCH", "rounding_bound",
           "item_statistics", "measure_items", "held_out_items", "remeasure", "metrics_of_items", "compare"]


def config_of(config, data):
    """The run's config.json: the options that define it, and the hash of the
    text for a language model."""
    recorded = config.recorded()
    if "corpus_sha256" in data:
        recorded["corpus_sha256"] = data["corpus_sha256"]
    return recorded


def read_config(recorded, directory):
    """The checked `RunConfig` that a run's config.json dict `recorded` holds."""
    return resolve(RunConfig.from_recorded(recorded, f"{directory}/config.json"))


def _present(recorded, source):
    """A config.json dict in the present layout (a flat one migrated), its
    extra keys (the corpus hash) kept."""
    extra = {k: v for k, v in recorded.items() if k in EXTRA_KEYS}
    return {**RunConfig.from_recorded(recorded, source).recorded(), **extra}


def read_run(directory):
    """A run directory's config, history and metrics (`checkpoint.read_run`),
    its config in the present layout: the layer's options under
    "layer_options", however old the file."""
    run = _checkpoint.read_run(directory)
    return {**run, "config": _present(run["config"], f"{directory}/config.json")}


def run(config, log=print, devices=None, extra_metrics=None):
    """Train as `config` (a `RunConfig`) describes; returns the final metrics
    with the `history` and the trained `model`. ``log=None`` is silent;
    ``devices`` overrides the devices of the data-parallel mesh;
    ``extra_metrics(config, data, model)`` returns further metrics (a dict)
    computed after training."""
    log = log or (lambda *_: None)
    config = resolve(config)
    mesh = make_mesh(devices)
    n_dev = mesh.devices.size
    if config.batch_size % n_dev:
        raise ValueError(f"--batch-size ({config.batch_size}) must be divisible by the "
                         f"number of devices ({n_dev})")
    data = load_dataset(config)
    model = build_model(config, data)
    optimizer = build_optimizer(config, model)
    recorded = config_of(config, data)
    history = _resume(config, model, optimizer, recorded, log)
    n_params = count_params(model)
    log(f"{config.layer} on {config.dataset}: {n_params:,} parameters, "
        f"L = {data['x_train'].shape[1]}, {n_dev} device(s)")

    def checkpoint(step, history):
        if (config.out and config.ckpt_every and step % config.ckpt_every == 0
                and step != config.steps):
            save_checkpoint(config.out, model, optimizer, step,
                            {"config": recorded, "history": history})

    start = time.perf_counter()
    history = fit(model, data["x_train"], data["y_train"], data["x_test"], data["y_test"],
                  steps=config.steps, batch_size=config.batch_size, lr=config.lr,
                  seed=config.seed, eval_every=config.eval_every, log=log,
                  log_every=config.log_every, optimizer=optimizer, mesh=mesh, history=history,
                  on_step=checkpoint)
    final = history["eval"][-1]
    if config.checkpoint_dtype is not None:
        # the run is the weights its checkpoint stores: score those
        round_weights(model, config.checkpoint_dtype)
        final = evaluate(model, data["x_test"], data["y_test"], mesh=mesh)
    metrics = {**test_metrics(final, data),
               **(extra_metrics(config, data, model) if extra_metrics else {}),
               "steps": config.steps, "parameters": n_params, "devices": n_dev,
               "seconds_per_step": seconds_per_step(history),
               "wall_seconds": time.perf_counter() - start}
    log("final  " + "  ".join(f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}"
                              for k, v in metrics.items()))
    if config.out:
        # A finished run keeps the model only: the optimizer's state is needed
        # to resume an unfinished run, and would triple the file.
        save_checkpoint(config.out, model, None, config.steps, {"config": recorded},
                        dtype=config.checkpoint_dtype)
        for name, obj in [("config", recorded), ("history", history), ("metrics", metrics)]:
            write_json(config.out, f"{name}.json", obj)
    return {**metrics, "history": history, "model": model}


def _resume(config, model, optimizer, recorded, log):
    """With --resume and a checkpoint in --out: restore model and optimizer
    from it and return its history (None otherwise). A checkpoint written
    with another configuration is refused."""
    if not (config.out and config.resume
            and os.path.exists(os.path.join(config.out, CHECKPOINT))):
        return None
    step, extra, _ = read_checkpoint_info(config.out)
    saved = extra.get("config")
    saved = _present(saved, f"{config.out}/{CHECKPOINT}") if saved else {}
    if saved != recorded:
        changed = _differences(saved, recorded)
        raise ValueError(f"--resume: the checkpoint in {config.out} was written with a "
                         f"different configuration (differs in: {', '.join(changed)})")
    load_checkpoint(config.out, model, optimizer)
    log(f"resumed from {config.out} at step {step}")
    return extra["history"]


def _differences(saved, recorded):
    """The options in which two config.json dicts differ, a layer's by name."""
    old, new = saved.get("layer_options", {}), recorded["layer_options"]
    return sorted([k for k in recorded if k != "layer_options" and saved.get(k) != recorded[k]]
                  + [k for k in set(old) | set(new) if old.get(k) != new.get(k)])


def load_run(directory):
    """(model, data, run) of a run directory: the model built from its config
    with the checkpoint's weights, the dataset it was trained on, and the
    run's config/history/metrics dicts."""
    run = read_run(directory)
    recorded = run["config"]
    config = read_config(recorded, directory)
    data = load_dataset(config)
    if data.get("corpus_sha256", recorded.get("corpus_sha256")) != recorded.get("corpus_sha256"):
        raise ValueError(
            f"{directory} was trained on a different text (sha256 "
            f"{recorded['corpus_sha256'][:12]}...) than the package's corpus "
            f"({data['corpus_sha256'][:12]}...): evaluate it with the version of the "
            f"package it was trained with, or retrain it (make reference RUN=<name>)")
    # Built abstract (shapes only: no initialiser runs or compiles), then
    # filled with the checkpoint's arrays, which cover the whole state.
    model = nnx.eval_shape(lambda: build_model(config, data))
    load_checkpoint(directory, model)
    return model, data, run


def evaluate_run(directory, extra_metrics=None):
    """The run's test metrics recomputed from its checkpoint (`held_out_items`,
    then `metrics_of_items`, as `remeasure` computes them; with
    ``extra_metrics(config, data, model)``, if given, at float32 matmul
    precision), and the run: its config, history and recorded metrics, the
    loaded `model` and the `data` it was trained and tested on (the
    registry's dataset dict). The metrics carry their "tolerance" (`compare`)."""
    model, data, run = load_run(directory)
    metrics = metrics_of_items(held_out_items(directory, model, data), data)
    with jax.default_matmul_precision("float32"):
        if extra_metrics:
            extra = dict(extra_metrics(read_config(run["config"], directory), data, model))
            metrics["tolerance"].update(extra.pop("tolerance", {}))
            metrics = {**metrics, **extra}
    return metrics, {**run, "model": model, "data": data}


# --- Re-evaluation as a measurement: its tolerance ------------------------------------
# Two float32 evaluations of the same model on the same input (the one that
# recorded a run's metrics, and a re-evaluation on another machine, another
# device, another summation order) differ only by rounding. Each evaluation's
# log-probabilities lie within ROUNDING_UNITS units of float32 roundoff u = 2^-24
# of the exact ones, relative to the item's scale s = max(1, max_j |log p_j|):
# against a float64 evaluation of the same weights, the reference runs measured
# at most 91 units (the 784-step MNIST classifier; 73 for the digit generator, 52
# for the H3 language model, 24 for the 8 x 8 digit classifier, which
# tests/test_runner.py checks against the bound). So two evaluations'
# log-probabilities differ by at most delta = 2 ROUNDING_UNITS u s, and:
#  * a prediction (the argmax) can differ only where the top two log-probabilities
#    lie closer than 2 delta: the accuracy may move by (those items) / n;
#  * each term -log p_y of the loss moves by at most its delta_i. Rounding errors
#    taken as independent and of mean zero (the probabilistic model of Higham and
#    Mary, SIAM J. Sci. Comput. 2019), Hoeffding's inequality bounds the mean of n
#    such moves by SIGMAS sqrt(sum delta_i^2) / n, except with probability
#    2 exp(-SIGMAS^2 / 2) = 5e-11. The recorded loss is also a float32 mean of
#    m = batch x tokens nonnegative terms, whose relative rounding error Higham and
#    Mary bound by SIGMAS sqrt(m) u (failing with probability below
#    2m exp(-SIGMAS^2 / 2), 1e-5 for m = 256 x 784), plus u for the division:
#    relative tolerance (SIGMAS sqrt(m) + 1) u on top of the first term.
#: float32's unit roundoff, 2^-24.
UNIT_ROUNDOFF = 2.0 ** -24
#: A float32 evaluation's largest error in a log-probability, in units of roundoff
#: times the item's scale max(1, max |log p|) (2.8 times the largest measured).
ROUNDING_UNITS = 256
#: lambda of the probabilistic bounds, which fail with probability 2 exp(-lambda^2 / 2)
#: per term bounded.
SIGMAS = 7
#: The batch of `train.evaluate`, which recorded the runs' test metrics.
RECORDED_BATCH = 256


def rounding_bound(logp):
    """delta: how far two float32 evaluations' log-probabilities `logp` (..., classes)
    can lie apart, per item: 2 ROUNDING_UNITS u max(1, max |log p|)."""
    scale = jnp.maximum(1.0, jnp.abs(logp).max(-1))
    return 2 * ROUNDING_UNITS * UNIT_ROUNDOFF * scale


def item_statistics(logp, target):
    """Per item (an example, or a token of a next-step model) of log-probabilities
    `logp` (..., classes) and integer `target` (...): the loss -log p_target, whether
    the argmax is the target, whether the top two lie within 2 delta (a float32
    boundary, `rounding_bound`), and delta."""
    logp = jnp.asarray(logp)
    nll = -jnp.take_along_axis(logp, jnp.asarray(target)[..., None], axis=-1)[..., 0]
    top2 = jax.lax.top_k(logp, 2)[0]
    delta = rounding_bound(logp)
    return {"nll": nll, "right": logp.argmax(-1) == target,
            "boundary": top2[..., 0] - top2[..., 1] < 2 * delta, "delta": delta}


@nnx.jit
def _batch_statistics(model, x, y):
    return item_statistics(model(x), x if y is None else y)


def measure_items(model, x, y=None, batch_size=RECORDED_BATCH):
    """`item_statistics` of `model` on every item of x, y (y None for next-step
    models), in eval mode, in batches: numpy arrays. A last, shorter batch is
    filled up (and its extra items dropped), so that one program, compiled
    once, scores every batch; an item's statistics do not depend on its batch."""
    size = min(batch_size, len(x))
    parts = []
    with eval_mode(model):
        for i in range(0, len(x), size):
            n = len(x[i:i + size])
            stats = _batch_statistics(model, jnp.asarray(fill_batch(x[i:i + size], size)),
                                      None if y is None else jnp.asarray(fill_batch(y[i:i + size], size)))
            parts.append({k: v[:n] for k, v in jax.device_get(stats).items()})
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


# --- Re-evaluations kept for the rest of a test run -------------------------------------
#: The environment variable naming a folder where `held_out_items` keeps what it
#: measured. `make test` empties it, then sets it for its chapters, so that every
#: run is re-evaluated once per `make test` (the sequential-MNIST pages score the
#: same runs); `make book` then reads those results. Unset (the default): nothing is kept.
EVAL_CACHE = "ANNOTATED_S4_EVAL_CACHE"
_PACKAGE = os.path.dirname(os.path.abspath(__file__))


@functools.cache
def _source_digest():
    """The SHA-256 of the package's source files (names and contents), read
    once per process."""
    h = hashlib.sha256()
    for name in sorted(os.listdir(_PACKAGE)):
        if name.endswith(".py"):
            with open(os.path.join(_PACKAGE, name), "rb") as f:
                h.update(name.encode() + f.read())
    return h.digest()


def _evaluation_key(directory, data):
    """A digest of everything a run's test statistics depend on: its checkpoint
    and config, the test set, the package's source (`_source_digest`), the
    library versions, the device, and whether TF32 is emulated."""
    import importlib.metadata as md
    h = hashlib.sha256()
    for name in (CHECKPOINT, "config.json"):
        with open(os.path.join(directory, name), "rb") as f:
            h.update(f.read())
    for a in (data["x_test"], data["y_test"]):
        h.update(b"-" if a is None else np.ascontiguousarray(a).tobytes())
    h.update(_source_digest())
    device = jax.devices()[0]
    h.update(repr([md.version(p) for p in ("jax", "jaxlib", "flax", "numpy")]
                  + [device.platform, device.device_kind,
                     os.environ.get("ANNOTATED_S4_EMULATE_TF32", "")]).encode())
    return h.hexdigest()


@contextlib.contextmanager
def _locked(path):
    """Hold an exclusive lock on `path` (a second process waits; POSIX only)."""
    with open(path, "a") as f:
        if fcntl is not None:
            fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            if fcntl is not None:
                fcntl.flock(f, fcntl.LOCK_UN)


def held_out_items(directory, model, data):
    """`measure_items` of a loaded run (`load_run`) on its test set, at float32
    matmul precision. Kept in the folder that $ANNOTATED_S4_EVAL_CACHE names,
    if set, under a digest of everything they depend on (`_evaluation_key`)."""
    def measure():
        with jax.default_matmul_precision("float32"):
            return measure_items(model, data["x_test"], data["y_test"])

    folder = os.environ.get(EVAL_CACHE)
    if not folder:
        return measure()
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, _evaluation_key(directory, data) + ".npz")
    with _locked(path + ".lock"):   # a second worker waits for the first's result
        if not os.path.exists(path):
            items = measure()
            np.savez(path + ".tmp.npz", **items)
            os.replace(path + ".tmp.npz", path)
        with np.load(path) as f:
            return {k: f[k] for k in f.files}


def remeasure(model, x, y, data, batch_size=RECORDED_BATCH):
    """A run's test metrics (`registry.test_metrics`) measured again on x, y (y None
    for next-step models), with the tolerance of each: the metrics' dict holds
    {"tolerance": {metric: largest difference from the recorded value that
    float32 rounding explains}} (`metrics_of_items`, derived above)."""
    return metrics_of_items(measure_items(model, x, y, batch_size), data, batch_size)


def metrics_of_items(items, data, batch_size=RECORDED_BATCH):
    """Test metrics and their tolerances from `item_statistics` of every test
    item (an example, or a sequence of tokens), as a run recorded them: means
    over batches of `batch_size` items (`train.evaluate`).

    test_loss: the mean of -log p_y (summed in float64), tolerance
    SIGMAS sqrt(sum delta^2) / n + (SIGMAS sqrt(terms) + 1) u x loss, `terms` the
    number of terms of one recorded float32 mean (min(batch_size, items) times
    the targets per item); test_accuracy: tolerance
    (items on a boundary) / n + u (the recorded float32 mean of 0s and 1s is
    exact but for its division); bits per token: the loss's, / log 2.
    """
    nll = np.asarray(items["nll"], np.float64)
    terms = min(batch_size, len(nll)) * nll[0].size
    loss = float(nll.mean())
    metrics = test_metrics({"loss": loss, "accuracy": float(np.mean(items["right"]))}, data)
    delta = np.asarray(items["delta"], np.float64)
    loss_tol = (SIGMAS * math.sqrt(np.sum(delta ** 2)) / delta.size
                + (SIGMAS * math.sqrt(terms) + 1) * UNIT_ROUNDOFF * loss)
    tolerance = {"test_loss": loss_tol,
                 "test_accuracy": float(np.mean(items["boundary"])) + UNIT_ROUNDOFF}
    for k in metrics:
        if k.startswith("test_bits_per_"):
            tolerance[k] = loss_tol / math.log(2)
    return {**metrics, "tolerance": tolerance}


def compare(recorded, recomputed, tolerance=None):
    """{name: (recorded, recomputed)} of the recomputed metrics that differ from the
    recorded ones by more than their tolerance: `tolerance` if given (one number for
    all), else the re-evaluation's own, ``recomputed["tolerance"]`` (`remeasure`); a
    metric without one must be reproduced to float32 rounding (u relative)."""
    allowed = recomputed.get("tolerance", {})
    bad = {}
    for k, v in recomputed.items():
        if k == "tolerance":
            continue
        tol = tolerance if tolerance is not None else allowed.get(
            k, UNIT_ROUNDOFF * abs(v))
        if recorded.get(k) is None or not abs(recorded[k] - v) <= tol:
            bad[k] = (recorded.get(k), v)
    return bad
