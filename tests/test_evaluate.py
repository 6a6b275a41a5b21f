"""Tests for annotated_s4.evaluate: re-evaluating a run, and the digit-completion metric."""

import functools
import json

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from annotated_s4 import cli
from annotated_s4 import SSMLayer, StackedModel

TINY = ["--dataset", "digits", "--layer", "ssm", "--n-layers", "1", "--d-model", "8",
        "--state-size", "4", "--batch-size", "16", "--lr", "1e-2", "--log-every", "100"]


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

    class Constant(nnx.Module):  # a "classifier" that answers 3 to pixels in [0, 1]
        def __call__(self, x):  # (traced: completion_accuracy compiles it)
            assert x.shape == (6, 784, 1)
            in_range = (x.min() >= 0.0) & (x.max() <= 1.0)
            return jnp.zeros((len(x), 11)).at[:, jnp.where(in_range, 3, 10)].set(1.0)

    accuracy, _ = ev.completion_accuracy(gen, Constant(), digits, labels)
    assert accuracy == pytest.approx(np.mean(labels == 3))
