"""Tests for annotated_s4.train: the fit loop, the CLI, checkpoints, resume,
and data parallelism (1 device vs 4 host devices give the same loss curve)."""

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

from annotated_s4 import checkpoint, cli, train
from annotated_s4 import S4DLayer, SSMLayer, StackedModel

TINY = ["--dataset", "digits", "--layer", "ssm", "--n-layers", "1", "--d-model", "8",
        "--state-size", "4", "--batch-size", "16", "--lr", "1e-2", "--log-every", "100"]


def _args(extra):
    return cli.build_parser().parse_args(TINY + extra)


def test_fit_learns_digits():
    d = annotated_s4.data.load_digits_sequences(side=8)
    model = StackedModel(functools.partial(S4DLayer, N=8, L=64), 10, 16, 1,
                         rngs=nnx.Rngs(0))
    h = train.fit(model, d["x_train"], d["y_train"], d["x_test"], d["y_test"],
                  steps=60, batch_size=32, lr=1e-2, log=None)
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


def test_checkpoint_leaves_out_rnn_caches(tmp_path):
    """A model whose RNN-mode cache is set (after generating) saves the same
    arrays as a fresh one, and its checkpoint loads into a fresh model."""
    def make():
        return StackedModel(functools.partial(SSMLayer, N=2, L=8), 5, 4, 1, rngs=nnx.Rngs(0),
                            vocab_size=5, classification=False)

    m = make()
    m.init_cache(3)
    m.step(jnp.zeros((3,), jnp.int32))
    checkpoint.save_checkpoint(tmp_path, m)
    with np.load(tmp_path / "checkpoint.npz", allow_pickle=False) as f:
        assert not any("cache" in str(p) or "/Ab" in str(p) for p in f["paths"])
    checkpoint.load_checkpoint(tmp_path, make())


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


def test_checkpoint_roundtrip_and_mismatch(tmp_path):
    def make(h):
        m = StackedModel(functools.partial(SSMLayer, N=2, L=8), 3, h, 1, rngs=nnx.Rngs(h))
        return m, train.make_optimizer(m)

    m1, o1 = make(4)
    checkpoint.save_checkpoint(tmp_path, m1, o1, 7, {"note": "x"})
    m2, o2 = make(4)
    m2.decoder.bias[...] = m2.decoder.bias[...] + 1.0
    step, extra = checkpoint.load_checkpoint(tmp_path, m2, o2)
    assert step == 7 and extra == {"note": "x"}
    np.testing.assert_array_equal(m1.decoder.bias[...], m2.decoder.bias[...])
    m3, o3 = make(6)
    with pytest.raises(ValueError, match="shape|does not match"):
        checkpoint.load_checkpoint(tmp_path, m3, o3)
    with pytest.raises(FileNotFoundError):
        checkpoint.load_checkpoint(tmp_path / "nowhere", m1, o1)


def test_batch_indices_are_epoch_shuffles():
    n, b = 10, 3  # 3 batches per epoch, one example left out each epoch
    epoch = np.concatenate([train.batch_indices(0, s, n, b) for s in (1, 2, 3)])
    assert len(set(epoch)) == 9
    np.testing.assert_array_equal(train.batch_indices(0, 2, n, b),
                                  train.batch_indices(0, 2, n, b))


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


@pytest.mark.parametrize("layer,dataset", [("h3", "induction-head"),
                                           ("attention", "associative-recall"),
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


_PARALLEL = r"""
import json, sys
import annotated_s4, jax
from annotated_s4 import checkpoint, cli, train
assert len(jax.devices()) == {n}, jax.devices()
args = cli.build_parser().parse_args(sys.argv[1:])
r = cli.run(args, log=None)
x = train.shard_batch(train.make_mesh(), jax.numpy.zeros((16, 2)))
print(json.dumps({{"loss": r["history"]["train_loss"], "devices": r["devices"],
                  "shards": len(x.addressable_shards), "acc": r["test_accuracy"]}}))
"""


def _run_on(n):
    env = dict(os.environ)
    env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={n}"
    env["JAX_PLATFORMS"] = "cpu"
    out = subprocess.run(
        [sys.executable, "-c", _PARALLEL.format(n=n), *TINY, "--steps", "5"],
        env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_data_parallel_matches_single_device():
    """The 4-device run needs its own process (the device count is fixed when
    JAX starts); the 1-device run is this process's CPU device."""
    four = _run_on(4)
    one = cli.run(_args(["--steps", "5"]), log=None, devices=jax.devices("cpu")[:1])
    assert one["devices"] == 1 and four["devices"] == 4 and four["shards"] == 4
    np.testing.assert_allclose(four["loss"], one["history"]["train_loss"],
                               rtol=1e-5, atol=1e-5)
    assert four["acc"] == pytest.approx(one["test_accuracy"], abs=1e-6)


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


def test_ssm_params_get_their_own_rate_and_no_decay():
    """S4's recipe: with ssm_lr, log_step and Lambda/P/B move at ssm_lr and are
    not decayed; the read-out C moves at lr."""
    model = StackedModel(functools.partial(S4DLayer, N=4, L=8), 3, 4, 1, rngs=nnx.Rngs(0))
    seq = model.layers[0].seq
    before = {k: np.array(getattr(seq, k)[...]) for k in ("log_step", "C")}
    opt = train.make_optimizer(model, lr=1e-1, weight_decay=0.0, steps=10, ssm_lr=1e-4)
    x, y = np.random.default_rng(0).normal(size=(4, 8, 1)).astype(np.float32), np.arange(4) % 3
    train.train_step(model, opt, x, y)
    # Adam's first step moves every parameter by about its learning rate.
    assert np.abs(seq.log_step[...] - before["log_step"]).max() < 2e-4
    assert np.abs(seq.C[...] - before["C"]).max() > 1e-2
    # No gradient, no decay: with weight decay, only the non-SSM parameters shrink.
    opt = train.make_optimizer(model, lr=1e-1, weight_decay=1.0, steps=10, ssm_lr=1e-1)
    before = np.array(seq.log_step[...])
    grads = jax.tree.map(jnp.zeros_like, nnx.state(model, nnx.Param))
    opt.update(model, grads)
    np.testing.assert_array_equal(seq.log_step[...], before)
    with pytest.raises(ValueError, match="--ssm-lr"):
        cli.run(_args(["--steps", "1", "--ssm-lr", "-1"]), log=None)


def test_evaluate_reproduces_a_run_and_names_what_is_wrong(tmp_path, capsys):
    from annotated_s4 import evaluate

    out = tmp_path / "run"
    cli.main(TINY + ["--steps", "3", "--out", str(out)])
    recomputed = evaluate.main([str(out)])
    recorded = json.loads((out / "metrics.json").read_text())
    assert recomputed["test_accuracy"] == pytest.approx(recorded["test_accuracy"], abs=1e-6)
    # A recorded metric the code no longer reproduces: exit status 1, naming the run.
    (out / "metrics.json").write_text(json.dumps({**recorded, "test_loss": 99.0}))
    with pytest.raises(SystemExit) as e:
        evaluate.main([str(out)])
    assert e.value.code == 1 and "make reference RUN=run" in capsys.readouterr().err
    # A missing file, or a checkpoint that does not fit the config: a clear error.
    config = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**config, "d_model": 12}))
    with pytest.raises(SystemExit, match="checkpoint.*does not|shape"):
        evaluate.main([str(out)])
    (out / "history.json").unlink()
    with pytest.raises(SystemExit, match="missing history.json"):
        evaluate.main([str(out)])


def test_completion_accuracy_keeps_the_top_half_and_scores_with_the_classifier():
    from annotated_s4 import evaluate as ev
    from annotated_s4.data import DIGIT_LEVELS, load_digits_sequences

    d = load_digits_sequences(side=8, quantize=True)
    digits, labels = d["x_test"][:6], d["y_test"][:6]
    gen = StackedModel(functools.partial(SSMLayer, N=2, L=64), DIGIT_LEVELS, 4, 1,
                       rngs=nnx.Rngs(0), vocab_size=DIGIT_LEVELS, classification=False)
    completed = ev.complete_digits(gen, digits)
    np.testing.assert_array_equal(completed[:, :32], digits[:, :32])
    assert completed.shape == digits.shape and completed.max() < DIGIT_LEVELS

    class Constant(nnx.Module):  # a "classifier" that always answers 3
        def __call__(self, x):
            assert x.shape == (6, 784, 1) and 0.0 <= float(x.min()) <= float(x.max()) <= 1.0
            return jnp.zeros((len(x), 10)).at[:, 3].set(1.0)

    accuracy, _ = ev.completion_accuracy(gen, Constant(), digits, labels)
    assert accuracy == pytest.approx(np.mean(labels == 3))


def test_the_state_matrix_initialisation_is_an_option():
    hippo = cli.run(_args(["--steps", "1", "--layer", "s4"]), log=None)["model"]
    rand = cli.run(_args(["--steps", "1", "--layer", "s4", "--init", "random"]), log=None)["model"]
    a, b = hippo.layers[0].seq, rand.layers[0].seq
    assert not np.allclose(np.asarray(a.Lambda_im[...]), np.asarray(b.Lambda_im[...]))
    with pytest.raises(ValueError, match="--init inv does not apply to --layer s4"):
        cli.run(_args(["--steps", "1", "--layer", "s4", "--init", "inv"]), log=None)
    with pytest.raises(ValueError, match="--init"):
        cli.run(_args(["--steps", "1", "--layer", "ssm", "--init", "random"]), log=None)
