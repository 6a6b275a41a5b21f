"""The datasets and layers that a run names, and the model a configuration builds.

Two tables name what a run can build:

* `DATASETS` (`annotated_s4.datasets`): name -> `DatasetEntry`, each
  dataset's loader, its help and its default sizes; a loader returns a
  `Dataset`, the arrays and the task (classify, generate or recall).
* `LAYERS`: name -> `catalog.LayerEntry`, the layers that registered
  themselves in their own modules (`annotated_s4.catalog.register_layer`):
  each with its options class and ``build(options, L)``, which returns a layer
  factory ``factory(H, rngs=...)`` (the layer contract of
  `annotated_s4.models`), or a list of factories used in turn.

Declare a dataset, or register a layer, to extend the command line. `parse`
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
from .catalog import LAYERS
from .checkpoint import CHECKPOINT_DTYPES
from .config import add_arguments, add_layer_arguments, from_namespace
from .datasets import DATASETS, load_dataset
from .models import LastTokenModel, StackedModel
from .train import SCHEDULES, make_optimizer

__all__ = ["DATASETS", "LAYERS", "parser",
           "layer_parser", "parse", "parse_layer_options", "resolve", "load_dataset",
           "build_model", "build_optimizer", "count_params", "test_metrics"]


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
                          "checkpoint_dtype": CHECKPOINT_DTYPES, "schedule": SCHEDULES})


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


def epilog(width=88):
    """The help's last part: the datasets, then each layer's options."""
    datasets = textwrap.fill("datasets: " + "; ".join(
        f"{name}: {DATASETS[name].help}{DATASETS[name].defaults()}" for name in sorted(DATASETS)),
        width)
    layers = [layer_parser(name).format_help().strip()  # empty for a layer without options
              or f"--layer {name}: {LAYERS[name].help} (no options)" for name in LAYERS]
    return "\n\n".join([datasets, "the options of each layer (after --layer NAME):", *layers])


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
    filled in, checked (a new `RunConfig`). A size the dataset fixes itself
    (its entry has no default for it) is refused."""
    if config.dataset not in DATASETS:
        raise ValueError(f"--dataset must be one of {sorted(DATASETS)}, got {config.dataset!r}")
    entry, sizes = DATASETS[config.dataset], {}
    for name in ("seq_len", "vocab_size"):
        given, default = getattr(config, name), getattr(entry, name)
        if default is None and given is not None:
            raise ValueError(f"--{name.replace('_', '-')} does not apply to {config.dataset} "
                             f"(its data fix it: {entry.help})")
        sizes[name] = default if given is None else given
    return dataclasses.replace(config, **sizes).check()


def build_model(config, data, length=None):
    """The StackedModel described by `config` for the dataset `data`, its
    layers built for sequences of `length` positions (default: the data's)."""
    L = data.length if length is None else checks.positive_int(length, "length")
    layer = LAYERS[config.layer].build(config.layer_options, L)
    model = StackedModel(
        layer, data.d_output, config.d_model, config.n_layers,
        rngs=nnx.Rngs(config.seed), d_input=data.d_input,
        vocab_size=data.vocab_size, classification=data.classification,
        dropout=config.dropout,
    )
    if data.recall:
        return LastTokenModel(model, answer_len=data.answer_len)
    return model


def build_optimizer(config, model):
    """The optimiser `config` describes (S4's parameter groups unless ssm_lr is 0)."""
    return make_optimizer(model, lr=config.lr, weight_decay=config.weight_decay,
                          steps=config.steps, ssm_lr=config.ssm_lr or None,
                          ssm_weight_decay=config.ssm_weight_decay, warmup=config.warmup,
                          schedule=config.schedule)


def count_params(model):
    return sum(int(np.prod(x.shape)) for x in
               jax.tree_util.tree_leaves(nnx.state(model, nnx.Param)))


def test_metrics(evaluation, data):
    """An evaluation (`train.evaluate`'s loss and accuracy) on `data` as a
    run's metrics: test loss (nats per target), accuracy, and for next-step
    models bits per token (per pixel, per character: the dataset's "token")."""
    metrics = {"test_loss": evaluation["loss"], "test_accuracy": evaluation["accuracy"]}
    if data.task == "generate":
        metrics[f"test_bits_per_{data.token}"] = evaluation["loss"] / np.log(2)
    return metrics
