"""Shared test set-up: import the package before any test computes, so that
its XLA flag (see annotated_s4/__init__.py) is set when the CPU backend starts."""

import dataclasses

import annotated_s4  # noqa: F401
import pytest
from annotated_s4 import registry
from annotated_s4.catalog import flag, option_type
from annotated_s4.runner import EVAL_CACHE

# The options of a tiny training run (a one-block SSM on the 8x8 digits), which
# the tests of the experiment side extend (`from conftest import TINY`).
TINY = ["--dataset", "digits", "--layer", "ssm", "--n-layers", "1", "--d-model", "8",
        "--state-size", "4", "--batch-size", "16", "--lr", "1e-2", "--log-every", "100"]


def tiny_options(layer):
    """Command-line options that make `layer` small: each of its int options
    at most 4 (a state size, a head dimension, a number of heads); an int
    option whose default is None (chosen by the layer) keeps it."""
    options = registry.LAYERS[layer].options
    return [arg for f in dataclasses.fields(options)
            if option_type(options, f.name) is int and f.default is not None and f.default > 4
            for arg in (flag(f.name), "4")]


def one_step(layer, dataset, extra=()):
    """The options of one training step of `layer` (at `tiny_options`) on
    `dataset`: the runs of test_registry's
    test_every_layer_trains_on_both_kinds_of_data, which other tests repeat
    where a run of theirs can be one of these (the same options, the same
    programs: compiled once). On digits, a layer of a state size (ssm, s4) is
    then the TINY run (its programs are compiled once for all the tests that
    run TINY for at most two steps)."""
    return (["--dataset", dataset, "--layer", layer, "--n-layers", "1", "--d-model", "8",
             "--batch-size", "16", "--lr", "1e-2", "--steps", "1"]
            + tiny_options(layer) + list(extra))


@pytest.fixture(autouse=True)
def _evaluations_measured_afresh(monkeypatch):
    """The unit tests re-evaluate runs themselves: the results that `make test`
    keeps for its chapters (runner.EVAL_CACHE) are not used here."""
    monkeypatch.delenv(EVAL_CACHE, raising=False)
