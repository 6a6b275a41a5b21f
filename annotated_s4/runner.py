"""Runs: train a configuration into a run directory, resume it, load and
re-evaluate it.

A run directory holds `config.json` (`RunConfig.recorded()`, plus the hash
of the text for a language model; `read_run` reads an older, flat one in the
present layout), `history.json` (the learning curve),
`metrics.json` (the final test metrics, written last) and `checkpoint.npz`.
Metrics that need another run (a generator scored by a trained classifier)
are computed after training, by a function passed as `extra_metrics`
(`annotated_s4.reference.cross_run_metrics`).
"""

from __future__ import annotations

import os
import time

from . import checkpoint as _checkpoint
from .checkpoint import (CHECKPOINT, load_checkpoint, read_checkpoint_info, save_checkpoint,
                         write_json)
from .config import EXTRA_KEYS, RunConfig
from .registry import (build_model, build_optimizer, count_params, load_dataset, resolve,
                       test_metrics)
from .train import evaluate, fit, make_mesh, seconds_per_step

__all__ = ["run", "config_of", "read_config", "read_run", "load_run", "evaluate_run"]


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
    metrics = {**test_metrics(history["eval"][-1], data),
               **(extra_metrics(config, data, model) if extra_metrics else {}),
               "steps": config.steps, "parameters": n_params, "devices": n_dev,
               "seconds_per_step": seconds_per_step(history),
               "wall_seconds": time.perf_counter() - start}
    log("final  " + "  ".join(f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}"
                              for k, v in metrics.items()))
    if config.out:
        # A finished run keeps the model only: the optimizer's state is needed
        # to resume an unfinished run, and would triple the file.
        save_checkpoint(config.out, model, None, config.steps, {"config": recorded})
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
    model = build_model(config, data)
    load_checkpoint(directory, model)
    return model, data, run


def evaluate_run(directory, extra_metrics=None):
    """The run's test metrics recomputed from its checkpoint (with
    ``extra_metrics(config, data, model)``, if given), and the run: its
    config, history and recorded metrics, the loaded `model` and the `data`
    it was trained and tested on (the registry's dataset dict)."""
    model, data, run = load_run(directory)
    metrics = test_metrics(evaluate(model, data["x_test"], data["y_test"]), data)
    if extra_metrics:
        metrics.update(extra_metrics(read_config(run["config"], directory), data, model))
    return metrics, {**run, "model": model, "data": data}
