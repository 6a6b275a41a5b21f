"""Runs: train a configuration into a run directory, resume it, load and
re-evaluate it.

A run directory holds `config.json` (`RunConfig.recorded()`, plus the hash
of the text for a language model; `read_run` reads an older, flat one in the
present layout), `history.json` (the learning curve),
`metrics.json` (the final test metrics, written last) and `checkpoint.npz`.
With `--checkpoint-dtype float16` the finished run's weights are rounded to
half precision before its final metrics are computed and are stored so: the
metrics are those of the weights the checkpoint holds.
Metrics that need another run (a digit generator scored by the reference
classifier, `completion`) are computed after training with ``cross_run=True``
(`cross_run_metrics`).

Re-evaluating a run is a measurement, repeated on whatever device is at hand,
so it is compared with the recorded metrics within a tolerance derived from
float32 arithmetic (`annotated_s4.measure`).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import time

try:
    import fcntl
except ImportError:  # Windows: no locking (the cache is for make test)
    fcntl = None

import jax
import numpy as np
from flax import nnx

from . import checkpoint as _checkpoint
from .checkpoint import (CHECKPOINT, load_checkpoint, read_checkpoint_info, round_weights,
                         save_checkpoint, write_history, write_json)
from .completion import COMPLETION_CLASSIFIERS, completion_metrics
from .config import EXTRA_KEYS, RunConfig
from .measure import (RECORDED_BATCH, ROUNDING_UNITS, SIGMAS, UNIT_ROUNDOFF, compare,
                      item_statistics, measure_items, metrics_of_items, remeasure,
                      rounding_bound)
from .registry import (build_model, build_optimizer, count_params, load_dataset, resolve,
                       test_metrics)
from .runs import locate
from .train import evaluate, fit, make_mesh, seconds_per_step

# The names of `measure` are given here too: a run's re-evaluation is measured there.
__all__ = ["run", "config_of", "read_config", "read_run", "load_run", "evaluate_run",
           "cross_run_metrics", "held_out_items", "kept_items",
           "UNIT_ROUNDOFF", "ROUNDING_UNITS", "SIGMAS", "RECORDED_BATCH", "rounding_bound",
           "item_statistics", "measure_items", "remeasure", "metrics_of_items", "compare"]


def config_of(config, data):
    """The run's config.json: the options that define it, and the hash of the
    text for a language model."""
    recorded = config.recorded()
    if data.corpus_sha256 is not None:
        recorded["corpus_sha256"] = data.corpus_sha256
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


def run(config, log=print, devices=None, cross_run=False):
    """Train as `config` (a `RunConfig`) describes; returns the final metrics
    with the `history` and the trained `model`. ``log=None`` is silent;
    ``devices`` overrides the devices of the data-parallel mesh;
    ``cross_run=True`` adds the metrics that another run's model computes
    after training (`cross_run_metrics`), as the command line does."""
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
        f"L = {data.x_train.shape[1]}, {n_dev} device(s)")

    def checkpoint(step, history):
        if (config.out and config.ckpt_every and step % config.ckpt_every == 0
                and step != config.steps):
            save_checkpoint(config.out, model, optimizer, step,
                            {"config": recorded, "history": history})

    start = time.perf_counter()
    history = fit(model, data, steps=config.steps, batch_size=config.batch_size,
                  seed=config.seed, eval_every=config.eval_every, log=log,
                  log_every=config.log_every, optimizer=optimizer, mesh=mesh, history=history,
                  on_step=checkpoint)
    final = history["eval"][-1]
    if config.checkpoint_dtype is not None:
        # the run is the weights its checkpoint stores: score those
        round_weights(model, config.checkpoint_dtype)
        final = evaluate(model, data.x_test, data.y_test, mesh=mesh)
    metrics = {**test_metrics(final, data),
               **(cross_run_metrics(config, data, model) if cross_run else {}),
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
        write_history(config.out, history)
        for name, obj in [("config", recorded), ("metrics", metrics)]:
            write_json(config.out, f"{name}.json", obj)
    return {**metrics, "history": history, "model": model}


def _resume(config, model, optimizer, recorded, log):
    """With --resume and a checkpoint in --out: restore model and optimizer
    from it and return its history (None otherwise). A checkpoint written
    with another configuration is refused."""
    if not (config.out and config.resume
            and os.path.exists(os.path.join(config.out, CHECKPOINT))):
        return None
    step, extra, has_optimizer = read_checkpoint_info(config.out)
    saved = extra.get("config")
    saved = _present(saved, f"{config.out}/{CHECKPOINT}") if saved else {}
    if saved != recorded:
        changed = _differences(saved, recorded)
        raise ValueError(f"--resume: the checkpoint in {config.out} was written with a "
                         f"different configuration (differs in: {', '.join(changed)})")
    if not has_optimizer:           # the final checkpoint keeps the weights only
        raise ValueError(f"--resume: {config.out} holds a finished run (step {step}); its "
                         f"checkpoint keeps the weights, not the optimiser's state, so it "
                         f"cannot be continued: train into a new --out")
    load_checkpoint(config.out, model, optimizer)
    log(f"resumed from {config.out} at step {step}")
    return extra["history"]


def _differences(saved, recorded):
    """The options in which two config.json dicts differ, a layer's by name."""
    old, new = saved.get("layer_options", {}), recorded["layer_options"]
    return sorted([k for k in recorded if k != "layer_options" and saved.get(k) != recorded[k]]
                  + [k for k in set(old) | set(new) if old.get(k) != new.get(k)])


def load_run(directory, length=None):
    """(model, data, run) of a run directory: the model built from its config
    with the checkpoint's weights, the dataset it was trained on, and the
    run's config/history/metrics dicts. `length`: build the layers for
    sequences of that many positions instead of the training length (the
    weights of every layer are independent of it; a layer built for a length
    refuses longer inputs)."""
    run = read_run(directory)
    recorded = run["config"]
    config = read_config(recorded, directory)
    data = load_dataset(config)
    if data.corpus_sha256 not in (None, recorded.get("corpus_sha256")):
        raise ValueError(
            f"{directory} was trained on a different text (sha256 "
            f"{recorded['corpus_sha256'][:12]}...) than the package's corpus "
            f"({data.corpus_sha256[:12]}...): evaluate it with the version of the "
            f"package it was trained with, or retrain it (make reference RUN=<name>)")
    return load_model(directory, config, data, length), data, run


def load_model(directory, config, data, length=None):
    """The model of the run in `directory`: built from its checked `config`
    (`read_config`) for the dataset `data` with layers for `length` positions
    (default: the data's), filled with the checkpoint's weights."""
    # Built abstract (shapes only: no initialiser runs or compiles), then
    # filled with the checkpoint's arrays, which cover the whole state.
    model = nnx.eval_shape(lambda: build_model(config, data, length))
    load_checkpoint(directory, model)
    return model


def evaluate_run(directory, cross_run=False):
    """The run's test metrics recomputed from its checkpoint (`held_out_items`,
    then `metrics_of_items`, as `remeasure` computes them; with
    ``cross_run=True`` also `cross_run_metrics`, at float32 matmul
    precision), and the run: its config, history and recorded metrics, the
    loaded `model` and the `data` it was trained and tested on (the
    registry's dataset dict). The metrics carry their "tolerance" (`compare`)."""
    model, data, run = load_run(directory)
    metrics = metrics_of_items(held_out_items(directory, model, data), data)
    with jax.default_matmul_precision("float32"):
        if cross_run:
            extra = dict(cross_run_metrics(read_config(run["config"], directory), data, model))
            metrics["tolerance"].update(extra.pop("tolerance", {}))
            metrics = {**metrics, **extra}
    return metrics, {**run, "model": model, "data": data}


def cross_run_metrics(config, data, model):
    """The metrics of a run that another run's model computes: for a digit
    generator, the fraction of test digits whose top half, completed by
    `model`, the reference classifier (`COMPLETION_CLASSIFIERS`) reads as the
    true digit, when that run exists (in the repository, or published, see
    `runs.locate`), with its tolerance (`completion.completion_metrics`).
    {} otherwise."""
    name = COMPLETION_CLASSIFIERS.get(config.dataset)
    if name is None:
        return {}
    try:
        directory = locate(name)
    except FileNotFoundError:  # neither trained here nor in the package's manifest
        return {}
    return completion_metrics(model, load_run(directory)[0], data)


# --- Re-evaluations kept for the rest of a test run -------------------------------------
#: The environment variable naming a folder where `kept_items` keeps what it
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


def _evaluation_key(directory, x, y, batch_size):
    """A digest of everything a run's statistics on x, y depend on: its
    checkpoint and config, the items, the batch they were scored in (which may
    move a statistic by a rounding), the package's source (`_source_digest`),
    the library versions, the device, and whether TF32 is emulated."""
    import importlib.metadata as md
    h = hashlib.sha256()
    for name in (CHECKPOINT, "config.json"):
        with open(os.path.join(directory, name), "rb") as f:
            h.update(f.read())
    for a in (x, y):
        h.update(b"-" if a is None else np.ascontiguousarray(a).tobytes())
    h.update(f"batch {batch_size}".encode())
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


def held_out_items(directory, model, data, batch_size=RECORDED_BATCH):
    """`measure_items` of a loaded run (`load_run`) on its test set, at float32
    matmul precision, kept as `kept_items` keeps them."""
    return kept_items(directory, model, data.x_test, data.y_test, batch_size)


def kept_items(directory, model, x, y=None, batch_size=RECORDED_BATCH):
    """`measure_items` of the loaded run in `directory` on x, y (in batches of
    `batch_size`), at float32 matmul precision. Kept in the folder that
    $ANNOTATED_S4_EVAL_CACHE names, if set, under a digest of everything they
    depend on (`_evaluation_key`)."""
    def measure():
        with jax.default_matmul_precision("float32"):
            return measure_items(model, x, y, batch_size)

    folder = os.environ.get(EVAL_CACHE)
    if not folder:
        return measure()
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, _evaluation_key(directory, x, y, batch_size) + ".npz")
    with _locked(path + ".lock"):   # a second worker waits for the first's result
        if not os.path.exists(path):
            items = measure()
            np.savez(path + ".tmp.npz", **items)
            os.replace(path + ".tmp.npz", path)
        with np.load(path) as f:
            return {k: f[k] for k in f.files}
