"""Tests for annotated_s4.train: the fit loop, the loss, evaluation, the optimizer,
and data parallelism (1 device vs 4 host devices give the same loss curve)."""

import dataclasses
import functools
import json
import os
import subprocess
import sys

import annotated_s4.data
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from annotated_s4 import registry, runner, train
from annotated_s4 import S4DLayer, SSMLayer, StackedModel
from annotated_s4.catalog import SSMParam
from annotated_s4.config import RunConfig
from annotated_s4.datasets import Dataset
from annotated_s4.longconv import ToeplitzLayer

TINY = ["--dataset", "digits", "--layer", "ssm", "--n-layers", "1", "--d-model", "8",
        "--state-size", "4", "--batch-size", "16", "--lr", "1e-2", "--log-every", "100"]


def _args(extra):
    return registry.parse(TINY + extra)


def test_fit_learns_digits():
    d = annotated_s4.data.load_digits_sequences(side=8)
    model = StackedModel(functools.partial(S4DLayer, N=8, L=64), 10, 16, 1,
                         rngs=nnx.Rngs(0))
    h = train.fit(model, Dataset.from_splits("classify", d, 10), steps=60, batch_size=32,
                  lr=1e-2, log=None)
    assert len(h["train_loss"]) == 60
    assert np.mean(h["train_loss"][-10:]) < np.mean(h["train_loss"][:10]) - 0.2
    assert h["eval"][-1]["accuracy"] > 0.15  # chance is 0.1; 60 steps is a short run


def test_loss_fn_is_the_nll_of_the_targets():
    logp = np.log(np.array([[0.5, 0.25, 0.25], [0.1, 0.8, 0.1]], dtype=np.float32))
    loss, acc = train.loss_fn(lambda x: logp, None, np.array([0, 2]))
    assert float(loss) == pytest.approx(-(np.log(0.5) + np.log(0.1)) / 2, rel=1e-6)
    assert float(acc) == pytest.approx(0.5)
    # next-step prediction: the targets are the tokens themselves
    tokens = np.array([[1, 1]])
    loss, acc = train.loss_fn(lambda x: logp[None], tokens)
    assert float(loss) == pytest.approx(-(np.log(0.25) + np.log(0.8)) / 2, rel=1e-6)
    assert float(acc) == pytest.approx(0.5)


def test_evaluate_weights_batches_by_size():
    d = annotated_s4.data.load_digits_sequences(side=8)
    model = StackedModel(functools.partial(SSMLayer, N=4, L=64), 10, 8, 1,
                         rngs=nnx.Rngs(0), dropout=0.5)
    x, y = d["x_test"][:50], d["y_test"][:50]
    whole = train.evaluate(model, x, y, batch_size=50)
    ragged = train.evaluate(model, x, y, batch_size=7)  # 7 batches of 7, one of 1
    assert whole["loss"] == pytest.approx(ragged["loss"], rel=1e-5)
    assert whole["accuracy"] == pytest.approx(ragged["accuracy"], abs=1e-6)
    # evaluated without dropout, and the model is left in training mode
    assert train.evaluate(model, x, y)["loss"] == pytest.approx(whole["loss"], rel=1e-5)
    assert model.layers[0].drop.deterministic is False


def test_batch_indices_are_epoch_shuffles():
    n, b = 10, 3  # 3 batches per epoch, one example left out each epoch
    epoch = np.concatenate([train.batch_indices(0, s, n, b) for s in (1, 2, 3)])
    assert len(set(epoch)) == 9
    np.testing.assert_array_equal(train.batch_indices(0, 2, n, b),
                                  train.batch_indices(0, 2, n, b))


_PARALLEL = r"""
import json, sys
import annotated_s4, jax
from annotated_s4 import registry, runner, train
assert len(jax.devices()) == {n}, jax.devices()
r = runner.run(registry.parse(sys.argv[1:]), log=None)
x = train.shard_batch(train.make_mesh(), jax.numpy.zeros((16, 2)))
print(json.dumps({{"loss": r["history"]["train_loss"], "devices": r["devices"],
                  "shards": len(x.addressable_shards), "acc": r["test_accuracy"]}}))
"""


def _on_host_devices(n, script, *args):
    """The JSON that `script` prints last, run in a fresh process with n
    simulated CPU devices."""
    env = {**os.environ, "JAX_PLATFORMS": "cpu",
           "XLA_FLAGS": f"--xla_force_host_platform_device_count={n}"}
    out = subprocess.run([sys.executable, "-c", script, *args], env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def _run_on(n):
    return _on_host_devices(n, _PARALLEL.format(n=n), *TINY, "--steps", "2")


def test_data_parallel_matches_single_device():
    """The 4-device run needs its own process (the device count is fixed when
    JAX starts); the 1-device run is this process's CPU device, run first (the
    other process then finds its initialisers in the compilation cache). Two
    steps: the second step's loss is that of the first step's all-reduced update
    (two steps are the TINY run of other tests, compiled once)."""
    one = runner.run(_args(["--steps", "2"]), log=None, devices=jax.devices("cpu")[:1])
    four = _run_on(4)
    assert one["devices"] == 1 and four["devices"] == 4 and four["shards"] == 4
    np.testing.assert_allclose(four["loss"], one["history"]["train_loss"],
                               rtol=1e-5, atol=1e-5)
    assert four["acc"] == pytest.approx(one["test_accuracy"], abs=1e-6)


def test_lr_schedule_warms_up_then_decays_to_one_percent():
    peak, steps = 1e-2, 100
    cold = np.asarray(train.lr_schedule(peak, steps)(np.arange(steps + 1)))
    assert cold[0] == cold[1] == pytest.approx(peak) and cold[-1] == pytest.approx(peak / 100)
    warm = np.asarray(train.lr_schedule(peak, steps, warmup=10)(np.arange(steps + 1)))
    np.testing.assert_allclose(warm[:11], peak * np.arange(11) / 10, rtol=1e-6, atol=1e-12)
    assert np.all(np.diff(warm[10:]) <= 0) and warm[-1] == pytest.approx(peak / 100)
    # the command line takes it and the run records it
    config = registry.parse(["--dataset", "digits", "--warmup", "10", "--steps", "100"])
    assert config.warmup == 10 and config.recorded()["warmup"] == 10


def test_constant_schedule_keeps_the_peak_after_the_warm_up():
    peak, steps = 1e-2, 100
    flat = np.asarray(train.lr_schedule(peak, steps, schedule="constant")(np.arange(steps + 1)))
    np.testing.assert_allclose(flat, peak, rtol=1e-6)
    warm = np.asarray(train.lr_schedule(peak, steps, warmup=10, schedule="constant")(
        np.arange(steps + 1)))
    np.testing.assert_allclose(warm[:11], peak * np.arange(11) / 10, rtol=1e-6, atol=1e-12)
    np.testing.assert_allclose(warm[10:], peak, rtol=1e-6)
    with pytest.raises(ValueError, match="schedule"):
        train.lr_schedule(peak, steps, schedule="linear")
    # the command line takes it, records it, refuses others by name, and an old
    # config.json without it reads as the cosine schedule it was trained with
    config = registry.parse(["--dataset", "digits", "--schedule", "constant"])
    assert config.schedule == "constant" and config.recorded()["schedule"] == "constant"
    with pytest.raises(SystemExit):
        registry.parse(["--dataset", "digits", "--schedule", "linear"])
    with pytest.raises(ValueError, match="--schedule"):
        dataclasses.replace(config, schedule="linear").check()
    old = config.recorded()
    del old["schedule"]
    assert RunConfig.from_recorded(old).schedule == "cosine"


def test_ssm_params_get_their_own_rate_and_no_decay():
    """S4's recipe: with ssm_lr, log_dt and Lambda/P/B move at ssm_lr and are
    not decayed; the read-out C moves at lr."""
    model = StackedModel(functools.partial(S4DLayer, N=4, L=8), 3, 4, 1, rngs=nnx.Rngs(0))
    seq = model.layers[0].seq
    before = {k: np.array(getattr(seq, k)[...]) for k in ("log_dt", "C")}
    opt = train.make_optimizer(model, lr=1e-1, weight_decay=0.0, steps=10, ssm_lr=1e-4)
    x, y = np.random.default_rng(0).normal(size=(4, 8, 1)).astype(np.float32), np.arange(4) % 3
    train.train_step(model, opt, x, y)
    # Adam's first step moves every parameter by about its learning rate.
    assert np.abs(seq.log_dt[...] - before["log_dt"]).max() < 2e-4
    assert np.abs(seq.C[...] - before["C"]).max() > 1e-2
    # No gradient, no decay: with weight decay, only the non-SSM parameters shrink.
    # (The updates are compiled as one program each, as in a train step: eagerly,
    # each of their many small operations would be compiled on its own.)
    update = nnx.jit(lambda opt, model, grads: opt.update(model, grads))
    opt = train.make_optimizer(model, lr=1e-1, weight_decay=1.0, steps=10, ssm_lr=1e-1)
    before = np.array(seq.log_dt[...])
    grads = jax.tree.map(jnp.zeros_like, nnx.state(model, nnx.Param))
    update(opt, model, grads)
    np.testing.assert_array_equal(seq.log_dt[...], before)
    # With ssm_weight_decay, the same zero-gradient step shrinks them by lr * decay.
    opt = train.make_optimizer(model, lr=1e-1, weight_decay=0.0, steps=10, ssm_lr=1e-1,
                               ssm_weight_decay=0.5)
    update(opt, model, grads)
    np.testing.assert_allclose(seq.log_dt[...], before * (1 - 1e-1 * 0.5), rtol=1e-6)
    with pytest.raises(ValueError, match="--ssm-weight-decay"):
        runner.run(_args(["--steps", "1", "--ssm-lr", "0", "--ssm-weight-decay", "0.1"]),
                   log=None)
    with pytest.raises(ValueError, match="--ssm-lr"):
        runner.run(_args(["--steps", "1", "--ssm-lr", "-1"]), log=None)


def _layer_cases():
    """Every registered layer at its default options, and the long convolution
    with an explicit kernel, which is not a --layer."""
    cases = {name: (entry.build(entry.options(), 16), "dt_min" in
                    {f.name for f in dataclasses.fields(entry.options)})
             for name, entry in registry.LAYERS.items()}
    cases["toeplitz"] = (functools.partial(ToeplitzLayer, L=16), False)
    return cases


@pytest.mark.parametrize("name", sorted(_layer_cases()))
def test_optimizer_groups_are_the_state_space_parameters(name):
    """The 'ssm' group holds exactly the parameters that the layers declare
    `catalog.SSMParam`, the 'rest' group every other one; and a layer that
    draws SSM step sizes (its options have --dt-min) has state-space parameters."""
    layer, draws_dt = _layer_cases()[name]
    model = StackedModel(layer, 5, 8, 2, rngs=nnx.Rngs(0), vocab_size=5, classification=False)
    params = nnx.state(model, nnx.Param)
    groups = dict(jax.tree_util.tree_flatten_with_path(train._param_groups(model)(params))[0])
    declared = {path for path, _ in
                jax.tree_util.tree_flatten_with_path(nnx.state(model, SSMParam))[0]}
    assert {path for path, g in groups.items() if g == "ssm"} == declared
    assert len(groups) == len(jax.tree_util.tree_leaves(params))
    assert bool(declared) == draws_dt


@pytest.mark.parametrize("rates, named", [({"lr": 1e-2}, "lr"),
                                          ({"weight_decay": 0.0, "ssm_lr": 1e-3},
                                           "weight_decay, ssm_lr")])
def test_fit_refuses_rates_beside_an_optimizer_that_has_its_own(rates, named):
    """Rates given beside an optimizer would be silently ignored: fit refuses
    them, naming each, before any step is taken."""
    model = StackedModel(functools.partial(SSMLayer, N=4, L=8), d_output=2, d_model=4,
                         n_layers=1, rngs=nnx.Rngs(0))
    optimizer = train.make_optimizer(model, lr=1e-2, steps=1)
    x, y = np.zeros((4, 8, 1), np.float32), np.zeros(4, np.int32)
    data = Dataset("classify", x, x, 2, y, y)
    with pytest.raises(ValueError, match=f"^{named}: fit trains with the optimizer passed in"):
        train.fit(model, data, steps=1, batch_size=4, log=None, optimizer=optimizer, **rates)


def test_fit_refuses_arrays_in_place_of_a_dataset():
    """Arrays in place of the dataset: the error names what fit takes."""
    model = StackedModel(functools.partial(SSMLayer, N=4, L=8), d_output=2, d_model=4,
                         n_layers=1, rngs=nnx.Rngs(0))
    x = np.zeros((4, 8, 1), np.float32)
    with pytest.raises(TypeError, match="^data must be a datasets.Dataset"):
        train.fit(model, x, steps=1, batch_size=4, log=None)


_FSDP = r"""
import functools, json
import jax, numpy as np
from flax import nnx
from annotated_s4 import S4DLayer, StackedModel, train
assert len(jax.devices()) == 4, jax.devices()
mesh = train.make_mesh()
rng = np.random.default_rng(0)
xs = rng.normal(size=(3, 8, 16, 1)).astype(np.float32)   # three batches of 8
ys = rng.integers(0, 3, size=(3, 8))
out = {}
for place in (train.replicate, train.shard_params):
    model = StackedModel(functools.partial(S4DLayer, N=8, L=16), 3, 8, 1, rngs=nnx.Rngs(0),
                         dropout=0.1)
    optimizer = train.make_optimizer(model, lr=1e-2, steps=3)
    place(mesh, model, optimizer)
    with jax.default_matmul_precision("float32"):
        loss = [float(train.train_step(model, optimizer, train.shard_batch(mesh, x),
                                       train.shard_batch(mesh, y))[0]) for x, y in zip(xs, ys)]
    leaves = jax.tree_util.tree_leaves_with_path(nnx.state((model, optimizer)))
    out[place.__name__] = {
        "loss": loss,
        "params": [np.asarray(a).tolist() for a in jax.tree.leaves(nnx.state(model, nnx.Param))],
        "arrays": [(jax.tree_util.keystr(path), a.shape, a.sharding.is_fully_replicated,
                    [s.data.size for s in a.addressable_shards],
                    len({s.device for s in a.addressable_shards}))
                   for path, a in leaves],
    }
print(json.dumps(out))
"""


def test_fully_sharded_training_matches_replicated():
    """FSDP (`shard_params`) against plain data parallelism (`replicate`) on 4
    host devices, from the same initialisation and batches: the same losses and
    final parameters to float32 rounding; every array with an axis that 4
    divides is split four ways (and stays so after the steps), the others
    (the decoder's bias of 3 classes, step counts) are replicated."""
    out = _on_host_devices(4, _FSDP)
    rep, fsdp = out["replicate"], out["shard_params"]
    np.testing.assert_allclose(fsdp["loss"], rep["loss"], rtol=1e-6)
    for a, b in zip(fsdp["params"], rep["params"], strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    assert all(replicated for _, _, replicated, _, _ in rep["arrays"])
    split = 0
    for path, shape, replicated, sizes, devices in fsdp["arrays"]:
        size = int(np.prod(shape))
        assert devices == 4, path
        if any(n % 4 == 0 for n in shape):
            assert not replicated and sizes == [size // 4] * 4, (path, shape, sizes)
            split += 1
        else:
            assert replicated and sizes == [size] * 4, (path, shape, sizes)
    arrays = {path: (shape, sizes) for path, shape, _, sizes, _ in fsdp["arrays"]}
    assert arrays["[0]['layers'][0]['out']['kernel'].value"] == ([8, 8], [16] * 4)  # a quarter
    assert arrays["[0]['decoder']['bias'].value"] == ([3], [3] * 4)  # whole on every device
    assert arrays["[1]['step'].value"] == ([], [1] * 4)
    assert split > len(fsdp["arrays"]) // 2
