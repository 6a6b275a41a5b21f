import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import annotated_s4  # noqa: F401  (sets the XLA flag first)
from annotated_s4.layers import S4DLayer, S4Layer, StackedModel

H, N, L, BATCH = 3, 8, 32, 2

LAYERS = [
    ("s4", functools.partial(S4Layer, N=N, L=L)),
    ("s4d-lin", functools.partial(S4DLayer, N=N, L=L, init="lin")),
    ("s4d-inv", functools.partial(S4DLayer, N=N, L=L, init="inv")),
]


def _rnn(layer, u):
    layer.init_cache(u.shape[0])
    step = nnx.jit(lambda layer, u_t: layer.step(u_t))
    return jnp.stack([step(layer, u[:, k]) for k in range(u.shape[1])], axis=1)


@pytest.mark.parametrize("name,make", LAYERS)
def test_cnn_equals_rnn(name, make):
    layer = make(H, rngs=nnx.Rngs(0))
    u = jax.random.normal(jax.random.PRNGKey(1), (BATCH, L, H))
    y_cnn = layer(u)
    y_rnn = _rnn(layer, u)
    assert y_cnn.shape == (BATCH, L, H)
    scale = float(jnp.abs(y_cnn).max())
    assert float(jnp.abs(y_cnn - y_rnn).max()) < 1e-4 * scale, name


@pytest.mark.parametrize("name,make", LAYERS)
def test_shorter_input_is_causal_prefix(name, make):
    layer = make(H, rngs=nnx.Rngs(0))
    u = jax.random.normal(jax.random.PRNGKey(2), (BATCH, L, H))
    assert np.allclose(layer(u[:, :10]), layer(u)[:, :10], atol=1e-5)
    with pytest.raises(ValueError, match="L"):
        layer(jnp.zeros((1, L + 1, H)))
    with pytest.raises(ValueError, match="u"):
        layer(jnp.zeros((1, L, H + 1)))


@pytest.mark.parametrize("name,make", LAYERS)
def test_params_get_gradients(name, make):
    layer = make(H, rngs=nnx.Rngs(0))
    u = jax.random.normal(jax.random.PRNGKey(3), (BATCH, L, H))
    grads = nnx.grad(lambda m: jnp.sum(m(u) ** 2))(layer)
    leaves = jax.tree_util.tree_leaves(grads)
    assert leaves and all(bool(jnp.all(jnp.isfinite(g))) for g in leaves)
    assert float(jnp.abs(grads.log_step[...]).sum()) > 0
    assert float(jnp.abs(grads.C[...]).sum()) > 0


def test_s4_is_hippo_initialised_and_stable():
    layer = S4Layer(H, N, L, rngs=nnx.Rngs(0))
    Lambda, P, B, C, step = layer.ssm_params()
    assert np.allclose(Lambda.real, -0.5, atol=1e-6)
    assert C.shape == (H, N) and step.shape == (H,)


def test_s4d_errors():
    with pytest.raises(ValueError, match="init"):
        S4DLayer(H, N, L, rngs=nnx.Rngs(0), init="legs")
    layer = S4DLayer(H, N, L, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="init_cache"):
        layer.step(jnp.zeros((1, H)))


def test_generation_model_rnn_matches_cnn():
    model = StackedModel(functools.partial(S4Layer, N=N, L=16), d_output=5, d_model=4,
                         n_layers=2, rngs=nnx.Rngs(0), vocab_size=5, classification=False)
    x = jax.random.randint(jax.random.PRNGKey(4), (2, 16), 0, 5)
    logp = model(x)
    model.init_cache(2)
    prev = jnp.full((2,), model.start_token)
    outs = []
    for k in range(16):
        outs.append(model.step(prev))
        prev = x[:, k]
    assert np.allclose(jnp.stack(outs, 1), logp, atol=1e-4)
