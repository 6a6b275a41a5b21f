import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from annotated_s4.gru import GRULayer

H, L, BATCH = 3, 16, 2


def test_gru_cnn_mode_is_the_rnn_run_over_the_sequence():
    layer = GRULayer(H, L, rngs=nnx.Rngs(0))
    u = jax.random.normal(jax.random.PRNGKey(1), (BATCH, L, H))
    y = layer(u)
    layer.init_cache(BATCH)
    y_rnn = jnp.stack([layer.step(u[:, t]) for t in range(L)], axis=1)
    assert y.shape == (BATCH, L, H)
    np.testing.assert_allclose(y, y_rnn, atol=1e-6)
    # causal: a prefix of the input gives a prefix of the output
    np.testing.assert_allclose(layer(u[:, :5]), y[:, :5], atol=1e-6)
    # the state is a GRU's: h_1 = (1 - z) n from h_0 = 0
    xr, xz, xn = jnp.split(layer.cell.dense_i(u[:, 0]), 3, axis=-1)
    hr, hz, hn = jnp.split(layer.cell.dense_h(jnp.zeros((BATCH, H))), 3, axis=-1)
    r, z = jax.nn.sigmoid(xr + hr), jax.nn.sigmoid(xz + hz)
    np.testing.assert_allclose(y[:, 0], (1 - z) * jnp.tanh(xn + r * hn), atol=1e-6)


def test_gru_rejects_bad_input_and_trains():
    layer = GRULayer(H, L, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="u"):
        layer(jnp.zeros((1, L + 1, H)))
    with pytest.raises(ValueError, match="u"):
        layer(jnp.zeros((1, L, H + 1)))
    with pytest.raises(TypeError, match="H"):
        GRULayer(2.0, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="cache|init_cache"):
        layer.step(jnp.zeros((1, H)))
    u = jax.random.normal(jax.random.PRNGKey(3), (BATCH, L, H))
    grads = nnx.grad(lambda m: jnp.sum(m(u) ** 2))(layer)
    leaves = jax.tree_util.tree_leaves(grads)
    assert leaves and all(float(jnp.abs(g).sum()) > 0 for g in leaves)
