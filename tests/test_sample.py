"""Tests for annotated_s4.sample: RNN-mode generation of a next-step model."""

import functools

import annotated_s4  # noqa: F401  (sets the XLA flag before any computation)
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from annotated_s4.layers import SSMLayer, StackedModel
from annotated_s4.sample import generate, generate_cnn, rnn_log_probs

V, L = 5, 12


@pytest.fixture(scope="module")
def model():
    layer = functools.partial(SSMLayer, N=4, L=L)
    return StackedModel(layer, V, 8, 2, rngs=nnx.Rngs(0), vocab_size=V,
                        classification=False)


def test_rnn_log_probs_equal_cnn_log_probs(model):
    x = jax.random.randint(jax.random.key(1), (3, L), 0, V)
    model.eval()
    cnn = model(x)
    rnn = rnn_log_probs(model, x)
    assert rnn.shape == cnn.shape == (3, L, V)
    np.testing.assert_allclose(rnn, cnn, atol=1e-4)


def test_generate_shapes_range_and_determinism(model):
    a = generate(model, L, key=jax.random.key(0), batch_size=4)
    b = generate(model, L, key=jax.random.key(0), batch_size=4)
    c = generate(model, L, key=jax.random.key(1), batch_size=4)
    assert a.shape == (4, L) and a.dtype == jnp.int32
    assert int(a.min()) >= 0 and int(a.max()) < V
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)


def test_prefix_is_kept_and_completion_is_conditioned(model):
    prefix = jnp.array([[1, 2, 3], [4, 0, 0]], dtype=jnp.int32)
    out = generate(model, L, key=jax.random.key(2), prefix=prefix)
    assert out.shape == (2, L)
    np.testing.assert_array_equal(out[:, :3], prefix)


def test_low_temperature_is_greedy(model):
    out = generate(model, L, key=jax.random.key(3), batch_size=2, temperature=1e-4)
    logp = rnn_log_probs(model, out)  # the distribution each token was drawn from
    np.testing.assert_array_equal(out, logp.argmax(-1))


def test_cnn_recompute_draws_the_same_samples(model):
    """Same key, same model: both decoders sample from the same distributions."""
    a = generate(model, L, key=jax.random.key(4), batch_size=3)
    b = generate_cnn(model, L, key=jax.random.key(4), batch_size=3)
    np.testing.assert_array_equal(a, b)


def test_bad_arguments(model):
    with pytest.raises(ValueError, match="length"):
        generate(model, 0, key=jax.random.key(0), batch_size=1)
    with pytest.raises(ValueError, match="batch_size"):
        generate(model, 3, key=jax.random.key(0))
    with pytest.raises(ValueError, match="temperature"):
        generate(model, 3, key=jax.random.key(0), batch_size=1, temperature=0.0)
    with pytest.raises(ValueError, match="prefix length"):
        generate(model, 2, key=jax.random.key(0), prefix=jnp.zeros((1, 3), jnp.int32))
    with pytest.raises(TypeError, match="prefix"):
        generate(model, 3, key=jax.random.key(0), prefix=jnp.zeros((1, 2)))
    classifier = StackedModel(functools.partial(SSMLayer, N=2, L=L), 3, 4, 1,
                              rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="next-step"):
        generate(classifier, 3, key=jax.random.key(0), batch_size=1)
