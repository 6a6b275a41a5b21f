"""Tests for annotated_s4.runner: training into a run directory, resume, bad options."""

import jax
import numpy as np
import pytest
from flax import nnx

from annotated_s4 import cli, registry, runner, train
from conftest import TINY


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


def test_resume_refuses_a_different_configuration(tmp_path):
    runner.run(_args(["--steps", "2", "--out", str(tmp_path)]), log=None)
    with pytest.raises(ValueError, match="d_model|does not match|different"):
        runner.run(_args(["--steps", "2", "--d-model", "4", "--resume", "--out",
                         str(tmp_path)]), log=None)


def test_resume_refuses_other_head_count(tmp_path):
    base = ["--dataset", "associative-recall", "--layer", "attention", "--d-model", "16",
            "--batch-size", "16", "--steps", "2", "--out", str(tmp_path)]
    runner.run(registry.parse(base + ["--n-heads", "2"]), log=None)
    with pytest.raises(ValueError, match="n_heads"):
        runner.run(registry.parse(base + ["--n-heads", "4", "--resume"]),
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
