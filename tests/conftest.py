"""Shared test set-up: import the package before any test computes, so that
its XLA flag (see annotated_s4/__init__.py) is set when the CPU backend starts."""

import annotated_s4  # noqa: F401
import pytest
from annotated_s4.runner import EVAL_CACHE

# The options of a tiny training run (a one-block SSM on the 8x8 digits), which
# the tests of the experiment side extend (`from conftest import TINY`).
TINY = ["--dataset", "digits", "--layer", "ssm", "--n-layers", "1", "--d-model", "8",
        "--state-size", "4", "--batch-size", "16", "--lr", "1e-2", "--log-every", "100"]


@pytest.fixture(autouse=True)
def _evaluations_measured_afresh(monkeypatch):
    """The unit tests re-evaluate runs themselves: the results that `make test`
    keeps for its chapters (runner.EVAL_CACHE) are not used here."""
    monkeypatch.delenv(EVAL_CACHE, raising=False)
