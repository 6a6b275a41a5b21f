"""Tests for annotated_s4.registry: datasets and layers by name, the models they build."""

import json

import numpy as np
from flax import nnx
import pytest

from annotated_s4 import registry, runner
from annotated_s4.catalog import LayerEntry
from annotated_s4.datasets import Dataset, DatasetEntry
from conftest import TINY, one_step as _one_step, tiny_options


def _args(extra):
    return registry.parse(TINY + extra)


def test_registries_are_plain_dicts():
    assert isinstance(registry.DATASETS, dict) and isinstance(registry.LAYERS, dict)
    assert {"digits", "digits-784", "digits-gen"} <= set(registry.DATASETS)
    assert all(isinstance(entry, DatasetEntry) for entry in registry.DATASETS.values())
    assert {"ssm", "s4", "s4d"} <= set(registry.LAYERS)
    assert all(isinstance(entry, LayerEntry) for entry in registry.LAYERS.values())


def test_a_dataset_states_its_task_and_refuses_labels_that_contradict_it():
    x, y = np.zeros((4, 6), np.int32), np.zeros(4, np.int32)
    recall = Dataset("recall", x, x, 5, y, y, vocab_size=5)
    assert recall.recall and not recall.classification and recall.length == 7
    assert Dataset("classify", x, x, 10, y, y).length == 6
    with pytest.raises(ValueError, match="task must be one of"):
        Dataset("regress", x, x, 1, y, y)
    with pytest.raises(ValueError, match="no labels"):
        Dataset("generate", x, x, 5, y, y)
    with pytest.raises(ValueError, match="y_train and y_test must both be given"):
        Dataset("classify", x, x, 10, y, None)
    with pytest.raises(ValueError, match="answer_len is for recall tasks"):
        Dataset("classify", x, x, 10, y, y, answer_len=2)
    # the help lists each dataset's default sizes, from its one declaration
    assert DatasetEntry(None, "h", 24, 64).defaults() == " (default --seq-len 24, --vocab-size 64)"
    assert "mqar: multi-query" in registry.epilog() and DatasetEntry(None, "h").defaults() == ""


@pytest.mark.parametrize("dataset", ["mnist-small", "mnist-small-gen"])
def test_the_offline_mnist_digits_are_datasets(dataset):
    # S4D: the Part I SSM's kernel needs smaller steps at 784 (chapter 6)
    args = _args(["--dataset", dataset, "--layer", "s4d", "--steps", "1"])
    data = registry.load_dataset(args)
    assert data.x_train.shape[:2] == (4000, 784) and len(data.x_test) == 1000
    assert data.d_output == (10 if dataset == "mnist-small" else 256)
    assert data.task == ("classify" if dataset == "mnist-small" else "generate")
    model = registry.build_model(args, data)  # reads them: a class per digit, a level per pixel
    out = model(data.x_test[:2])
    assert out.shape == ((2, 10) if dataset == "mnist-small" else (2, 784, 256))
    assert np.all(np.isfinite(out))


def test_the_initial_step_range_is_an_option(tmp_path):
    # the run of test_every_layer_trains_on_both_kinds_of_data on digits: its
    # programs are compiled once (the step range changes values, not programs)
    args = registry.parse(_one_step("ssm", "digits", ["--dt-min", "1e-4", "--dt-max", "1e-3"]))
    model = runner.run(args, log=None)["model"]
    dt = np.exp(np.asarray(model.layers[0].seq.log_dt[...]))
    assert np.all((dt >= 1e-4 * 0.99) & (dt <= 1e-3 * 1.01))
    with pytest.raises(ValueError, match="--dt-max"):
        runner.run(_args(["--steps", "1", "--dt-min", "0.1", "--dt-max", "0.01"]), log=None)
    with pytest.raises(ValueError, match="--dt-min"):
        runner.run(_args(["--steps", "1", "--dt-min", "0"]), log=None)


# The hybrid (H3, then attention) covers both token layers' options; every
# layer trains on pixels and on one token task in
# test_every_layer_trains_on_both_kinds_of_data.
@pytest.mark.parametrize("layer,dataset", [("hybrid", "induction-head"),
                                           ("hybrid", "associative-recall")])
def test_token_layers_train_on_the_recall_tasks(tmp_path, layer, dataset):
    out = tmp_path / f"{layer}-{dataset}"
    result = runner.run(registry.parse(_one_step(
        layer, dataset, ["--n-layers", "2", "--n-heads", "2", "--out", str(out)])), log=None)
    config = json.loads((out / "config.json").read_text())
    entry = registry.DATASETS[dataset]   # the paper's task sizes by default
    seq_len, vocab = entry.seq_len, entry.vocab_size
    assert (config["seq_len"], config["vocab_size"]) == (seq_len, vocab)
    assert config["layer_options"]["head_dim"] == 4 and config["layer_options"]["n_heads"] == 2
    assert np.isfinite(json.loads((out / "metrics.json").read_text())["test_loss"])
    # Scored on the final (queried) position: x holds the seq_len - 1 tokens
    # before the answer, and the model gives one prediction per sequence.
    model = result["model"]
    assert model(np.zeros((3, seq_len - 1), dtype=np.int32)).shape == (3, vocab)
    if layer == "hybrid":  # H3 in the first layer, attention in the second
        from annotated_s4 import CausalSelfAttention, H3Layer

        kinds = [type(block.seq) for block in model.model.layers]
        assert kinds == [H3Layer, CausalSelfAttention]


_TOKEN_TASKS = [("induction-head", ["--seq-len", "12", "--vocab-size", "6"]),
                ("associative-recall", ["--seq-len", "10", "--vocab-size", "4"]),
                ("charlm", ["--seq-len", "16"])]


@pytest.mark.parametrize("i,layer", list(enumerate(sorted(registry.LAYERS))))
def test_every_layer_trains_on_both_kinds_of_data(tmp_path, i, layer):
    """One step of every registered --layer on pixels (real inputs, one label
    per sequence) and on one task of tokens (an embedding, and a prediction at
    the last or at every position), at tiny sizes and at a --seq-len other
    than the default. The token tasks take turns, so each is trained by three
    layers (and the hybrid trains on both recall tasks above)."""
    assert len(registry.LAYERS) >= 2 * len(_TOKEN_TASKS)  # every token task gets two or more layers
    entry = registry.LAYERS[layer]  # a block for each factory of a layer that alternates
    factories = entry.build(entry.options(), 8)
    n_layers = len(factories) if isinstance(factories, list) else 1
    for dataset, extra in [("digits", []), _TOKEN_TASKS[i % len(_TOKEN_TASKS)]]:
        result = runner.run(registry.parse(
            _one_step(layer, dataset, ["--n-layers", str(n_layers)] + extra)), log=None)
        assert np.isfinite(result["test_loss"]), (layer, dataset)


def test_the_state_matrix_initialisation_is_an_option():
    # the digits run of test_every_layer_trains_on_both_kinds_of_data[s4], and
    # the same with the other initialisation (other values, the same programs)
    hippo = runner.run(registry.parse(_one_step("s4", "digits")), log=None)["model"]
    rand = runner.run(registry.parse(_one_step("s4", "digits", ["--init", "random"])),
                      log=None)["model"]
    a, b = hippo.layers[0].seq, rand.layers[0].seq
    assert not np.allclose(np.asarray(a.Lambda_im[...]), np.asarray(b.Lambda_im[...]))
    with pytest.raises(ValueError, match="--layer s4: argument --init: invalid choice: 'inv'"):
        runner.run(_args(["--steps", "1", "--layer", "s4", "--init", "inv"]), log=None)
    with pytest.raises(ValueError, match="--layer ssm: argument --init: invalid choice: 'random'"):
        runner.run(_args(["--steps", "1", "--layer", "ssm", "--init", "random"]), log=None)
    with pytest.raises(ValueError, match="--init is not an option of --layer h3; it is an "
                                         "option of --layer ssm, s4, s4d"):
        runner.run(_args(["--steps", "1", "--layer", "h3", "--init", "hippo"]), log=None)


def test_independent_state_matrices_are_an_option():
    # built as a run builds it (its training is test_layers' "s4-independent")
    args = _args(["--steps", "1", "--layer", "s4", "--independent"])
    own = registry.build_model(args, registry.load_dataset(args))
    layer = own.layers[0].seq
    assert not layer.shared and layer.Lambda_im[...].shape == (layer.H, layer.N // 2)
    with pytest.raises(ValueError, match="--independent is not an option of --layer s4d; "
                                         "it is an option of --layer s4 "):
        runner.run(_args(["--steps", "1", "--layer", "s4d", "--independent"]), log=None)


@pytest.mark.parametrize("dataset,layer", [("selective-copying", "s4d"), ("mqar", "mamba2")])
def test_a_task_of_several_answers_is_scored_on_its_answer_span(dataset, layer):
    """Selective copying (one answer after each marker) and MQAR (one after
    each query): the label holds K answers, predicted after x's last K tokens."""
    config = registry.parse(["--dataset", dataset, "--layer", layer, "--n-layers", "1",
                             "--d-model", "8"])
    entry = registry.DATASETS[dataset]
    seq_len, vocab = entry.seq_len, entry.vocab_size
    assert (config.seq_len, config.vocab_size) == (seq_len, vocab)
    data = registry.load_dataset(config)
    K = data.answer_len
    assert data.task == "recall" and data.length == seq_len + 1
    assert data.x_train.shape == (5000, seq_len) and data.y_train.shape == (5000, K)
    assert data.y_test.shape == (512, K)
    model = nnx.eval_shape(lambda: registry.build_model(config, data))
    # one prediction per answer: (batch, K, vocab), the label's shape plus the classes
    assert nnx.eval_shape(lambda m, x: m(x), model, data.x_test[:3]).shape == (3, K, vocab)
    if dataset == "selective-copying":
        assert entry.help.startswith(f"copy {K} data tokens")
    else:   # the last K tokens of x are the queries: the keys of the pairs, reordered
        assert K == seq_len // 3
        assert (np.sort(data.x_test[:, -K:], 1) == np.sort(data.x_test[:, :2 * K:2], 1)).all()


def test_the_keys_shift_is_an_option_of_h3_and_the_hybrid():
    for layer in ("h3", "hybrid"):
        args = _args(["--steps", "1", "--layer", layer, "--shift-size", "1"])
        model = registry.build_model(args, registry.load_dataset(args))
        assert model.layers[0].seq.shift.C[...].shape[1] == 1      # the current key only
    default = _args(["--steps", "1", "--layer", "h3"])
    assert registry.build_model(default, registry.load_dataset(default)) \
        .layers[0].seq.shift.C[...].shape[1] == 4
    with pytest.raises(ValueError, match="--shift-size is not an option of --layer s4d"):
        _args(["--steps", "1", "--layer", "s4d", "--shift-size", "1"])
    with pytest.raises(ValueError, match="--shift-size must be a positive int, got 0"):
        _args(["--steps", "1", "--layer", "h3", "--shift-size", "0"])
