import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from annotated_s4.gru import GRULayer

H, L, BATCH = 3, 16, 2


def test_gru_state_is_a_grus():
    # CNN mode == RNN mode, causality, max_len: the contract test in test_layers
    layer = GRULayer(H, L, rngs=nnx.Rngs(0))
    u = jax.random.normal(jax.random.PRNGKey(1), (BATCH, L, H))
    y = layer(u)
    # h_1 = (1 - z) n from h_0 = 0
    xr, xz, xn = jnp.split(layer.cell.dense_i(u[:, 0]), 3, axis=-1)
    hr, hz, hn = jnp.split(layer.cell.dense_h(jnp.zeros((BATCH, H))), 3, axis=-1)
    r, z = jax.nn.sigmoid(xr + hr), jax.nn.sigmoid(xz + hz)
    np.testing.assert_allclose(y[:, 0], (1 - z) * jnp.tanh(xn + r * hn), atol=1e-6)


def test_gru_rejects_bad_input_and_trains():
    layer = GRULayer(H, L, rngs=nnx.Rngs(0))
    with pytest.raises(TypeError, match="H"):
        GRULayer(2.0, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="cache|init_cache"):
        layer.step(jnp.zeros((1, H)))
    u = jax.random.normal(jax.random.PRNGKey(3), (BATCH, L, H))
    grads = nnx.grad(lambda m: jnp.sum(m(u) ** 2))(layer)
    leaves = jax.tree_util.tree_leaves(grads)
    assert leaves and all(float(jnp.abs(g).sum()) > 0 for g in leaves)
