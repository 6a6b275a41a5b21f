"""Tests for annotated_s4.cli: the command line, its options, run directories and resume."""

import json
import os

import jax
import numpy as np
import pytest
from flax import nnx

from annotated_s4 import cli, train

TINY = ["--dataset", "digits", "--layer", "ssm", "--n-layers", "1", "--d-model", "8",
        "--state-size", "4", "--batch-size", "16", "--lr", "1e-2", "--log-every", "100"]


def _args(extra):
    return cli.build_parser().parse_args(TINY + extra)


def test_help_lists_the_options(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["--help"])
    assert e.value.code == 0
    text = capsys.readouterr().out
    for option in ("--dataset", "--layer", "--n-layers", "--d-model", "--state-size",
                   "--steps", "--batch-size", "--lr", "--seed", "--out", "--resume",
                   "--vocab-size", "--seq-len", "digits-784", "digits-gen"):
        assert option in text


def test_registries_are_plain_dicts():
    assert isinstance(cli.DATASETS, dict) and isinstance(cli.LAYERS, dict)
    assert {"digits", "digits-784", "digits-gen"} <= set(cli.DATASETS)
    assert {"ssm", "s4", "s4d"} <= set(cli.LAYERS)


def test_cli_writes_metrics_and_checkpoint(tmp_path):
    out = tmp_path / "run"
    metrics = cli.main(TINY + ["--steps", "4", "--out", str(out)])
    saved = json.loads((out / "metrics.json").read_text())
    assert 0.0 <= saved["test_accuracy"] <= 1.0 and saved["steps"] == 4
    assert saved["test_accuracy"] == pytest.approx(metrics["test_accuracy"])
    assert {"checkpoint.npz", "config.json", "history.json"} <= set(os.listdir(out))
    with np.load(out / "checkpoint.npz", allow_pickle=False) as f:  # no pickle inside
        assert int(f["step"]) == 4


def test_generation_dataset_reports_nll(tmp_path):
    out = tmp_path / "gen"
    cli.main(TINY + ["--dataset", "digits-gen", "--steps", "3", "--out", str(out)])
    saved = json.loads((out / "metrics.json").read_text())
    assert 0.0 < saved["test_loss"] < 10.0
    assert saved["test_bits_per_pixel"] == pytest.approx(saved["test_loss"] / np.log(2))


@pytest.mark.parametrize("dataset", ["mnist-small", "mnist-small-gen"])
def test_the_offline_mnist_digits_are_datasets(dataset):
    # S4D: the Part I SSM's kernel needs smaller steps at 784 (chapter 6)
    args = _args(["--dataset", dataset, "--layer", "s4d", "--steps", "1"])
    data = cli.load_dataset(args)
    assert data["x_train"].shape[:2] == (4000, 784) and len(data["x_test"]) == 1000
    assert data["d_output"] == (10 if dataset == "mnist-small" else 256)
    model = cli.build_model(args, data)  # reads them: a class per digit, a level per pixel
    out = model(data["x_test"][:2])
    assert out.shape == ((2, 10) if dataset == "mnist-small" else (2, 784, 256))
    assert np.all(np.isfinite(out))


def test_the_initial_step_range_is_an_option(tmp_path):
    args = _args(["--steps", "1", "--layer", "ssm", "--dt-min", "1e-4", "--dt-max", "1e-3"])
    model = cli.run(args, log=None)["model"]
    steps = np.exp(np.asarray(model.layers[0].seq.log_step[...]))
    assert np.all((steps >= 1e-4 * 0.99) & (steps <= 1e-3 * 1.01))
    with pytest.raises(ValueError, match="--dt-max"):
        cli.run(_args(["--steps", "1", "--dt-min", "0.1", "--dt-max", "0.01"]), log=None)
    with pytest.raises(ValueError, match="--dt-min"):
        cli.run(_args(["--steps", "1", "--dt-min", "0"]), log=None)


def test_resume_continues_exactly(tmp_path, monkeypatch):
    straight = cli.run(_args(["--steps", "6", "--out", str(tmp_path / "a")]), log=None)

    original, calls = train.train_step, [0]

    def crash_at_step_5(*a):
        calls[0] += 1
        if calls[0] == 5:
            raise KeyboardInterrupt
        return original(*a)

    monkeypatch.setattr(train, "train_step", crash_at_step_5)
    with pytest.raises(KeyboardInterrupt):
        cli.run(_args(["--steps", "6", "--ckpt-every", "2", "--out", str(tmp_path / "b")]),
                  log=None)
    monkeypatch.setattr(train, "train_step", original)
    resumed = cli.run(_args(["--steps", "6", "--ckpt-every", "2", "--resume",
                               "--out", str(tmp_path / "b")]), log=None)
    assert resumed["history"]["step"] == list(range(1, 7))
    np.testing.assert_allclose(resumed["history"]["train_loss"],
                               straight["history"]["train_loss"], rtol=1e-6)
    a = nnx.state(straight["model"], nnx.Param)
    b = nnx.state(resumed["model"], nnx.Param)
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_resume_refuses_a_different_configuration(tmp_path):
    cli.run(_args(["--steps", "2", "--out", str(tmp_path)]), log=None)
    with pytest.raises(ValueError, match="d_model|does not match|different"):
        cli.run(_args(["--steps", "2", "--d-model", "4", "--resume", "--out",
                         str(tmp_path)]), log=None)


def test_bad_arguments_raise():
    with pytest.raises(ValueError, match="--steps"):
        cli.run(_args(["--steps", "0"]), log=None)
    with pytest.raises(ValueError, match="--resume"):
        cli.run(_args(["--steps", "1", "--resume"]), log=None)
    with pytest.raises(ValueError, match="divisible"):
        cli.run(_args(["--steps", "1", "--batch-size", "15"]), log=None,
                  devices=jax.devices() * 2)  # a 2-"device" mesh needs an even batch
    with pytest.raises(ValueError, match="divisible"):
        train.shard_batch(train.make_mesh(jax.devices() * 2), np.zeros((3, 2)))
    with pytest.raises(SystemExit):
        cli.main(["--layer", "no-such-layer"])
    for option, value, match in [("--log-every", "0", "--log-every"),
                                 ("--dropout", "1.0", "--dropout"),
                                 ("--dropout", "-0.1", "--dropout"),
                                 ("--weight-decay", "-1", "--weight-decay"),
                                 ("--ckpt-every", "-1", "--ckpt-every"),
                                 ("--n-heads", "0", "--n-heads"),
                                 ("--batch-size", "5000", "training sequences")]:
        with pytest.raises(ValueError, match=match):
            cli.run(_args(["--steps", "1", option, value]), log=None)
    with pytest.raises(ValueError, match="--seq-len"):
        cli.run(_args(["--steps", "1", "--dataset", "induction-head", "--seq-len", "0"]),
                  log=None)


def test_divergence_is_reported_not_written(tmp_path):
    out = tmp_path / "nan"
    with pytest.raises(SystemExit, match="diverged at step"):
        cli.main(TINY + ["--steps", "3", "--lr", "1e30", "--out", str(out)])
    assert not (out / "metrics.json").exists()


# The hybrid (H3, then attention) covers both token layers' options; every
# layer alone trains on both tasks in test_every_layer_trains_on_every_dataset.
@pytest.mark.parametrize("layer,dataset", [("hybrid", "induction-head"),
                                           ("hybrid", "associative-recall")])
def test_cli_trains_token_layers_on_recall_tasks(tmp_path, layer, dataset):
    out = tmp_path / f"{layer}-{dataset}"
    result = cli.run(cli.build_parser().parse_args(
        ["--dataset", dataset, "--layer", layer, "--n-layers", "2", "--d-model", "16",
         "--state-size", "4", "--head-dim", "4", "--n-heads", "2", "--batch-size", "16",
         "--steps", "2", "--out", str(out)]), log=None)
    config = json.loads((out / "config.json").read_text())
    seq_len, vocab = cli.RECALL_DEFAULTS[dataset]  # the paper's task sizes by default
    assert (config["seq_len"], config["vocab_size"]) == (seq_len, vocab)
    assert config["head_dim"] == 4 and config["n_heads"] == 2
    assert np.isfinite(json.loads((out / "metrics.json").read_text())["test_loss"])
    # Scored on the final (queried) position: x holds the seq_len - 1 tokens
    # before the answer, and the model gives one prediction per sequence.
    model = result["model"]
    assert model(np.zeros((3, seq_len - 1), dtype=np.int32)).shape == (3, vocab)
    if layer == "hybrid":  # H3 in the first layer, attention in the second
        from annotated_s4 import CausalSelfAttention, H3Layer

        kinds = [type(block.seq) for block in model.model.layers]
        assert kinds == [H3Layer, CausalSelfAttention]


def test_resume_refuses_other_head_count(tmp_path):
    base = ["--dataset", "associative-recall", "--layer", "attention", "--d-model", "16",
            "--batch-size", "16", "--steps", "2", "--out", str(tmp_path)]
    cli.run(cli.build_parser().parse_args(base + ["--n-heads", "2"]), log=None)
    with pytest.raises(ValueError, match="n_heads"):
        cli.run(cli.build_parser().parse_args(base + ["--n-heads", "4", "--resume"]),
                  log=None)


@pytest.mark.parametrize("layer", sorted(cli.LAYERS))
def test_every_layer_trains_on_every_dataset(tmp_path, layer):
    """One step of every --layer on every offline --dataset, at tiny sizes and
    at a --seq-len other than the default."""
    for dataset, extra in [("digits", []),
                           ("induction-head", ["--seq-len", "12", "--vocab-size", "6"]),
                           ("associative-recall", ["--seq-len", "10", "--vocab-size", "4"]),
                           ("charlm", ["--seq-len", "16"])]:
        result = cli.run(cli.build_parser().parse_args(
            ["--dataset", dataset, "--layer", layer, "--n-layers", "2" if layer == "hybrid"
             else "1", "--d-model", "8",
             "--state-size", "4", "--head-dim", "4", "--n-heads", "2", "--batch-size", "8",
             "--steps", "1"] + extra), log=None)
        assert np.isfinite(result["test_loss"]), (layer, dataset)


def test_the_state_matrix_initialisation_is_an_option():
    hippo = cli.run(_args(["--steps", "1", "--layer", "s4"]), log=None)["model"]
    rand = cli.run(_args(["--steps", "1", "--layer", "s4", "--init", "random"]), log=None)["model"]
    a, b = hippo.layers[0].seq, rand.layers[0].seq
    assert not np.allclose(np.asarray(a.Lambda_im[...]), np.asarray(b.Lambda_im[...]))
    with pytest.raises(ValueError, match="--init inv does not apply to --layer s4"):
        cli.run(_args(["--steps", "1", "--layer", "s4", "--init", "inv"]), log=None)
    with pytest.raises(ValueError, match="--init"):
        cli.run(_args(["--steps", "1", "--layer", "ssm", "--init", "random"]), log=None)


def test_independent_state_matrices_are_an_option():
    own = cli.run(_args(["--steps", "1", "--layer", "s4", "--independent"]), log=None)["model"]
    layer = own.layers[0].seq
    assert not layer.shared and layer.Lambda_im[...].shape == (layer.H, layer.N // 2)
    with pytest.raises(ValueError, match="--independent applies to --layer s4 only"):
        cli.run(_args(["--steps", "1", "--layer", "s4d", "--independent"]), log=None)
