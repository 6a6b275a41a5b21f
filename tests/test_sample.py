"""Tests for annotated_s4.sample: RNN-mode generation of a next-step model.

Checks that two computations agree in float32 run at float32 matmul precision
(`@jax.default_matmul_precision("float32")`): at JAX's default, a GPU multiplies
float32 matrices in TF32 (see annotated_s4.precision and tests/test_precision.py).
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from annotated_s4 import S4DLayer, S4Layer, SSMLayer, StackedModel
from annotated_s4.sample import generate, generate_cnn, rnn_log_probs

V, L = 5, 12


@pytest.fixture(scope="module")
def model():
    layer = functools.partial(SSMLayer, N=4, L=L)
    return StackedModel(layer, V, 8, 2, rngs=nnx.Rngs(0), vocab_size=V,
                        classification=False)


@jax.default_matmul_precision("float32")
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
    # Conditioned: the two prefixes lead to different next-token distributions ...
    logp = rnn_log_probs(model, out)
    assert float(jnp.abs(jnp.exp(logp[0, 3]) - jnp.exp(logp[1, 3])).max()) > 1e-3
    # ... and a greedy completion follows the distributions given the prefix.
    greedy = generate(model, L, key=jax.random.key(2), prefix=prefix, temperature=1e-4)
    np.testing.assert_array_equal(greedy[:, :3], prefix)
    np.testing.assert_array_equal(greedy[:, 3:], rnn_log_probs(model, greedy)[:, 3:].argmax(-1))
    # the same key, a different prefix: the first sampled token's distribution moves
    other = jnp.array([[4, 0, 0], [1, 2, 3]], dtype=jnp.int32)
    logp_other = rnn_log_probs(model, generate(model, L, key=jax.random.key(2), prefix=other))
    np.testing.assert_allclose(logp_other[1, 3], logp[0, 3], atol=1e-5)


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
    with pytest.raises(ValueError, match="prefix must hold tokens"):
        generate(model, 4, key=jax.random.key(0), prefix=jnp.full((1, 2), V, jnp.int32))
    with pytest.raises(ValueError, match="x must hold tokens"):
        rnn_log_probs(model, jnp.full((1, 3), -1, jnp.int32))
    with pytest.raises(ValueError, match="batch_size"):
        generate_cnn(model, 3, key=jax.random.key(0), batch_size=0)
    with pytest.raises(ValueError, match="batch_size"):
        generate_cnn(model, 3, key=jax.random.key(0), batch_size=None)
    classifier = StackedModel(functools.partial(SSMLayer, N=2, L=L), 3, 4, 1,
                              rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="next-step"):
        generate(classifier, 3, key=jax.random.key(0), batch_size=1)


@pytest.mark.parametrize("layer", [functools.partial(S4Layer, N=4, L=L),
                                   functools.partial(S4DLayer, N=4, L=L)],
                         ids=["s4", "s4d"])
@jax.default_matmul_precision("float32")
def test_generate_with_s4_and_s4d(layer):
    model = StackedModel(layer, V, 8, 2, rngs=nnx.Rngs(0), vocab_size=V, classification=False)
    x = jax.random.randint(jax.random.key(1), (2, L), 0, V)
    model.eval()
    np.testing.assert_allclose(rnn_log_probs(model, x), model(x), atol=1e-4)
    a = generate(model, L, key=jax.random.key(4), batch_size=3)
    b = generate_cnn(model, L, key=jax.random.key(4), batch_size=3)
    assert a.shape == (3, L) and int(a.min()) >= 0 and int(a.max()) < V
    np.testing.assert_array_equal(a, b)
    # the layers are built for L steps (S4's C~ defines a length-L kernel)
    for fn in (generate, generate_cnn):
        with pytest.raises(ValueError, match="exceeds the model's layer length limit"):
            fn(model, L + 1, key=jax.random.key(0), batch_size=1)
    with pytest.raises(ValueError, match="exceeds"):
        rnn_log_probs(model, jnp.zeros((1, L + 1), jnp.int32))


def test_generate_with_s4d_of_any_length():
    # an S4DLayer built without L accepts sequences of any length
    model = StackedModel(functools.partial(S4DLayer, N=4), V, 8, 1, rngs=nnx.Rngs(0),
                         vocab_size=V, classification=False)
    a = generate(model, 2 * L, key=jax.random.key(4), batch_size=2)
    b = generate_cnn(model, 2 * L, key=jax.random.key(4), batch_size=2)
    np.testing.assert_array_equal(a, b)
