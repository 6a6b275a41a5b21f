"""Training: losses, an optax/NNX train step, and a small `fit` loop.

The loop is deliberately plain: sample a batch, take a step, evaluate now and
then. Classification models return (batch, classes) log-probabilities; next-step
models return (batch, L, vocab) log-probabilities of their own (shifted) input.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from .data import batches
from .models import LastTokenModel, StackedModel

__all__ = [
    "loss_fn", "make_optimizer", "train_step", "evaluate", "fit",
    "DATASETS", "LAYERS", "RECALL_DEFAULTS", "make_mesh", "shard_batch", "replicate",
    "save_checkpoint", "load_checkpoint", "batch_indices", "build_parser",
    "build_model", "run", "main",
]


def loss_fn(model, x, y=None):
    """Mean negative log-likelihood and accuracy.

    With y (classification): NLL of the labels y (batch,). Without y (next-step
    prediction on integer tokens x (batch, L)): NLL per token, in nats.
    """
    logp = model(x)
    target = x if y is None else y
    nll = -jnp.take_along_axis(logp, target[..., None], axis=-1)[..., 0]
    acc = (logp.argmax(-1) == target).astype(jnp.float32)
    return nll.mean(), acc.mean()


def make_optimizer(model, lr=1e-3, weight_decay=0.01, steps=1000, warmup=0):
    """AdamW with a cosine schedule (optional linear warm-up)."""
    schedule = optax.warmup_cosine_decay_schedule(
        0.0 if warmup else lr, lr, max(warmup, 1), max(steps, warmup + 1), lr * 0.01
    )
    tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(schedule, weight_decay=weight_decay))
    return nnx.Optimizer(model, tx, wrt=nnx.Param)


@nnx.jit
def train_step(model, optimizer, x, y):
    """One gradient step; y=None for next-step models. Returns (loss, accuracy)."""
    grad_fn = nnx.value_and_grad(loss_fn, has_aux=True)
    (loss, acc), grads = grad_fn(model, x, y)
    optimizer.update(model, grads)
    return loss, acc


@nnx.jit
def _eval_batch(model, x, y):
    return loss_fn(model, x, y)


def evaluate(model, x, y=None, batch_size=256, mesh=None):
    """Mean loss and accuracy over a whole split (model put in eval mode).

    With a `mesh`, each evaluation batch is replicated onto its devices (where
    the replicated model lives).
    """
    model.eval()
    n = len(x)
    totals = np.zeros(2)
    put = jnp.asarray if mesh is None else (
        lambda a: jax.device_put(a, NamedSharding(mesh, P())))
    for start in range(0, n, batch_size):
        xb = put(x[start:start + batch_size])
        yb = None if y is None else put(y[start:start + batch_size])
        loss, acc = _eval_batch(model, xb, yb)
        totals += np.array([float(loss), float(acc)]) * len(xb)
    model.train()
    return {"loss": totals[0] / n, "accuracy": totals[1] / n}


def fit(model, x_train, y_train=None, x_test=None, y_test=None, *, steps=500,
        batch_size=64, lr=1e-3, weight_decay=0.01, seed=0, eval_every=None,
        log=print):
    """Train `model` for `steps` steps; returns a history of metrics.

    The history holds the training loss of every step, the evaluations made
    every `eval_every` steps (and at the end), and the seconds per training
    step, measured over the steps after the first (which compiles) and without
    the evaluations.
    """
    if steps < 1:
        raise ValueError(f"steps must be positive, got {steps}")
    optimizer = make_optimizer(model, lr=lr, weight_decay=weight_decay, steps=steps)
    model.train()
    rng = np.random.default_rng(seed)
    sampler = batches(rng, len(x_train), batch_size)
    history = {"step": [], "train_loss": [], "eval": []}
    train_seconds = 0.0
    for step in range(1, steps + 1):
        idx = next(sampler)
        yb = None if y_train is None else jnp.asarray(y_train[idx])
        start = time.perf_counter()
        loss, _ = train_step(model, optimizer, jnp.asarray(x_train[idx]), yb)
        loss = float(loss)  # waits for the step to finish
        if step > 1:  # the first step compiles: time the others
            train_seconds += time.perf_counter() - start
        history["step"].append(step)
        history["train_loss"].append(loss)
        if x_test is not None and (step == steps or (eval_every and step % eval_every == 0)):
            metrics = evaluate(model, x_test, y_test)
            history["eval"].append({"step": step, **metrics})
            if log:
                log(f"step {step:5d}  train loss {loss:.4f}  "
                    f"test loss {metrics['loss']:.4f}  test acc {metrics['accuracy']:.4f}")
    history["seconds_per_step"] = train_seconds / max(steps - 1, 1)
    return history


# ---------------------------------------------------------------------------
# Registries: what the command line can build.
#
# A dataset loader takes the parsed arguments and returns a dict with
#   x_train, y_train, x_test, y_test   (y_* is None for next-step generation)
#   classification (bool), d_output (classes or vocabulary size),
#   d_input (features per step, dense encoder) and vocab_size (None, or the
#   number of tokens for an embedding encoder).
# A layer builder takes the parsed arguments and the sequence length L and
# returns a layer factory `factory(H, rngs=...)` that follows the layer
# contract of `annotated_s4.layers`.
# Both are plain dicts: add an entry to extend the command line.
# ---------------------------------------------------------------------------


def _digits(side):
    def load(args):
        from .data import load_digits_sequences

        d = load_digits_sequences(side=side, seed=args.seed_data)
        return {**d, "classification": True, "d_output": 10, "d_input": 1,
                "vocab_size": None}

    return load


def _digits_gen(args):
    from .data import DIGIT_LEVELS, load_digits_sequences

    d = load_digits_sequences(side=8, quantize=True, seed=args.seed_data)
    return {"x_train": d["x_train"], "y_train": None, "x_test": d["x_test"],
            "y_test": None, "classification": False, "d_output": DIGIT_LEVELS,
            "d_input": 1, "vocab_size": DIGIT_LEVELS}


def _mnist(args):
    from .data import load_mnist

    d = load_mnist()
    return {**d, "classification": True, "d_output": 10, "d_input": 1,
            "vocab_size": None}


# The synthetic recall tasks at the sizes of the H3 paper's table:
# (sequence length, vocabulary size), used when --seq-len / --vocab-size are not given.
RECALL_DEFAULTS = {"induction-head": (30, 20), "associative-recall": (20, 10)}


def _recall(name):
    """The synthetic recall tasks of chapter 7 (H3): the label is the final
    token; the model reads the sequence causally and is scored there only."""
    def load(args):
        from . import data as d

        gen = getattr(d, name)
        x_train, y_train = gen(np.random.default_rng(args.seed_data), 5000,
                               seq_len=args.seq_len, vocab_size=args.vocab_size)
        x_test, y_test = gen(np.random.default_rng(args.seed_data + 1), 512,
                             seq_len=args.seq_len, vocab_size=args.vocab_size)
        return {"x_train": x_train, "y_train": y_train, "x_test": x_test,
                "y_test": y_test, "classification": False, "last_token": True,
                "d_output": args.vocab_size, "d_input": 1,
                "vocab_size": args.vocab_size}

    return load


DATASETS = {
    "digits": _digits(8),
    "digits-784": _digits(28),
    "digits-gen": _digits_gen,
    "mnist": _mnist,
    "induction-head": _recall("induction_head"),
    "associative-recall": _recall("associative_recall"),
}


def _ssm_layer(args, L):
    from .layers import SSMLayer

    return functools.partial(SSMLayer, N=args.state_size, L=L)


def _s4_layer(args, L):
    from .layers import S4Layer

    return functools.partial(S4Layer, N=args.state_size, L=L)


def _s4d_layer(args, L):
    from .layers import S4DLayer

    return functools.partial(S4DLayer, N=args.state_size, L=L)


def _h3_layer(args, L):
    from .h3 import H3Layer

    return functools.partial(H3Layer, head_dim=args.head_dim, state_size=args.state_size, L=L)


def _attention_layer(args, L):
    from .attention import CausalSelfAttention

    return functools.partial(CausalSelfAttention, n_heads=args.n_heads, max_len=L + 1)


def _hybrid_layer(args, L):
    """H3 with attention in every second layer (one attention layer in a
    2-layer model), the hybrid of the H3 paper at small scale."""
    return [_h3_layer(args, L), _attention_layer(args, L)]


LAYERS = {
    "ssm": _ssm_layer,
    "s4": _s4_layer,
    "s4d": _s4d_layer,
    "h3": _h3_layer,
    "attention": _attention_layer,
    "hybrid": _hybrid_layer,
}


# ---------------------------------------------------------------------------
# Data parallelism: one mesh axis, "data", over the local devices. The batch
# is split along it; parameters and optimizer state are replicated. `jit`
# then runs the same program on every device and inserts the all-reduce of
# the gradients itself (the mean over the batch becomes a cross-device sum).
# ---------------------------------------------------------------------------


def make_mesh(devices=None):
    """A 1-D `jax.sharding.Mesh` named ("data",) over `devices` (default: all)."""
    devices = jax.devices() if devices is None else list(devices)
    if not devices:
        raise ValueError("devices must not be empty")
    return Mesh(np.array(devices), ("data",))


def shard_batch(mesh, x):
    """Place x (batch, ...) on the mesh, split along its first axis."""
    n_dev = mesh.devices.size
    if x.shape[0] % n_dev:
        raise ValueError(
            f"batch_size ({x.shape[0]}) must be divisible by the number of "
            f"devices ({n_dev})"
        )
    return jax.device_put(x, NamedSharding(mesh, P("data")))


def replicate(mesh, *nodes):
    """Copy the state of NNX objects (model, optimizer) onto every device."""
    state = nnx.state(nodes)
    nnx.update(nodes, jax.device_put(state, NamedSharding(mesh, P())))


# ---------------------------------------------------------------------------
# Checkpoints: the flattened state of (model, optimizer) in one .npz file,
# no pickle. Leaves are stored in tree order with their paths, so that a
# checkpoint from a different architecture is refused instead of misread.
# PRNG keys (dropout streams) are stored as their raw key data.
# ---------------------------------------------------------------------------

CHECKPOINT = "checkpoint.npz"


def _path_str(path):
    return "/".join(str(getattr(k, "key", getattr(k, "idx", getattr(k, "name", k))))
                    for k in path)


def save_checkpoint(directory, model, optimizer, step, extra=None):
    """Write (model, optimizer) state and `step` to directory/checkpoint.npz atomically."""
    os.makedirs(directory, exist_ok=True)
    leaves = jax.tree_util.tree_leaves_with_path(nnx.state((model, optimizer)))
    arrays, paths = {}, []
    for i, (path, leaf) in enumerate(leaves):
        if jnp.issubdtype(leaf.dtype, jax.dtypes.prng_key):
            leaf = jax.random.key_data(leaf)
        arrays[f"leaf_{i:05d}"] = np.asarray(leaf)
        paths.append(_path_str(path))
    arrays["paths"] = np.array(paths, dtype=str)
    arrays["step"] = np.array(step, dtype=np.int64)
    arrays["extra"] = np.array(json.dumps(extra or {}))
    tmp = os.path.join(directory, CHECKPOINT + ".tmp.npz")
    np.savez(tmp, **arrays)
    os.replace(tmp, os.path.join(directory, CHECKPOINT))


def load_checkpoint(directory, model, optimizer):
    """Restore (model, optimizer) in place from directory/checkpoint.npz.

    Returns (step, extra). Raises FileNotFoundError if there is no checkpoint
    and ValueError if it was written for a different model or optimizer.
    """
    path = os.path.join(directory, CHECKPOINT)
    if not os.path.exists(path):
        raise FileNotFoundError(f"no checkpoint at {path}")
    state = nnx.state((model, optimizer))
    leaves_with_path, treedef = jax.tree_util.tree_flatten_with_path(state)
    with np.load(path, allow_pickle=False) as f:
        paths = [str(p) for p in f["paths"]]
        expected = [_path_str(p) for p, _ in leaves_with_path]
        if paths != expected:
            raise ValueError(
                f"checkpoint {path} does not match this model/optimizer "
                f"({len(paths)} saved leaves vs {len(expected)} expected)"
            )
        new = []
        for i, (_, leaf) in enumerate(leaves_with_path):
            saved = f[f"leaf_{i:05d}"]
            if jnp.issubdtype(leaf.dtype, jax.dtypes.prng_key):
                value = jax.random.wrap_key_data(saved, impl=jax.random.key_impl(leaf))
            else:
                if saved.shape != leaf.shape:
                    raise ValueError(
                        f"checkpoint leaf {paths[i]} has shape {saved.shape}, "
                        f"expected {leaf.shape}"
                    )
                value = jnp.asarray(saved, dtype=leaf.dtype)
            new.append(jax.device_put(value, leaf.sharding))
        step = int(f["step"])
        extra = json.loads(str(f["extra"]))
    nnx.update((model, optimizer), jax.tree_util.tree_unflatten(treedef, new))
    return step, extra


# ---------------------------------------------------------------------------
# The command line.
# ---------------------------------------------------------------------------


def batch_indices(seed, step, n, batch_size):
    """Indices of the mini-batch used at `step` (1-based): epoch-wise shuffles.

    A pure function of (seed, step), so a resumed run sees exactly the batches
    the uninterrupted run would have seen.
    """
    per_epoch = n // batch_size
    epoch, k = divmod(step - 1, per_epoch)
    order = np.random.default_rng([seed, epoch]).permutation(n)
    return order[k * batch_size:(k + 1) * batch_size]


def build_parser():
    p = argparse.ArgumentParser(
        prog="python -m annotated_s4.train",
        description="Train a stacked SSM / S4 / S4D / H3 / attention model on an "
                    "offline dataset (or MNIST, downloaded once).",
    )
    p.add_argument("--dataset", choices=sorted(DATASETS), default="digits",
                   help="digits: 8x8 digits as 64-step sequences; digits-784: upsampled "
                        "to 28x28 = 784 steps; digits-gen: next-pixel generation; "
                        "induction-head, associative-recall: the synthetic recall tasks "
                        "of chapter 7, scored on the final position; mnist: 784-step "
                        "sequential MNIST (needs a download)")
    p.add_argument("--layer", choices=sorted(LAYERS), default="s4",
                   help="the sequence layer; hybrid: H3 and attention alternating")
    p.add_argument("--n-layers", type=int, default=2)
    p.add_argument("--d-model", type=int, default=32)
    p.add_argument("--state-size", type=int, default=16, help="N, the SSM state size")
    p.add_argument("--head-dim", type=int, default=8, help="H3 head dimension d_h")
    p.add_argument("--n-heads", type=int, default=4, help="attention heads")
    p.add_argument("--steps", type=int, default=500)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--weight-decay", type=float, default=0.01)
    p.add_argument("--dropout", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=0, help="model init and batch order")
    p.add_argument("--seed-data", type=int, default=0, help="train/test split")
    p.add_argument("--vocab-size", type=int, default=None,
                   help="vocabulary of the recall tasks (default: 20 for induction-head, "
                        "10 for associative-recall, as in the H3 paper)")
    p.add_argument("--seq-len", type=int, default=None,
                   help="sequence length of the recall tasks (default: 30 for "
                        "induction-head, 20 for associative-recall)")
    p.add_argument("--eval-every", type=int, default=0,
                   help="evaluate on the test split every this many steps (0: at the end)")
    p.add_argument("--log-every", type=int, default=50)
    p.add_argument("--ckpt-every", type=int, default=100,
                   help="save a checkpoint every this many steps (and at the end)")
    p.add_argument("--out", default=None, help="output directory: checkpoint.npz, "
                   "config.json, history.json, metrics.json")
    p.add_argument("--resume", action="store_true",
                   help="continue from OUT/checkpoint.npz if it exists")
    return p


def _check_args(args):
    """Fill in the recall tasks' default sizes and refuse impossible values."""
    seq_len, vocab_size = RECALL_DEFAULTS.get(args.dataset, (None, None))
    args.seq_len = seq_len if args.seq_len is None else args.seq_len
    args.vocab_size = vocab_size if args.vocab_size is None else args.vocab_size
    positive = ["n_layers", "d_model", "state_size", "head_dim", "n_heads", "steps",
                "batch_size", "log_every"]
    if args.dataset in RECALL_DEFAULTS:
        positive += ["vocab_size", "seq_len"]
    for name in positive:
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be positive, "
                             f"got {getattr(args, name)}")
    for name in ("eval_every", "ckpt_every", "weight_decay"):
        if getattr(args, name) < 0:
            raise ValueError(f"--{name.replace('_', '-')} must not be negative, "
                             f"got {getattr(args, name)}")
    if args.lr <= 0:
        raise ValueError(f"--lr must be positive, got {args.lr}")
    if not 0.0 <= args.dropout < 1.0:
        raise ValueError(f"--dropout must lie in [0, 1), got {args.dropout}")
    if args.resume and not args.out:
        raise ValueError("--resume needs --out DIR")


def build_model(args, data):
    """The StackedModel described by `args` for the dataset `data`."""
    L = data["x_train"].shape[1]
    layer = LAYERS[args.layer](args, L)
    model = StackedModel(
        layer, data["d_output"], args.d_model, args.n_layers,
        rngs=nnx.Rngs(args.seed), d_input=data["d_input"],
        vocab_size=data["vocab_size"], classification=data["classification"],
        dropout=args.dropout,
    )
    if data.get("last_token"):  # recall tasks: predict the token after x
        model = LastTokenModel(model)
    return model


_MODEL_KEYS = ("dataset", "layer", "n_layers", "d_model", "state_size", "head_dim",
               "n_heads", "steps", "batch_size", "lr", "weight_decay", "dropout", "seed",
               "seed_data", "vocab_size", "seq_len")


def run(args, log=print, devices=None):
    """Train as the command line describes.

    Returns the final metrics together with the ``history`` (train loss of
    every step, evaluations) and the trained ``model``. ``log=None`` is silent;
    ``devices`` overrides the devices of the data-parallel mesh.
    """
    log = log or (lambda *_: None)
    _check_args(args)
    mesh = make_mesh(devices)
    n_dev = mesh.devices.size
    if args.batch_size % n_dev:
        raise ValueError(
            f"--batch-size ({args.batch_size}) must be divisible by the number "
            f"of devices ({n_dev})"
        )
    data = DATASETS[args.dataset](args)
    if args.batch_size > len(data["x_train"]):
        raise ValueError(
            f"--batch-size ({args.batch_size}) must not exceed the number of "
            f"training sequences ({len(data['x_train'])})"
        )
    model = build_model(args, data)
    optimizer = make_optimizer(model, lr=args.lr, weight_decay=args.weight_decay,
                               steps=args.steps)
    config = {k: getattr(args, k) for k in _MODEL_KEYS}
    history = {"step": [], "train_loss": [], "eval": []}
    start_step = 0
    if args.out and args.resume and os.path.exists(os.path.join(args.out, CHECKPOINT)):
        with np.load(os.path.join(args.out, CHECKPOINT), allow_pickle=False) as f:
            saved = json.loads(str(f["extra"])).get("config")
        if saved != config:
            changed = sorted(k for k in config if (saved or {}).get(k) != config[k])
            raise ValueError(
                f"--resume: the checkpoint in {args.out} was written with a "
                f"different configuration (differs in: {', '.join(changed)})"
            )
        start_step, extra = load_checkpoint(args.out, model, optimizer)
        history = extra.get("history", history)
        log(f"resumed from {args.out} at step {start_step}")
    replicate(mesh, model, optimizer)
    n_params = sum(int(np.prod(x.shape)) for x in
                   jax.tree_util.tree_leaves(nnx.state(model, nnx.Param)))
    log(f"{args.layer} on {args.dataset}: {n_params:,} parameters, "
        f"L = {data['x_train'].shape[1]}, {n_dev} device(s)")

    x_train, y_train = data["x_train"], data["y_train"]
    generation = y_train is None

    def evaluate_test():
        m = evaluate(model, data["x_test"], data["y_test"], mesh=mesh)
        return ({"test_nll": m["loss"], "test_accuracy": m["accuracy"]} if generation
                else {"test_loss": m["loss"], "test_accuracy": m["accuracy"]})

    def checkpoint(step):
        if args.out:
            save_checkpoint(args.out, model, optimizer, step,
                            {"config": config, "history": history})

    model.train()
    t0, timed_steps = time.perf_counter(), 0
    for step in range(start_step + 1, args.steps + 1):
        idx = batch_indices(args.seed, step, len(x_train), args.batch_size)
        xb = shard_batch(mesh, x_train[idx])
        yb = None if generation else shard_batch(mesh, y_train[idx])
        loss, acc = train_step(model, optimizer, xb, yb)
        loss = float(loss)
        if not np.isfinite(loss):
            raise FloatingPointError(
                f"training diverged at step {step}: the loss is {loss}; "
                f"try a smaller --lr (now {args.lr})"
            )
        history["step"].append(step)
        history["train_loss"].append(loss)
        if step == start_step + 1:  # the first step compiles: time the rest
            t0, timed_steps = time.perf_counter(), 0
        else:
            timed_steps += 1
        if step % args.log_every == 0 or step == args.steps:
            rate = (time.perf_counter() - t0) / max(timed_steps, 1)
            log(f"step {step:6d}/{args.steps}  loss {loss:.4f}  "
                f"acc {float(acc):.3f}  {1e3 * rate:.1f} ms/step")
        if args.eval_every and step % args.eval_every == 0 and step != args.steps:
            history["eval"].append({"step": step, **evaluate_test()})
            log(f"step {step:6d}  " + "  ".join(
                f"{k} {v:.4f}" for k, v in history["eval"][-1].items() if k != "step"))
        if args.ckpt_every and step % args.ckpt_every == 0 and step != args.steps:
            checkpoint(step)
    seconds_per_step = (time.perf_counter() - t0) / max(timed_steps, 1)
    final = evaluate_test()
    metrics = {**final, "steps": args.steps, "parameters": n_params,
               "devices": n_dev, "seconds_per_step": seconds_per_step}
    history["eval"].append({"step": args.steps, **final})
    log("final  " + "  ".join(f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}"
                              for k, v in metrics.items()))
    if args.out:
        checkpoint(args.steps)
        with open(os.path.join(args.out, "config.json"), "w") as f:
            json.dump(config, f, indent=2)
        with open(os.path.join(args.out, "history.json"), "w") as f:
            json.dump(history, f)
        with open(os.path.join(args.out, "metrics.json"), "w") as f:
            json.dump(metrics, f, indent=2)
    return {**metrics, "history": history, "model": model}


def main(argv=None):
    """Entry point of `python -m annotated_s4.train`."""
    args = build_parser().parse_args(argv)
    try:
        result = run(args)
    except (ValueError, FloatingPointError) as e:
        raise SystemExit(f"error: {e}")
    return {k: v for k, v in result.items() if k not in ("model", "history")}


if __name__ == "__main__":
    main()
