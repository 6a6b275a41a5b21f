"""The committed reference runs: each is re-evaluated from its checkpoint and
must reproduce its recorded metrics; one is replayed from its config."""

import json
import os

import numpy as np
import pytest

from annotated_s4 import reference


def test_the_runs_are_committed_with_their_files():
    names = reference.available()
    assert "digits64-s4" in names
    for name in names:
        with open(os.path.join(reference.run_dir(name), "config.json")) as f:
            config = json.load(f)
        assert config["dataset"] == reference.RUNS[name][1], name
        with np.load(os.path.join(reference.run_dir(name), "checkpoint.npz"),
                     allow_pickle=False) as ckpt:
            assert "paths" in ckpt.files


@pytest.mark.parametrize("name", reference.available())
def test_reference_run_reproduces_its_metrics(name):
    failed = reference.check([name], log=lambda *_: None)
    assert not failed, (f"{name}: the code no longer reproduces {failed}; if the change "
                        f"is intended, run `make reference RUN={name}`")


def test_a_reference_run_is_replayed_from_its_config():
    """The first 20 steps retrained from config.json give the losses that
    history.json recorded: the checkpoint comes from this code."""
    replayed, recorded = reference.replay("digits64-s4", n_steps=20)
    assert len(replayed) == len(recorded) == 20
    np.testing.assert_allclose(replayed, recorded, rtol=1e-5, atol=1e-5)


def test_unknown_run_names_are_refused():
    with pytest.raises(ValueError, match="no reference run named"):
        reference.check(["no-such-run"])
