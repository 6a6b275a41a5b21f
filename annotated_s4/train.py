"""Training: the loss, the optimiser with S4's parameter groups, one train
step, evaluation, and the one training loop `fit`.

Classification models return (batch, classes) log-probabilities; next-step
models return (batch, L, vocab) log-probabilities of their own (shifted) input.
Models and datasets are built by name in `annotated_s4.registry`;
checkpoints are `annotated_s4.checkpoint`.
"""

from __future__ import annotations

import functools
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec

from . import _checks as checks
from .catalog import SSMParam
from .models import eval_mode

__all__ = [
    "item_losses", "loss_fn", "fill_batch", "lr_schedule", "make_optimizer", "train_step", "evaluate",
    "make_mesh", "shard_batch", "replicate", "shard_params", "batch_indices", "fit",
    "seconds_per_step",
]


def item_losses(model, x, y=None):
    """Per item, the negative log-likelihood of its target and whether the
    most likely class is the target (1.0 or 0.0).

    With y (classification): one item per sequence, its label y (batch,), or
    one per answer token, y (batch, K) (`models.LastTokenModel` with answer_len).
    Without y (next-step prediction on integer tokens x (batch, L)): one item
    per token, in nats.
    """
    logp = model(x)
    target = x if y is None else y
    nll = -jnp.take_along_axis(logp, target[..., None], axis=-1)[..., 0]
    return nll, (logp.argmax(-1) == target).astype(jnp.float32)


def loss_fn(model, x, y=None):
    """Mean negative log-likelihood and accuracy over the items (`item_losses`)."""
    nll, right = item_losses(model, x, y)
    return nll.mean(), right.mean()


def _param_groups(model):
    """The optimiser's label function: 'ssm' for `model`'s state-space
    parameters (the layers declare them `catalog.SSMParam`), 'rest' for the
    others. Optax calls it on the parameters and on the updates, whose arrays
    no longer carry their variable's type, so it finds them by their path."""
    ssm = {tuple(path) for path, _ in nnx.to_flat_state(nnx.state(model, SSMParam))}

    def label(path, _):
        key = tuple(k.key for k in path if isinstance(k, jax.tree_util.DictKey))
        return "ssm" if key in ssm else "rest"

    return lambda params: jax.tree_util.tree_map_with_path(label, params)


SCHEDULES = ("cosine", "constant")


def lr_schedule(peak, steps, warmup=0, schedule="cosine"):
    """The learning rate at each step (counted from 0): a cosine decay from
    `peak` to 1% of `peak` at step `steps`, after `warmup` steps that rise
    linearly from 0 to `peak` (optax's warm-up cosine schedule; with no
    warm-up, its one warm-up step already at `peak`). With schedule
    "constant", the rate stays at `peak` after the warm-up: no annealed end,
    so that a run's last steps show where it stands at that rate rather than
    the flat end that any decay to 1% produces."""
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {list(SCHEDULES)}, got {schedule!r}")
    if schedule == "constant":
        if warmup:
            return optax.join_schedules([optax.linear_schedule(0.0, peak, warmup),
                                         optax.constant_schedule(peak)], [warmup])
        return optax.constant_schedule(peak)
    if warmup:
        return optax.warmup_cosine_decay_schedule(0.0, peak, warmup, steps, peak * 0.01)
    return optax.warmup_cosine_decay_schedule(peak, peak, 1, max(steps, 2), peak * 0.01)


def make_optimizer(model, lr=1e-3, weight_decay=0.01, steps=1000, ssm_lr=None,
                   ssm_weight_decay=0.0, warmup=0, schedule="cosine"):
    """AdamW with a cosine (or constant) schedule (`lr_schedule`, after
    `warmup` steps of linear warm-up), gradients clipped to global norm 1.

    With `ssm_lr`, the S4 paper's recipe: the state-space parameters
    (declared `SSMParam` by the layers) train at the learning rate `ssm_lr` with
    `ssm_weight_decay` (the recipe's 0), every other parameter at `lr` with
    `weight_decay`. Decay would pull log(Delta) and the eigenvalues'
    log(-Re Lambda) toward 0, that is, toward a step of 1 and a decay rate of
    1, whatever the data asks for.
    """
    def adamw(peak, decay):
        return optax.adamw(lr_schedule(peak, steps, warmup, schedule), weight_decay=decay)

    if ssm_lr is None:
        tx = adamw(lr, weight_decay)
    else:
        tx = optax.multi_transform({"ssm": adamw(ssm_lr, ssm_weight_decay),
                                    "rest": adamw(lr, weight_decay)}, _param_groups(model))
    return nnx.Optimizer(model, optax.chain(optax.clip_by_global_norm(1.0), tx), wrt=nnx.Param)


@nnx.jit
def train_step(model, optimizer, x, y):
    """One gradient step; y=None for next-step models. Returns (loss, accuracy)."""
    grad_fn = nnx.value_and_grad(loss_fn, has_aux=True)
    (loss, acc), grads = grad_fn(model, x, y)
    optimizer.update(model, grads)
    return loss, acc


def fill_batch(a, size):
    """a with its first item repeated until it holds `size` items: a last,
    shorter batch filled up, so that one compiled program takes every batch."""
    return np.concatenate([a, np.repeat(a[:1], size - len(a), axis=0)])


@nnx.jit
def _eval_sums(model, x, y, n):
    """The sums of `item_losses` over the first n items of the batch."""
    nll, right = item_losses(model, x, y)
    valid = (jnp.arange(x.shape[0]) < n).reshape((-1,) + (1,) * (nll.ndim - 1))
    return jnp.where(valid, nll, 0.0).sum(), jnp.where(valid, right, 0.0).sum()


def evaluate(model, x, y=None, batch_size=256, mesh=None):
    """Mean loss and accuracy over a whole split, in eval mode (the model's
    mode is restored afterwards), at float32 matmul precision: a measurement,
    which a GPU's default TF32 products would blur (a run's recorded metrics
    come from here, and its re-evaluation, `measure.remeasure`, uses the same
    precision).

    Every batch has the same size (a last, shorter one is filled up with
    `fill_batch` and only its own items counted), so that one program, compiled
    once, evaluates the split. With a `mesh`, each batch is split over its
    devices like a training batch, so that each device evaluates its share; a
    batch size the devices do not divide is replicated instead.
    """
    n = len(x)
    size = min(batch_size, n)   # every batch this size: one program (`fill_batch`)
    totals = np.zeros(2)

    def put(a):
        if mesh is None:
            return jnp.asarray(a)
        if len(a) % mesh.devices.size == 0:
            return shard_batch(mesh, a)
        return jax.device_put(a, NamedSharding(mesh, PartitionSpec()))

    with eval_mode(model), jax.default_matmul_precision("float32"):
        for start in range(0, n, size):
            m = len(x[start:start + size])
            xb = put(fill_batch(x[start:start + size], size))
            yb = None if y is None else put(fill_batch(y[start:start + size], size))
            totals += np.array([float(s) for s in _eval_sums(model, xb, yb, m)])
    # items: tokens of a next-step model, or targets (one per sequence, or an answer span)
    items = n * int(np.prod(np.shape(x if y is None else y)[1:]))
    return {"loss": totals[0] / items, "accuracy": totals[1] / items}


# ---------------------------------------------------------------------------
# Data parallelism: a 1-D device mesh. Each batch is split along its first
# axis over the devices and the model is replicated (or, with `shard_params`,
# split as well: FSDP); `jax.jit` (inside
# nnx.jit) then runs the same program on every device and inserts the
# all-reduce of the gradients itself (the mean over the batch becomes a
# cross-device sum).
# ---------------------------------------------------------------------------


def make_mesh(devices=None):
    """A 1-D mesh named ("data",) over `devices` (default: all), made by
    `jax.make_mesh` (which orders devices by their physical topology), with
    the axis type Auto: `jit` partitions whatever the inputs' shardings leave
    open."""
    devices = jax.devices() if devices is None else list(devices)
    if not devices:
        raise ValueError("devices must not be empty")
    return jax.make_mesh((len(devices),), ("data",), axis_types=(AxisType.Auto,),
                         devices=devices)


def shard_batch(mesh, x):
    """Place x (batch, ...) on the mesh, split along its first axis."""
    n_dev = mesh.devices.size
    if x.shape[0] % n_dev:
        raise ValueError(
            f"batch_size ({x.shape[0]}) must be divisible by the number of "
            f"devices ({n_dev})"
        )
    return jax.device_put(x, NamedSharding(mesh, PartitionSpec("data")))


def replicate(mesh, *nodes):
    """Copy the state of NNX objects (model, optimizer) onto every device."""
    state = nnx.state(nodes)
    nnx.update(nodes, jax.device_put(state, NamedSharding(mesh, PartitionSpec())))


def shard_params(mesh, *nodes):
    """Fully sharded data parallelism (FSDP): split every array of the state of
    NNX objects (model, optimizer) over the mesh's devices, in `replicate`'s
    place, so that each of n devices holds about 1/n of it.

    Each array is split along its largest axis that the number of devices
    divides; one with no such axis (a scalar such as a step count, a short
    bias) is replicated. The step needs no change: under `jit`, XLA's
    partitioner inserts the collectives itself, gathering a split parameter
    where a computation needs it whole and summing the gradients over the
    devices, and each device updates only its own slice.
    """
    n = mesh.devices.size

    def sharding(x):
        axes = [a for a in range(x.ndim) if x.shape[a] % n == 0]
        if not axes:
            return NamedSharding(mesh, PartitionSpec())
        axis = max(axes, key=lambda a: x.shape[a])  # the first of the largest
        return NamedSharding(mesh, PartitionSpec(*[None] * axis, "data"))

    state = nnx.state(nodes)
    nnx.update(nodes, jax.device_put(state, jax.tree.map(sharding, state)))


def batch_indices(seed, step, n, batch_size):
    """Indices of the mini-batch used at `step` (1-based): epoch-wise shuffles.

    A pure function of (seed, step), so a resumed run sees exactly the batches
    the uninterrupted run would have seen.
    """
    per_epoch = n // batch_size
    epoch, k = divmod(step - 1, per_epoch)
    order = np.random.default_rng([seed, epoch]).permutation(n)
    return order[k * batch_size:(k + 1) * batch_size]


def fit(model, data, *, steps=500, batch_size=64, lr=None, weight_decay=None, ssm_lr=None,
        seed=0, eval_every=0, log=print, log_every=0, optimizer=None, mesh=None,
        history=None, on_step=None):
    """Train `model` on `data` (a `datasets.Dataset`: its training split, scored
    on its test split) for `steps` steps (the batch of step s:
    `batch_indices(seed, s, ...)`).

    Returns the history: "step", "train_loss" and "seconds" (the step's wall
    time, evaluations excluded) for every step; "eval", dicts of step, loss and
    accuracy on the test split every `eval_every` steps and at the end
    (`seconds_per_step(history)` summarises the timing). To resume, pass the restored `optimizer`
    and the saved `history`. With a `mesh`, batches are split over its devices
    (model and optimizer replicated first). `on_step(step, history)` runs after
    every step (checkpointing, pre-emption).

    The optimiser is `make_optimizer(model, lr, weight_decay, steps, ssm_lr)`
    (its defaults where a rate is not given), or the `optimizer` passed
    in, which carries its own rates: then lr, weight_decay and ssm_lr are
    refused rather than ignored.

    Each step's loss is read back to the host (to record it and to stop on a
    non-finite loss), which waits for the step; the next batch is gathered
    and sent to the device before that wait, so that this host work overlaps
    the device's computation instead of following it.
    """
    if not all(hasattr(data, a) for a in ("x_train", "y_train", "x_test", "y_test")):
        raise TypeError("data must be a datasets.Dataset (x_train, y_train, x_test, "
                        f"y_test), got {type(data).__name__}")
    x_train, y_train, x_test, y_test = data.x_train, data.y_train, data.x_test, data.y_test
    steps = checks.positive_int(steps, "steps")
    batch_size = checks.batch_size(batch_size, len(x_train))
    rates = {k: v for k, v in (("lr", lr), ("weight_decay", weight_decay), ("ssm_lr", ssm_lr))
             if v is not None}
    if optimizer is None:
        optimizer = make_optimizer(model, steps=steps, **rates)
    elif rates:
        raise ValueError(f"{', '.join(rates)}: fit trains with the optimizer passed in, which "
                         f"carries its own rates; give them to make_optimizer instead")
    if mesh is not None:
        replicate(mesh, model, optimizer)
    put = jnp.asarray if mesh is None else functools.partial(shard_batch, mesh)
    history = history or {"step": [], "train_loss": [], "seconds": [], "eval": []}
    log = log or (lambda *_: None)
    model.train()
    first = history["step"][-1] + 1 if history["step"] else 1

    def batch(step):
        idx = batch_indices(seed, step, len(x_train), batch_size)
        return put(x_train[idx]), None if y_train is None else put(y_train[idx])

    xb, yb = batch(first) if first <= steps else (None, None)
    for step in range(first, steps + 1):
        start = time.perf_counter()
        loss, acc = train_step(model, optimizer, xb, yb)  # returns before the step is done
        if step < steps:
            xb, yb = batch(step + 1)  # prepared while the device computes
        loss = float(loss)  # waits for the step to finish
        checks.finite_loss(loss, step, lr)
        history["step"].append(step)
        history["train_loss"].append(loss)
        history["seconds"].append(time.perf_counter() - start)
        if log_every and (step % log_every == 0 or step == steps):
            log(f"step {step:6d}/{steps}  loss {loss:.4f}  acc {float(acc):.3f}  "
                f"{1e3 * seconds_per_step(history):.1f} ms/step")
        if step == steps or (eval_every and step % eval_every == 0):
            metrics = evaluate(model, x_test, y_test, mesh=mesh)
            history["eval"].append({"step": step, **metrics})
            log(f"step {step:6d}  train loss {loss:.4f}  test loss {metrics['loss']:.4f}  "
                f"test acc {metrics['accuracy']:.4f}")
        if on_step is not None:
            on_step(step, history)
    return history


def seconds_per_step(history):
    """The median wall time of a training step in `history` (from `fit`): the
    median leaves out the first step of a process, which compiles."""
    return float(np.median(history["seconds"])) if history.get("seconds") else float("nan")

