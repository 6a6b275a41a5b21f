"""Tests for annotated_s4.runner: training into a run directory, resume, bad options."""

import dataclasses

import jax
import numpy as np
import pytest
from flax import nnx

from annotated_s4 import cli, registry, runner, train
from annotated_s4.datasets import Dataset
from conftest import TINY, one_step


def _args(extra):
    return registry.parse(TINY + extra)


def test_resume_continues_exactly(tmp_path, monkeypatch):
    straight = runner.run(_args(["--steps", "6", "--out", str(tmp_path / "a")]), log=None)

    original, calls = train.train_step, [0]

    def crash_at_step_5(*a):
        calls[0] += 1
        if calls[0] == 5:
            raise KeyboardInterrupt
        return original(*a)

    monkeypatch.setattr(train, "train_step", crash_at_step_5)
    with pytest.raises(KeyboardInterrupt):
        runner.run(_args(["--steps", "6", "--ckpt-every", "2", "--out", str(tmp_path / "b")]),
                  log=None)
    monkeypatch.setattr(train, "train_step", original)
    resumed = runner.run(_args(["--steps", "6", "--ckpt-every", "2", "--resume",
                               "--out", str(tmp_path / "b")]), log=None)
    assert resumed["history"]["step"] == list(range(1, 7))
    np.testing.assert_allclose(resumed["history"]["train_loss"],
                               straight["history"]["train_loss"], rtol=1e-6)
    a = nnx.state(straight["model"], nnx.Param)
    b = nnx.state(resumed["model"], nnx.Param)
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_a_half_precision_run_is_what_its_checkpoint_holds(tmp_path):
    """With --checkpoint-dtype float16 the checkpoint stores float16 weights, and
    the recorded metrics are those of the model loaded from it (which rounding
    moved from the float32 weights' last evaluation)."""
    out = tmp_path / "half"
    result = runner.run(_args(["--steps", "2", "--checkpoint-dtype", "float16",
                               "--out", str(out)]), log=None)
    with np.load(out / "checkpoint.npz", allow_pickle=False) as f:
        dtypes = {str(f[k].dtype) for k in f.files if k.startswith("leaf_")}
    assert "float16" in dtypes and "float32" not in dtypes
    metrics, run = runner.evaluate_run(str(out))
    assert run["config"]["checkpoint_dtype"] == "float16"
    assert not runner.compare(run["metrics"], metrics)   # within float32 rounding
    assert run["metrics"]["test_loss"] != result["history"]["eval"][-1]["loss"]
    with pytest.raises(ValueError, match="--checkpoint-dtype"):
        dataclasses.replace(_args([]), checkpoint_dtype="int8").check()
    with pytest.raises(SystemExit):
        cli.main(["train", "--checkpoint-dtype", "int8"])


def test_resume_refuses_a_different_configuration(tmp_path):
    runner.run(_args(["--steps", "2", "--out", str(tmp_path)]), log=None)
    with pytest.raises(ValueError, match="d_model|does not match|different"):
        runner.run(_args(["--steps", "2", "--d-model", "4", "--resume", "--out",
                         str(tmp_path)]), log=None)


def test_resume_refuses_a_finished_run_by_name(tmp_path):
    args = ["--dataset", "digits", "--d-model", "4", "--steps", "2", "--batch-size", "8",
            "--out", str(tmp_path), "--resume"]
    runner.run(registry.parse(args), log=None)
    with pytest.raises(ValueError, match="finished run"):
        runner.run(registry.parse(args), log=None)


def test_resume_refuses_other_head_count(tmp_path):
    # the token run of test_registry's test_every_layer_trains_on_both_kinds_of_data
    # [attention] (its programs are compiled once): 4 heads, the layer's default
    base = one_step("attention", "induction-head",
                    ["--n-layers", "1", "--seq-len", "12", "--vocab-size", "6",
                     "--out", str(tmp_path)])
    runner.run(registry.parse(base), log=None)
    assert registry.parse(base).layer_options.n_heads == 4
    with pytest.raises(ValueError, match="n_heads"):
        runner.run(registry.parse(base + ["--n-heads", "2", "--resume"]),
                  log=None)


def test_bad_arguments_raise():
    with pytest.raises(ValueError, match="--steps"):
        runner.run(_args(["--steps", "0"]), log=None)
    with pytest.raises(ValueError, match="--resume"):
        runner.run(_args(["--steps", "1", "--resume"]), log=None)
    with pytest.raises(ValueError, match="divisible"):
        runner.run(_args(["--steps", "1", "--batch-size", "15"]), log=None,
                  devices=jax.devices() * 2)  # a 2-"device" mesh needs an even batch
    with pytest.raises(ValueError, match="divisible"):
        train.shard_batch(train.make_mesh(jax.devices() * 2), np.zeros((3, 2)))
    with pytest.raises(SystemExit):
        cli.main(["train", "--layer", "no-such-layer"])
    for option, value, match in [("--log-every", "0", "--log-every"),
                                 ("--dropout", "1.0", "--dropout"),
                                 ("--dropout", "-0.1", "--dropout"),
                                 ("--weight-decay", "-1", "--weight-decay"),
                                 ("--ckpt-every", "-1", "--ckpt-every"),
                                 ("--batch-size", "5000", "training sequences")]:
        with pytest.raises(ValueError, match=match):
            runner.run(_args(["--steps", "1", option, value]), log=None)
    with pytest.raises(ValueError, match="--n-heads"):
        registry.parse(["--layer", "attention", "--n-heads", "0"])
    with pytest.raises(ValueError, match="--seq-len"):
        runner.run(_args(["--steps", "1", "--dataset", "induction-head", "--seq-len", "0"]),
                  log=None)


# --- Re-evaluation as a measurement: the tolerance of `runner.compare` ------------------

_LABELLED = Dataset("classify", np.zeros((1, 1)), np.zeros((1, 1)), 10, np.zeros(1), np.zeros(1))


def _metrics(logp, y, data=_LABELLED):
    """Test metrics with their tolerances, from log-probabilities (n, classes)."""
    stats = {k: np.asarray(v) for k, v in runner.item_statistics(logp, y).items()}
    return runner.metrics_of_items(stats, data)   # recorded in batches of 256 of the 400


def test_re_evaluation_under_a_perturbed_prediction_passes_and_a_real_change_fails():
    """Another device's float32 evaluation: every log-probability moved by up to one
    evaluation's rounding error, and three predictions that sat on a float32
    boundary (top two 1e-6 apart) flipped by it. The comparison accepts that, and
    refuses a real change: one confident prediction changed, or the loss moved
    by its tolerance's size."""
    rng = np.random.default_rng(0)
    n, classes = 400, 10
    logp = np.array(jax.nn.log_softmax(5 * rng.standard_normal((n, classes))), np.float32)
    top = logp.argmax(-1)
    y = np.where(rng.random(n) < 0.8, top, rng.integers(0, classes, n))
    edge = np.flatnonzero(y == top)[:3]                  # right, but only just
    second = (top[edge] + 1) % classes
    logp[edge, second] = logp[edge, top[edge]] - 1e-6
    recorded = {k: v for k, v in _metrics(logp, y).items() if k != "tolerance"}

    scale = np.maximum(1.0, np.abs(logp).max(-1, keepdims=True))
    one_evaluation = runner.ROUNDING_UNITS * runner.UNIT_ROUNDOFF * scale
    moved = (logp + rng.uniform(-1, 1, logp.shape) * one_evaluation).astype(np.float32)
    moved[edge, second] = moved[edge, top[edge]] + 1e-6   # the three now answer wrong
    remeasured = _metrics(moved, y)
    assert remeasured["test_accuracy"] == pytest.approx(recorded["test_accuracy"] - 3 / n)
    assert remeasured["tolerance"]["test_accuracy"] >= 3 / n
    assert remeasured["test_loss"] != recorded["test_loss"]
    assert runner.compare(recorded, remeasured) == {}

    confident = np.flatnonzero((y == top) & (np.sort(logp, -1)[:, -2] < logp.max(-1) - 1))[0]
    changed = moved.copy()
    changed[confident, y[confident]] -= 2.0            # one answer changed, for real
    bad = runner.compare(recorded, _metrics(changed, y))
    assert set(bad) == {"test_accuracy", "test_loss"}
    shifted = {**remeasured, "test_loss": remeasured["test_loss"]
               + 2 * remeasured["tolerance"]["test_loss"]}
    assert set(runner.compare(recorded, shifted)) == {"test_loss"}
    # a metric the recording lacks, and one number for every metric
    assert runner.compare({}, remeasured).keys() == {"test_loss", "test_accuracy"}
    assert runner.compare(recorded, remeasured, tolerance=0.0).keys() == {"test_loss",
                                                                         "test_accuracy"}


def test_a_float32_evaluation_stays_within_its_rounding_bound():
    """The premise of the tolerance: a float32 evaluation's log-probabilities lie
    within ROUNDING_UNITS units of roundoff (times max(1, max |log p|)) of the
    exact ones, here a float64 evaluation of the same weights of a reference
    run (the 8 x 8 digit classifier: 24 units measured)."""
    from annotated_s4 import reference

    def log_probs(model, x, classes):
        """Every class's log-probability, (len(x), classes), measured as the
        re-evaluations measure (`runner.measure_items` at float32 matmul
        precision): -log p_c is the loss of the target c."""
        with jax.default_matmul_precision("float32"):
            return np.stack([-runner.measure_items(model, x, np.full(len(x), c, np.int32))["nll"]
                             for c in range(classes)], axis=-1)

    directory = reference.locate("digits64-s4")
    model, data, _ = runner.load_run(directory)
    logp32 = log_probs(model, data.x_test, data.d_output)
    assert logp32.dtype == np.float32
    jax.config.update("jax_enable_x64", True)
    try:
        model64, _, _ = runner.load_run(directory)   # the same float32 weights
        logp64 = log_probs(model64, data.x_test.astype(np.float64), data.d_output)
        assert logp64.dtype == np.float64                # computed in float64
    finally:
        jax.config.update("jax_enable_x64", False)
    scale = np.maximum(1.0, np.abs(logp32).max(-1))
    units = np.abs(logp32 - logp64).max(-1) / (runner.UNIT_ROUNDOFF * scale)
    assert 0 < units.max() < runner.ROUNDING_UNITS


def test_a_kept_re_evaluation_is_read_back_and_a_changed_run_is_measured_again(
        tmp_path, monkeypatch):
    """With $ANNOTATED_S4_EVAL_CACHE set, a run's held-out statistics are measured
    once and read back after; a run whose checkpoint changed is measured again."""
    out = tmp_path / "run"
    runner.run(_args(["--steps", "2", "--out", str(out)]), log=None)
    monkeypatch.setenv(runner.EVAL_CACHE, str(tmp_path / "kept"))
    model, data, _ = runner.load_run(str(out))
    first = runner.held_out_items(str(out), model, data)
    assert len(list((tmp_path / "kept").glob("*.npz"))) == 1

    measured = []
    original = runner.measure_items
    monkeypatch.setattr(runner, "measure_items", lambda *a, **k: measured.append(1) or original(*a, **k))
    again = runner.held_out_items(str(out), model, data)
    assert not measured                               # read back, not measured
    for k in first:
        np.testing.assert_array_equal(first[k], again[k])
    metrics, run = runner.evaluate_run(str(out))
    assert not measured and not runner.compare(run["metrics"], metrics)

    x_part, y_part = data.x_train[:5], data.y_train[:5]   # other items: kept apart
    part = runner.kept_items(str(out), model, x_part, y_part)
    assert measured == [1] and len(list((tmp_path / "kept").glob("*.npz"))) == 2
    np.testing.assert_array_equal(part["nll"], runner.kept_items(str(out), model, x_part, y_part)["nll"])
    assert measured == [1] and part["nll"].shape == (5,)

    state = nnx.state(model, nnx.Param)               # move one weight: another run
    leaf = jax.tree_util.tree_leaves(state)[0]
    nnx.update(model, jax.tree_util.tree_map(lambda x: x + 1.0 if x is leaf else x, state))
    runner.save_checkpoint(str(out), model)
    runner.held_out_items(str(out), model, data)
    assert measured == [1, 1] and len(list((tmp_path / "kept").glob("*.npz"))) == 3


def test_a_run_loads_without_initialising_its_model(tmp_path):
    """load_run builds the model abstract (shapes only) and fills every array
    from the checkpoint: the loaded model is the trained one, array for array."""
    out = tmp_path / "run"
    trained = runner.run(_args(["--steps", "2", "--out", str(out)]), log=None)["model"]
    loaded = runner.load_run(str(out))[0]
    a, b = nnx.state(trained), nnx.state(loaded)
    assert jax.tree_util.tree_structure(a) == jax.tree_util.tree_structure(b)
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
        assert isinstance(y, jax.Array)
        if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
            x, y = jax.random.key_data(x), jax.random.key_data(y)
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
